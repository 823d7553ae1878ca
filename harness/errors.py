"""Typed errors. Each message says what broke and what to do about it.

The `Case*` errors are raised in the parent pytest process when a case body did not finish
cleanly in its child. They carry `evidence`: the text the known-bug registry matches its
signatures against (the child's exception line, or the signal and the log tail of a crash), and,
as a class attribute, the `outcome` a CaseResult records for them.

Every error the harness raises on purpose derives from HarnessError. The tree, with the module
of each class that is defined elsewhere (a name without one is in its parent's module);
tests/test_errors.py keeps the drawing true:

    HarnessError
    ├── HarnessUsageError                 a bad option or argument (exit 2)
    │   ├── NotAPositiveNumber            also an argparse.ArgumentTypeError
    │   ├── BaselineError
    │   │   ├── CostBaselineError         harness.costbaseline
    │   │   └── BaselineUpdateRefused     harness.baselinefile; an update run wrote nothing (exit 4)
    │   ├── ObservationsTooLarge
    │   ├── BaseRunError                  harness.judges.basecompare: the run --spmd-compare names
    │   └── ProgramError                  harness.oracles.program: an oracle program that cannot run
    ├── RegistryError
    ├── DamagedRecord                     also a ValueError
    ├── CostReadError                     harness.costs; also a ValueError
    ├── HloParseError                     harness.hlo; also a ValueError
    ├── ShardingParseError                harness.sharding; also a ValueError
    ├── NotARegularFile                   harness.isolation.system.files; also an OSError: a link, pipe or folder
    ├── FileTooLarge                      harness.isolation.system.files; also an OSError
    ├── ChangedSinceCollection            a case module rewritten after collection (raised in the child)
    ├── CountersReset                     harness.costs: torch_xla's counters reset during a measured step
    ├── ChildStartError                   a child's start-up, not a case, failed
    ├── OracleRunError                    harness.oracles.runner: the oracle's own body failed in a child
    ├── CaseError                         outcome "error"
    │   ├── CaseFailed                    outcome "error": the body raised
    │   ├── CaseCrashed                   outcome "crashed"
    │   ├── CaseTimedOut                  outcome "timeout"
    │   └── CaseProtocolError             outcome "protocol"
    ├── LateFault                         harness.isolation.parent.child_process; charged to the child's last case
    ├── ProtocolError                     harness.isolation.wire.protocol: a bad message on the result pipe
    │   └── ForkWireError                 harness.isolation.wire.forkwire: a bad fork-server message
    ├── NotThisRunsClient                 harness.isolation.server.forkserver: a spawn request without the run's token
    ├── MatrixError                       harness.matrix.errors
    │   ├── NotEnoughDiskError
    │   ├── EnvBuildError
    │   ├── EnvMismatchError
    │   ├── SuiteRunError
    │   └── CommandTimedOut
    └── GkeHarnessError                   harness.gke.errors
        ├── KubeApiError
        │   ├── JobSetExistsError
        │   └── JobSetNotInstalledError
        ├── ReportError
        │   ├── ReportMissing             harness.gke.report_channel
        │   └── ReportCorrupt             harness.gke.report_channel
        └── PodStuckError

The readers case bodies use (harness.hlo, harness.sharding) raise errors that are also
ValueErrors, and the file helpers errors that are also OSErrors, so a caller that catches the
built-in class keeps working. tests/test_errors.py also checks that every public exception class
the harness defines is a HarnessError, whatever else it derives from.
"""

from __future__ import annotations

import argparse
from typing import ClassVar


class HarnessError(Exception):
    """Base class of every error the harness raises on purpose."""


class HarnessUsageError(HarnessError):
    """A bad option or argument; the message names the valid values."""


class NotAPositiveNumber(HarnessUsageError, argparse.ArgumentTypeError):
    """A command-line value that must be a positive (finite) number is not one.

    Also an ArgumentTypeError: argparse then shows this message, not "invalid <function> value".
    """


class BaselineError(HarnessUsageError):
    """A sharding baseline file is malformed or was taken on another backend or device count."""


class RegistryError(HarnessError):
    """The known-bug registry file is malformed or names an unknown entry."""


class DamagedRecord(HarnessError, ValueError):
    """A results-folder line is not a case record: cut short by a crash, or fields of the wrong type.

    Also a ValueError, as the JSON error it stands for was, for readers that catch that.
    """


class ChildStartError(HarnessError):
    """A child process could not be started or died before it was ready."""


class CaseError(HarnessError):
    """A case body did not finish cleanly in its child process."""

    outcome: ClassVar[str] = "error"  # what CaseResult.outcome says for this error

    def __init__(self, message: str, *, evidence: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.evidence = evidence
        self.log_tail = log_tail


class CaseFailed(CaseError):
    """The case body raised; the child survived and reported the exception."""

    outcome = "error"


class CaseCrashed(CaseError):
    """The child process died (a signal such as SIGABRT/SIGSEGV, or an exit) during the case."""

    outcome = "crashed"


class CaseTimedOut(CaseError):
    """The case ran past its timeout; the child's process group was terminated."""

    outcome = "timeout"


class CaseProtocolError(CaseError):
    """The child answered out of turn: a second verdict, another case's id or undecodable bytes."""

    outcome = "protocol"


class ObservationsTooLarge(HarnessUsageError):
    """A case recorded more than harness.isolation.wire.protocol.MAX_MESSAGE_BYTES of observations."""


class ChangedSinceCollection(HarnessError):
    """The case's module on disk is not what the run collected (a case before it rewrote it?)."""
