"""What the two baseline files share, with no pytest in it: the file (BaselineFile;
harness.judges.baseline holds shardings, harness.costbaseline costs), its checked header, and how an
update writes it (rewrite). What an update run may write and when (a case passed in set-up, call
and teardown; nothing when the run was interrupted) is the check's, in one pytest process:
harness.judges.baselinestate.

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
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from packaging.version import InvalidVersion, Version

from harness.errors import BaselineError, HarnessError
from harness.isolation.system import files
from harness.schema import load_json, shown, unknown_keys

LOCK_ATTEMPTS = 5  # a lock file that keeps vanishing under the update: refused after this many tries
LOCK_TIMEOUT_S = 60.0  # a concurrent writer holds the lock for a read and a write: far less than this


class BaselineUpdateRefused(BaselineError):
    """An update run cannot write its baseline: the lock is held or unusable, the file on disk
    cannot be merged with, or the update would mix release lines. Nothing was written."""


def on_release_line(version: str | None, baseline_version: str | None) -> bool:
    """Whether `version` is on the release line a baseline was taken on (same major.minor:
    nightlies and +git builds of it included)."""
    if version is None or baseline_version is None:
        return False
    try:
        return Version(version).release[:2] == Version(baseline_version).release[:2]
    except InvalidVersion:
        return False


E = TypeVar("E")
F = TypeVar("F", bound="BaselineFile[Any]")


@dataclasses.dataclass
class BaselineFile(Generic[E]):
    """What both baseline files are: one JSON file per backend and device count under DIR, an
    entry per case (results.case_id), and the torch_xla whose release line decides whether a
    change fails. A subclass says what an entry holds: how it is checked, compared and written."""

    path: Path
    backend: str
    devices: int
    torch_xla: str | None
    cases: dict[str, E]

    KIND: ClassVar[str]  # "sharding", "cost": how messages name the file
    PREDICTS: ClassVar[str]  # "shardings", "costs": what its entries predict
    DIR: ClassVar[Path]  # the default files' folder, under the repository root (pytest's rootdir)
    OPTION: ClassVar[str]  # the option that names another file
    FLAG: ClassVar[str]  # the flag of an update run
    ENTRIES: ClassVar[str]  # what a case's entry holds, for messages: "their tensors"
    ERROR: ClassVar[type[BaselineError]]

    @classmethod
    def default_path(cls, root: Path, backend: str, devices: int) -> Path:
        return root / cls.DIR / f"{backend}-{devices}.json"

    @classmethod
    def rewrite_hint(cls) -> str:
        return f"fix it, or delete it and write it again with {cls.FLAG}"

    @classmethod
    def load(cls: type[F], path: Path, backend: str, devices: int) -> F | None:
        """The baseline at path, or None where there is none yet.

        A file that is not a baseline, or a baseline of another backend or device count, is a
        usage error: used, it would fail or pass cases on what it cannot predict; ignored, it
        would switch the check off without a word.
        """
        if not path.is_file():
            return None
        where = f"{cls.KIND} baseline {path}"
        try:
            data = load_json(files.read_text(path))
        except OSError as exc:
            raise cls.ERROR(f"{where} cannot be read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise cls.ERROR(f"{where} is not valid JSON ({exc}); {cls.rewrite_hint()}") from None
        base = cls(path, *cls.checked(data, where))
        differ = [
            field
            for field, theirs, ours in (("backend", base.backend, backend), ("devices", base.devices, devices))
            if theirs != ours
        ]
        if differ:
            option = "--" + cls.OPTION.replace("_", "-")
            raise cls.ERROR(
                f"{where} was taken on backend {base.backend!r} with {base.devices} devices "
                f"(its {' and '.join(differ)} field{'s' if len(differ) > 1 else ''}); this run uses backend {backend} "
                f"with {devices} devices, whose {cls.PREDICTS} that baseline does not predict. Point {option} "
                f"at a baseline of this backend and device count (default: {cls.DIR}/{backend}-{devices}.json), "
                f"or write one: {cls.FLAG} {option}=NEW.json"
            )
        return base

    @classmethod
    def empty(cls: type[F], path: Path, backend: str, devices: int) -> F:
        return cls(path, backend, devices, None, {})

    @classmethod
    def checked(cls, data: Any, where: str) -> tuple[str, int, str | None, dict[str, E]]:
        """backend, devices, torch_xla and cases of a file read back, each of the type render() writes."""
        backend, devices, version, cases = checked_header(data, where, cls.ERROR, cls.rewrite_hint(), cls.PREDICTS)
        if not isinstance(cases, dict):
            raise cls.ERROR(f"{where}: cases must map case node ids to {cls.ENTRIES}; got {shown(cases)}")
        return (
            backend,
            devices,
            version,
            {case: cls.checked_entry(entry, f"{where}: case {case!r}") for case, entry in cases.items()},
        )

    @classmethod
    def checked_entry(cls, entry: Any, where: str) -> E:
        """One case's entry read back, of the type render() writes."""
        raise NotImplementedError

    def on_release_line(self, version: str | None) -> bool:
        """Whether `version` is on the release line the baseline was taken on (same major.minor)."""
        return on_release_line(version, self.torch_xla)

    def update(self, case: str, observed: Any, torch_xla: str | None) -> list[Any]:
        """Set the case's entry to what it observed; return what changed."""
        raise NotImplementedError

    def render(self) -> str:
        """The file's text (rewrite() writes it): sorted, a reviewable diff in a pull request."""
        raise NotImplementedError


BASELINE_KEYS = ("backend", "devices", "torch_xla", "cases")


def checked_header(
    data: Any, where: str, error: type[HarnessError], rewrite: str, kind: str
) -> tuple[str, int, str | None, Any]:
    """backend, devices, torch_xla and (unchecked) cases of a baseline file, each of the type
    render() writes; the start of every BaselineFile.checked. `kind` names what the file predicts
    ("shardings", "costs")."""
    if not isinstance(data, dict):
        raise error(f"{where} holds {shown(data)}, not an object with {', '.join(BASELINE_KEYS)}; {rewrite}")
    unknown = unknown_keys(data, BASELINE_KEYS)
    if unknown:
        raise error(f"{where}: {unknown}")
    missing = [key for key in ("backend", "devices", "cases") if key not in data]
    if missing:
        raise error(f"{where} lacks {', '.join(missing)}; {rewrite}")
    backend, devices, version, cases = data["backend"], data["devices"], data.get("torch_xla"), data["cases"]
    if not isinstance(backend, str) or not backend:
        raise error(f'{where}: backend must be a backend name, e.g. "cpu"; got {shown(backend)}')
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise error(f"{where}: devices must be a whole number, e.g. 4; got {shown(devices)}")
    if version is not None:
        try:
            Version(version if isinstance(version, str) else "")
        except InvalidVersion:
            raise error(
                f"{where}: torch_xla {version!r} is not a PEP 440 version, so no run could be placed on its "
                f"release line and a change of {kind} would never fail a case; set it to the torch_xla the "
                f'baseline was taken on (e.g. "2.9.0"), or {rewrite.removeprefix("fix it, or ")}'
            ) from None
    return backend, devices, version, cases


def rewrite(
    path: Path,
    kind: str,
    flag: str,
    load: Callable[[], F | None],
    empty: Callable[[], F],
    entries: Mapping[str, tuple[Any, str | None]],
    before: Mapping[str, Any] | None = None,
) -> dict[str, list[Any]]:
    """Apply this run's entries to the file as it is on disk now, under its lock; what changed per
    case. BaselineUpdateRefused (nothing written) where that cannot be done safely. `before`: the
    file's entries as the run read them before any case ran (None: not read)."""
    where = f"{kind} baseline {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    first: dict[str, list[Any]] | None = None
    for _ in range(LOCK_ATTEMPTS):
        with _locked(path, where) as (lock_fd, still_ours):
            try:
                base = load() or empty()
            except BaselineError as exc:
                raise BaselineUpdateRefused(
                    f"{where} is not written: the file on disk cannot be merged with: {exc}"
                ) from None
            _refuse_mixed_release_lines(base, entries, where, flag)
            written = _journal(lock_fd)
            if before is not None:
                _refuse_entries_changed_meanwhile(base, before, entries, written, where, flag)
            changes = {
                case: base.update(case, observed, version) for case, (observed, version) in sorted(entries.items())
            }
            first = changes if first is None else first  # what this run changes, as it first found the file
            written.update({case: _digest(base.cases[case]) for case in entries})
            _write_journal(lock_fd, written)
            if _replace(path, base.render(), still_ours):
                return first
    raise BaselineUpdateRefused(
        f"{where} is not written: its lock file was removed or replaced {LOCK_ATTEMPTS} times while this run "
        "held it (by a case?); run the update again"
    )


def _digest(entry: Any) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()


JOURNAL_LIMIT = 16 * 2**20


def _journal(lock_fd: int) -> dict[str, str]:
    """What update runs wrote, case -> digest of its entry, kept in the lock file (written only
    under its lock): another update beside this one is told from a case body's write by it. Read
    as untrusted: anything but that mapping reads as empty, which refuses more, never less."""
    try:
        if os.fstat(lock_fd).st_size > JOURNAL_LIMIT:
            return {}
        data = json.loads(os.pread(lock_fd, JOURNAL_LIMIT, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    written = data.get("written") if isinstance(data, dict) else None
    if not isinstance(written, dict):
        return {}
    return {str(case): digest for case, digest in written.items() if isinstance(digest, str)}


def _write_journal(lock_fd: int, written: Mapping[str, str]) -> None:
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, json.dumps({"written": dict(sorted(written.items()))}).encode(), 0)


def _refuse_entries_changed_meanwhile(
    base: BaselineFile[Any],
    before: Mapping[str, Any],
    entries: Mapping[str, Any],
    written: Mapping[str, str],
    where: str,
    flag: str,
) -> None:
    """An update writes only the cases the run took: an entry this run did not take that differs on
    disk from what the run read before its first case would be written as if the run had taken it,
    unless another update run wrote it (under the lock, in its journal): then it is that run's."""
    changed = sorted(
        case
        for case in set(base.cases) | set(before)
        if case not in entries
        and base.cases.get(case) != before.get(case)
        and not (case in base.cases and written.get(case) == _digest(base.cases[case]))
    )
    if changed:
        # case names come from the file: quoted and cut, never printed as they are
        named = ", ".join(ascii(case[:200]) for case in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise BaselineUpdateRefused(
            f"{where} is not written: {len(changed)} entr{'y' if len(changed) == 1 else 'ies'} this run did not take "
            f"changed on disk while it ran ({named}{more}): written "
            f"by a case body, or by another update run beside this one? Look at the file's diff, restore what no "
            f"run of yours wrote, and run {flag} again"
        )


def _refuse_mixed_release_lines(
    base: BaselineFile[Any], entries: Mapping[str, tuple[Any, str | None]], where: str, flag: str
) -> None:
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
    try:
        return ".".join(map(str, Version(version).release[:2]))
    except InvalidVersion:
        return version


@contextlib.contextmanager
def _locked(path: Path, where: str) -> Iterator[tuple[int, Callable[[], bool]]]:
    """An exclusive flock on `<file>.lock` beside the file, held while the file is read and replaced.
    Never follows a link planted there; waits LOCK_TIMEOUT_S at most.

    A lock file deleted or replaced while another process holds it (a case body can: it runs as
    the same user) would let a second writer lock a new file and merge with what the first is
    about to overwrite. So the lock is the file at the lock's path: after acquiring it, the
    descriptor must still be what the path names (else it is opened again), and the callable
    yielded says whether it still is, which _replace asks right before it renames."""
    lock = path.with_name(path.name + ".lock")
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fd = files.open_file(lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise BaselineUpdateRefused(
                f"{where} is not written: its lock file {lock} cannot be opened ({exc.strerror or exc}"
                f"{'; it is a link' if exc.errno == errno.ELOOP else ''}); remove it and run the update again"
            ) from None
        try:
            _acquire(fd, lock, where, deadline)
            if _names(lock, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a lock file that was removed or replaced while we waited: lock the one there now
    try:
        yield fd, lambda: _names(lock, fd)
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, lock: Path, where: str, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise BaselineUpdateRefused(
                    f"{where} is not written: another process has held its lock {lock} for "
                    f"{LOCK_TIMEOUT_S:.0f} s (another update run?); run the update again when it has finished"
                ) from None
            time.sleep(0.05)


def _names(path: Path, fd: int) -> bool:
    """The entry at path is the file open at fd (not a new file made after it was deleted)."""
    try:
        there, held = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _replace(path: Path, text: str, still_ours: Callable[[], bool] = lambda: True) -> bool:
    """Write `text` to a new file beside `path`, then rename it over `path` (atomic on POSIX),
    if the lock is still ours once the text is written; False (nothing replaced) when it is not."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        if not still_ours():
            os.unlink(temporary)
            return False
        os.replace(temporary, path)
        return True
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
