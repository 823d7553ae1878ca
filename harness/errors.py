"""Typed errors. Each message says what broke and what to do about it.

The `Case*` errors are raised in the parent pytest process when a case body did not finish
cleanly in its child. They carry `evidence`: the text the known-bug registry matches its
signatures against (the child's exception line, or the signal and the log tail of a crash).
"""

from __future__ import annotations

import argparse


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

    def __init__(self, message: str, *, evidence: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.evidence = evidence
        self.log_tail = log_tail


class CaseFailed(CaseError):
    """The case body raised; the child survived and reported the exception."""


class CaseCrashed(CaseError):
    """The child process died (a signal such as SIGABRT/SIGSEGV, or an exit) during the case."""


class CaseTimedOut(CaseError):
    """The case ran past its timeout; the child's process group was terminated."""


class CaseProtocolError(CaseError):
    """The child answered out of turn: a second verdict, another case's id or undecodable bytes."""


class ObservationsTooLarge(HarnessUsageError):
    """A case recorded more than harness.isolation.protocol.MAX_MESSAGE_BYTES of observations."""
