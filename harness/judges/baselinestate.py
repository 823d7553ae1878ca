"""A baseline check's state in one pytest process (BaselineCheck): which file, read once, what an
update run may write (Updates: a case kept only once its teardown passed) and writes at the end
(write_updates, through harness.baselinefile.rewrite: locked, merged, atomic), the rewrite command
a failure prints, and the missing-entry section collected under xdist. harness.judges.shardingcheck
and harness.judges.costcheck each make one; the files themselves are harness.baselinefile's.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic

import pytest

from harness.baselinefile import BaselineUpdateRefused, F, rewrite
from harness.config import jobsize, options
from harness.errors import HarnessError
from harness.isolation.backend import Backend


class Updates:
    """The entries an update run may write: a case is observed at its call and kept only once its
    teardown passed too (a fixture that raises in teardown makes pytest report an error)."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[str, Any, str | None]] = {}  # node id -> case, observed, version
        self.passed: dict[str, tuple[Any, str | None]] = {}  # case -> observed, torch_xla

    def observe(self, nodeid: str, case: str, observed: Any, version: str | None) -> None:
        self._waiting[nodeid] = (case, observed, version)

    def settle(self, nodeid: str, passed: bool) -> None:
        """Keep the case's entry (its teardown passed) or drop it (its call ended failed after the
        harness's own checks, or its teardown failed)."""
        waiting = self._waiting.pop(nodeid, None)
        if waiting is not None and passed:
            case, observed, version = waiting
            self.passed[case] = (observed, version)


def interrupted(session: pytest.Session) -> bool:
    """Ctrl-C, SIGTERM (harness.plugin turns it into KeyboardInterrupt) or a stop the harness asked for."""
    return int(session.exitstatus) == int(pytest.ExitCode.INTERRUPTED)


def rewrite_command(item: pytest.Item, flag: str, baseline_option: str | None, baseline_path: Path) -> str:
    """The shell command that rewrites one case's entry, every part shell-quoted: pytest with the
    config and rootdir the run was given, the case (its file's path where its node id has lost
    it: a file outside the rootdir), the update flag, the baseline file in use (when not the
    default) and the backend options given on the command line."""
    config = item.config
    argv = ["pytest"]
    if config.option.inifilename:
        argv += ["-c", str(config.option.inifilename)]
    if config.option.rootdir:
        argv.append(f"--rootdir={config.option.rootdir}")
    file_part, _, rest = item.nodeid.partition("::")
    argv.append(item.nodeid if file_part and not file_part.startswith("..") else f"{item.path}::{rest}")
    argv.append(flag)
    if baseline_option:
        argv.append(f"--{baseline_option.replace('_', '-')}={baseline_path}")
    for name in ("spmd_backend", "spmd_devices"):
        given = getattr(config.option, name, None)
        if given is not None:
            argv.append(f"--{name.replace('_', '-')}={given}")
    return shlex.join(argv)


def refuse_under_xdist(config: pytest.Config, flag: str) -> None:
    """An update writes one file from one process: refused in the xdist controller, before any
    worker starts, whichever way distribution was asked for (-n, --dist, -d with --tx)."""
    if options.xdist_distributes(config.option) or hasattr(config, "workerinput"):
        raise pytest.UsageError(f"{flag} writes one file: run it without -n or --dist (pytest-xdist)")


def write_updates(
    session: pytest.Session,
    updates: Updates,
    path: Path,
    kind: str,
    flag: str,
    load: Callable[[], F | None],
    empty: Callable[[], F],
    before: Mapping[str, Any] | None = None,
) -> tuple[dict[str, list[Any]] | None, str | None]:
    """At the end of an update run: what changed per case, or why nothing was written (the run
    was interrupted; rewrite() refused, which makes the run a usage error, exit 4)."""
    if interrupted(session):
        return None, (
            f"{kind} baseline {path} is not written: the run was interrupted, and a run cut short "
            f"holds only part of what it was asked to take ({len(updates.passed)} case(s) had passed); run {flag} again"
        )
    if not updates.passed:
        return None, None
    try:
        return rewrite(path, kind, flag, load, empty, updates.passed, before), None
    except BaselineUpdateRefused as exc:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return None, str(exc)


WITHOUT_ENTRY = "spmd_without_baseline_entry"  # a report's user property: "<kind> <case id>"


class BaselineCheck(Generic[F]):
    """One baseline check's state in one pytest process: which file, read once, and what an
    update run may write. harness.judges.shardingcheck and harness.judges.costcheck each make one."""

    def __init__(
        self, config: pytest.Config, backend: Backend, file: type[F], option: str | None, update: bool
    ) -> None:
        """`option`: the value of file.OPTION (None: the default file); `update`: an update run."""
        self.file = file
        self._option = option
        self._rootpath = config.rootpath
        self._backend = backend  # a TPU's device count takes a probe: asked only when needed
        self.update = update
        if self.update:
            refuse_under_xdist(config, file.FLAG)
        self._baseline: F | None = None
        self._loaded = False
        self.updates = Updates()  # an update run: the cases it may write
        self.updated: dict[str, list[Any]] | None = None  # what an update run changed, per case
        self.not_written: str | None = None  # why an update run wrote nothing
        self.cases_without_entry: list[str] = []

    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def devices(self) -> int:
        return self._backend.capabilities().devices

    @property
    def path(self) -> Path:
        """The option's file, else the backend's file under the repository (pytest's rootdir)."""
        if self._option:
            return Path(self._option).resolve()
        return self.file.default_path(self._rootpath, self.backend, self.devices)

    def baseline(self) -> F | None:
        """The file, read the first time it is asked for; a damaged one is a usage error. In an
        update run, what was read is never updated in memory: rewrite() re-reads the file."""
        if not self._loaded:
            self._loaded = True
            try:
                self._baseline = self.file.load(self.path, self.backend, self.devices)
            except HarnessError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._baseline

    def read_unless_probed(self) -> None:
        """Read the file now, unless its name waits on a TPU's device count (a probe of the chips):
        that one is read when the first case needs it, still before its verdict."""
        if self._backend.name != "tpu" or self._option or self.update:
            self.baseline()  # an update run reads it before any case: rewrite() holds it to what it read

    def note_without_entry(self, report: pytest.TestReport, case_id: str) -> None:
        """A case the baseline has no entry for: said on its report, which travels from an xdist
        worker to the controller, where collect() lists it (the worker's own list is never printed)."""
        report.user_properties.append((WITHOUT_ENTRY, f"{self.file.KIND} {case_id}"))

    def collect(self, report: pytest.TestReport) -> None:
        """The owning process: the cases without an entry, from every case's report."""
        prefix = f"{self.file.KIND} "
        for name, value in report.user_properties:
            case = str(value)[len(prefix) :]
            if name == WITHOUT_ENTRY and str(value).startswith(prefix) and case not in self.cases_without_entry:
                self.cases_without_entry.append(case)

    def rewrite_command(self, item: pytest.Item, path: Path) -> str:
        return rewrite_command(item, self.file.FLAG, self.file.OPTION if self._option else None, path)

    def finish(self, pytest_session: pytest.Session) -> None:
        """At the end of an update run: write the file (write_updates)."""
        if not self.update:
            return
        self.updated, self.not_written = write_updates(
            pytest_session,
            self.updates,
            self.path,
            self.file.KIND,
            self.file.FLAG,
            lambda: self.file.load(self.path, self.backend, self.devices),
            lambda: self.file.empty(self.path, self.backend, self.devices),
            dict(self._baseline.cases) if self._baseline is not None else ({} if self._loaded else None),
        )

    def summarise(self, terminalreporter: Any) -> None:
        """The end-of-run section: what a rewrite changed, why an update wrote nothing, or the cases
        that had no entry to be compared with."""
        kind, path = self.file.KIND, self.path
        if self.not_written is not None:
            terminalreporter.section(f"{kind} baseline not written", red=True)
            terminalreporter.line(self.not_written, red=True)
        elif self.updated is not None:
            terminalreporter.section(f"{kind} baseline {path} rewritten for {len(self.updated)} case(s)")
            for case, changes in self.updated.items():
                if changes:
                    terminalreporter.line(f"{case}:")
                    for change in changes:
                        terminalreporter.line(f"  {change}")
            if not any(self.updated.values()):
                terminalreporter.line(f"no {kind} changed")
        elif self.cases_without_entry:
            terminalreporter.section(f"cases without a {kind} baseline entry (not compared)")
            sized = [case for case in self.cases_without_entry if jobsize.size_in_id(case)]
            for case in self.cases_without_entry:
                if case not in sized:
                    terminalreporter.line(case)
            if len(sized) < len(self.cases_without_entry):
                terminalreporter.line(f"add them with {self.file.FLAG} ({path})")
            for case in sized:
                terminalreporter.line(case)
            if sized:
                terminalreporter.line(
                    f"the training job at another size than {jobsize.DEFAULT} has no entry by design (the baselines "
                    "hold the tiny job): compare it with --spmd-compare against a base run of the same --spmd-job-size"
                )
