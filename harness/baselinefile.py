"""What an update run of either baseline (harness.baseline: shardings, harness.costbaseline: costs)
may write, how it writes it, and the command a drift hint prints to rewrite one entry.

What: only a case pytest reported passed in set-up, call and teardown (Updates), and nothing at
all when the run was interrupted (Ctrl-C, SIGTERM, a stop the harness asked for): a run cut short
wrote half of what its author meant to review.

How: two update runs at once on one file (two worktrees, two terminals) must not lose either's
entries. rewrite() takes an exclusive lock on `<file>.lock` beside the file, re-reads the file as
it is on disk then, applies only this run's entries and replaces the file atomically (a temporary
file in the same folder, then os.replace): the second writer merges with the first, and a reader
never sees half a file.

Release lines: a file holds one torch_xla version, whose release line decides whether a change of
any entry fails. An update on another line would move every other entry onto it (their drift then
only reported), so it is refused unless the run rewrites every entry the file holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from harness.errors import BaselineError

LOCK_TIMEOUT_S = 60.0  # a concurrent writer holds the lock for a read and a write: far less than this


class BaselineUpdateRefused(BaselineError):
    """An update run cannot write its baseline: the lock is held or unusable, the file on disk
    cannot be merged with, or the update would mix release lines. Nothing was written."""


class BaselineFile(Protocol):
    """What Baseline and CostBaseline both offer to rewrite()."""

    @property
    def torch_xla(self) -> str | None: ...

    @property
    def cases(self) -> Mapping[str, Any]: ...

    def update(self, case: str, observed: Any, torch_xla: str | None) -> list[Any]: ...

    def render(self) -> str: ...


B = TypeVar("B", bound=BaselineFile)


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


def rewrite(
    path: Path,
    kind: str,
    flag: str,
    load: Callable[[], B | None],
    empty: Callable[[], B],
    entries: Mapping[str, tuple[Any, str | None]],
) -> dict[str, list[Any]]:
    """Apply this run's entries to the file as it is on disk now, under its lock; what changed per
    case. BaselineUpdateRefused (nothing written) where that cannot be done safely."""
    where = f"{kind} baseline {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path, where):
        try:
            base = load() or empty()
        except BaselineError as exc:
            raise BaselineUpdateRefused(
                f"{where} is not written: the file on disk cannot be merged with: {exc}"
            ) from None
        _refuse_mixed_release_lines(base, entries, where, flag)
        changes = {case: base.update(case, observed, version) for case, (observed, version) in sorted(entries.items())}
        _replace(path, base.render())
    return changes


def _refuse_mixed_release_lines(
    base: BaselineFile, entries: Mapping[str, tuple[Any, str | None]], where: str, flag: str
) -> None:
    from harness.baseline import on_release_line  # one rule for both baselines; no import cycle

    versions = sorted({version for _, version in entries.values() if version is not None})
    lines = {_line(v) for v in versions}
    if len(lines) > 1:
        raise BaselineUpdateRefused(
            f"{where} is not written: this run's cases ran on torch_xla {', '.join(versions)}, more than one "
            "release line, and a baseline holds one. Update on one torch_xla"
        )
    if not versions or base.torch_xla is None or on_release_line(versions[0], base.torch_xla):
        return
    others = sorted(set(base.cases) - set(entries))
    if not others:
        return  # every entry re-taken: the whole file moves to the new line
    raise BaselineUpdateRefused(
        f"{where} is not written: it was taken on torch_xla {base.torch_xla} and this run is on {versions[0]}, "
        f"another release line; rewriting {len(entries)} of its entries would move the other {len(others)} "
        f"(e.g. {others[0]}) onto {versions[0]}'s line, where their drift would only be reported. Update on "
        f"torch_xla {base.torch_xla}'s line, or re-take the whole file on {versions[0]}: delete it and run "
        f"every case with {flag}"
    )


def _line(version: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        return ".".join(map(str, Version(version).release[:2]))
    except InvalidVersion:
        return version


@contextlib.contextmanager
def _locked(path: Path, where: str) -> Iterator[None]:
    """An exclusive flock on `<file>.lock` beside the file, held while the file is read and replaced.
    Never follows a link planted there; waits LOCK_TIMEOUT_S at most."""
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise BaselineUpdateRefused(
            f"{where} is not written: its lock file {lock} cannot be opened ({exc.strerror or exc}"
            f"{'; it is a link' if exc.errno == errno.ELOOP else ''}); remove it and run the update again"
        ) from None
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BaselineUpdateRefused(
                        f"{where} is not written: another process has held its lock {lock} for "
                        f"{LOCK_TIMEOUT_S:.0f} s (another update run?); run the update again when it has finished"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _replace(path: Path, text: str) -> None:
    """Write `text` to a new file beside `path`, then rename it over `path` (atomic on POSIX)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


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
    distributed = (
        bool(getattr(config.option, "numprocesses", None))
        or getattr(config.option, "dist", "no") not in (None, "no")
        or hasattr(config, "workerinput")
    )
    if distributed:
        raise pytest.UsageError(f"{flag} writes one file: run it without -n or --dist (pytest-xdist)")


def write_updates(
    session: pytest.Session,
    updates: Updates,
    path: Path,
    kind: str,
    flag: str,
    load: Callable[[], B | None],
    empty: Callable[[], B],
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
        return rewrite(path, kind, flag, load, empty, updates.passed), None
    except BaselineUpdateRefused as exc:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return None, str(exc)
