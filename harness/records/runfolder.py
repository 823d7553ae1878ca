"""One folder per pytest run under the results folder, and the pointer to the newest.

    <results-dir>/
      latest -> run-20261124-040512-p4711   symlink, replaced only if it points at a run folder
      junit.xml                             where scripts/ci-spmd.sh and the GKE worker ask pytest for it
      run-20261124-040512-p4711/
        run.json                  the manifest: who ran, when, how it ended
        verdicts-<worker>.jsonl   one case record per line (harness.records.results; amendments: late faults)
        requests-<worker>.jsonl   every body run, journalled before it runs, for harness.replay
        logs/<worker>/            child and fork-server logs
        hlo/<case>__<name>.txt    HLO text a case chose to keep
        costs/                    the partitioned modules of a failing cost-measured case
        xla-dumps/                the children's XLA dumps where /dev/shm is no tmpfs (else there), removed when the run ends
        summary.md                written by harness.report
        comparison.json           how the run compared with its base run (--spmd-compare; harness.judges.basecompare)
        replay-group-<n>.json     written by harness.replay --print-commands

`<worker>` is `main`, or xdist's worker id (`gw0`, `gw1`, ...): every pytest process writes files
of its own, so no two processes append to one file. The names are defined once, below.

Why a folder per run: the plugin is a pytest11 entry point, so it is loaded by every pytest in
the venv, with whatever `--results-dir` (`.`, a home folder) someone gives. It must never delete
or overwrite what it did not write, and two runs sharing a results folder must keep each other's
evidence. So a run writes only into a folder it created for itself (and the `latest` pointer),
and nothing is created at all until a run has SPMD work to record.

The manifest lets readers (harness.report, the matrix, the GKE worker) tell a finished run from
one that was killed, and cross-check pytest's own failures against the case records. A case body
can write anything here (it runs as the same user): the controlling pytest process closes the
manifest from its own memory, names in it what a case deleted or changed, and puts it back if it
changed after that; folders and files are created exclusively, never through a planted link.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from harness.errors import HarnessUsageError
from harness.isolation.system import files
from harness.schema import load_json

MANIFEST_NAME = "run.json"
LATEST_NAME = "latest"
RUN_PREFIX = "run-"
MANIFEST_SCHEMA = 1
# The manifest lists the node ids pytest reported failing so a reader can find failures that have
# no case record (a non-SPMD test, a lost record); bounded so a mass failure cannot bloat it.
MAX_FAILED_IDS = 500

# What a run folder holds (the layout above). A results folder is read after the run, also by
# other versions of the harness (harness.report, `matrix compare`): these names do not change.
LOGS_DIR = "logs"
HLO_DIR = "hlo"
COST_DUMPS_DIR = "costs"
MEMRAY_DIR = "memray"  # memray's captures of a failed case's tracked steps
XLA_DUMPS_DIR = "xla-dumps"
SUMMARY_NAME = "summary.md"
COMPARISON_NAME = "comparison.json"
JUNIT_NAME = "junit.xml"  # beside the run folders, not in one


def verdicts_name(worker: str) -> str:
    """The case records of one pytest process (`worker`: `main`, `gw0`, ...)."""
    return f"verdicts-{worker}.jsonl"


def requests_name(worker: str) -> str:
    """The journal of the body runs one pytest process asked for (harness.replay reads it)."""
    return f"requests-{worker}.jsonl"


VERDICTS_GLOB = verdicts_name("*")
REQUESTS_GLOB = requests_name("*")


# A run id a wrapper may choose (--spmd-run-id): one plain folder name under the results folder.
RUN_ID_PATTERN = re.compile(r"run-[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_run_id(text: str) -> str:
    """A run id given on the command line: `run-` and a plain name (no `/`, no `..`)."""
    if not RUN_ID_PATTERN.fullmatch(text):
        raise HarnessUsageError(
            f"{text!r} is not a run id: use {RUN_PREFIX} followed by letters, digits, '.', '_' or '-' "
            "(e.g. run-20261124-040512-ci42)"
        )
    return text


def new_run_id(pid: int | None = None) -> str:
    """`run-20261124-040512-p4711`: sortable by start time, unique per process on one host."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{RUN_PREFIX}{now:%Y%m%d-%H%M%S}-p{pid or os.getpid()}"


def check_results_dir(base: Path) -> Path:
    """The absolute base folder, known usable, creating nothing (a usage error otherwise).

    A folder that does not exist yet is fine when its nearest existing ancestor is a writable
    folder: it is made only when the run has something to write.
    """
    base = base.expanduser().absolute()
    probe = base
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    problem = None
    if not probe.is_dir():
        problem = f"{probe} is not a folder"
    elif not os.access(probe, os.W_OK | os.X_OK):
        problem = f"{probe} is not writable"
    if problem:
        raise HarnessUsageError(f"--spmd-results-dir={base} cannot be used ({problem}); point it at a writable folder")
    return base


@dataclasses.dataclass
class Manifest:
    """run.json. `status` is "running" until the controlling pytest process closes the run."""

    run_id: str
    pid: int  # the controlling pytest process (the xdist controller under -n)
    host: str
    started: str  # ISO 8601, UTC
    argv: list[str]
    status: str = "running"  # "running" | "finished"
    finished: str | None = None
    exitstatus: int | None = None  # pytest's exit code, as the run ended
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # pytest's own tallies
    failed_ids: list[str] = dataclasses.field(default_factory=list)  # node ids pytest reported failing
    junitxml: str | None = None
    # What the controlling pytest process found wrong with its own run folder when it closed it
    # (its manifest deleted or changed while cases ran): each one makes the report red.
    problems: list[str] = dataclasses.field(default_factory=list)
    schema: int = MANIFEST_SCHEMA
    # Each case record's digest (harness.records.results.record_digest) as the process that judged
    # the case wrote it, before any later case could touch it (harness.records.vouching); empty in
    # a manifest of an older harness.
    record_digests: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Strict: a manifest of the wrong shape is a ValueError naming the field."""
        data = load_json(text)
        if not isinstance(data, dict):
            raise ValueError("the manifest is not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        for name, kind in (("run_id", str), ("pid", int), ("host", str), ("started", str), ("status", str)):
            if not isinstance(kwargs.get(name), kind):
                raise ValueError(f"field {name!r} is missing or not a {kind.__name__}")
        for name, kind in (("exitstatus", int), ("finished", str), ("junitxml", str)):
            if kwargs.get(name) is not None and not isinstance(kwargs[name], kind):
                raise ValueError(f"field {name!r} is not a {kind.__name__}")
        if not isinstance(kwargs.get("counts", {}), dict) or not all(
            isinstance(v, int) for v in kwargs.get("counts", {}).values()
        ):
            raise ValueError("field 'counts' is not an object of integers")
        digests = kwargs.get("record_digests", {})
        if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
            raise ValueError("field 'record_digests' is not an object of strings")
        for name in ("failed_ids", "problems", "argv"):
            if not isinstance(kwargs.get(name, []), list) or not all(isinstance(v, str) for v in kwargs.get(name, [])):
                raise ValueError(f"field {name!r} is not a list of strings")
        kwargs.setdefault("argv", [])
        return cls(**kwargs)


@dataclasses.dataclass
class RunFolder:
    """This run's folder. Nothing exists on disk until `claim()`.

    Everything in the folder is writable by the code under test (a case body runs as the same
    user), so the controlling pytest process never takes the folder's word for what it wrote:
    the manifest it closes is built from its own memory, and what it finds on disk instead of the
    manifest it expects is written into it as a problem (harness.report then fails the run).
    """

    base: Path
    run_id: str
    controller_pid: int
    started: str
    argv: list[str] = dataclasses.field(default_factory=list)  # the controlling process's
    # (st_dev, st_ino) of the folder once this process made or adopted it; set means claimed, so
    # a case deleting the manifest later does not make the run refuse its own folder.
    _claimed: tuple[int, int] | None = dataclasses.field(default=None, compare=False, repr=False)
    _closed_text: str | None = dataclasses.field(default=None, compare=False, repr=False)
    # Where `latest` pointed before claim() moved it here: retire() puts it back.
    _previous_latest: str | None = dataclasses.field(default=None, compare=False, repr=False)
    _made_base: bool = dataclasses.field(default=False, compare=False, repr=False)  # claim() made the results folder

    @classmethod
    def new(cls, base: Path, run_id: str | None = None) -> RunFolder:
        """run_id: chosen by a wrapper that must know the folder before the run (--spmd-run-id)."""
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        base = check_results_dir(base)
        if run_id and os.path.lexists(base / check_run_id(run_id)):
            raise HarnessUsageError(f"--spmd-run-id={run_id}: {base / run_id} exists already; name a new run folder")
        return cls(
            base=base,
            run_id=check_run_id(run_id) if run_id else new_run_id(),
            controller_pid=os.getpid(),
            started=now,
            argv=list(sys.argv),
        )

    @property
    def path(self) -> Path:
        return self.base / self.run_id

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    def to_workerinput(self) -> dict[str, Any]:
        return {
            "base": str(self.base),
            "run_id": self.run_id,
            "pid": self.controller_pid,
            "started": self.started,
            "argv": self.argv,
        }

    @classmethod
    def from_workerinput(cls, data: dict[str, Any]) -> RunFolder:
        return cls(
            base=Path(data["base"]),
            run_id=data["run_id"],
            controller_pid=data["pid"],
            started=data["started"],
            argv=list(data.get("argv", [])),
        )

    def exists(self) -> bool:
        """The run made its folder (a process of this run claimed it). Not the manifest's word: a
        case can delete it or put a pipe in its place, and the run must still be closed and fail."""
        return _is_real_folder(self.path)

    def opening_manifest(self) -> Manifest:
        """The manifest as claim() writes it: the same in every process of the run."""
        return Manifest(
            run_id=self.run_id, pid=self.controller_pid, host=socket.gethostname(), started=self.started, argv=self.argv
        )

    def claim(self) -> Path:
        """Create the run folder and its manifest (once, whichever process of the run is first),
        and point `latest` at it. Returns the folder.

        The folder is made exclusively (mkdir fails on any entry of that name, a link included):
        an entry this run did not make (a link or a folder planted there, a clash, a user's
        folder) is refused rather than written into. Once claimed, a process never asks the
        folder again whether it is its own: a case deleting the manifest does not stop the run.
        """
        if self._claimed is not None:
            return self.path
        self._made_base = not os.path.lexists(self.base)
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.path)
        except FileExistsError:
            if not self._is_ours_in_progress():
                raise HarnessUsageError(
                    f"{self.path} already exists and is not this run's folder (a link, or a folder another "
                    "run made); remove it or choose another --spmd-results-dir"
                ) from None
        info = os.lstat(self.path)
        self._claimed = (info.st_dev, info.st_ino)
        try:
            files.create_new(self.manifest_path, self.opening_manifest().to_json())
        except FileExistsError:
            return self.path  # another process of this run wrote it a moment ago
        self._previous_latest = _latest_target(self.base)
        point_latest(self.base, self.path)
        return self.path

    def retire(self) -> bool:
        """The run was refused, or collected nothing, before any case ran: remove the folder this process
        made, which holds only what the harness wrote at its start (the manifest, the fork servers'
        logs), and point `latest` back where it was, so readers see the previous real run. A folder
        holding a case record, or no longer the one this process made, is kept. True if removed."""
        if self._claimed is None or any(self.path.glob(VERDICTS_GLOB)):
            return False
        try:
            info = os.lstat(self.path)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) != self._claimed:
            return False
        shutil.rmtree(self.path)
        if _latest_target(self.base) == self.run_id:
            previous = self._previous_latest
            if previous and is_run_folder(self.base / previous):
                point_latest(self.base, self.base / previous)
            else:
                (self.base / LATEST_NAME).unlink(missing_ok=True)
        if self._made_base:
            try:
                self.base.rmdir()  # only if empty: what another run put there since stays
            except OSError:
                pass
        return True

    def _is_ours_in_progress(self) -> bool:
        """Another process of this same run made the folder a moment ago (its manifest may follow):
        a real folder of ours, never a link, whose manifest (if any) names this run."""
        try:
            info = os.lstat(self.path)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        try:
            found = read_manifest(self.path)
            # Not the run id alone: two runs given the same --spmd-run-id both pass the check in
            # new() (nothing is made before a run has something to write); the one that claims
            # second must refuse the other's folder. Every process of one run opens the same manifest.
            mine = self.opening_manifest()
            return (found.run_id, found.pid, found.host, found.started) == (
                mine.run_id,
                mine.pid,
                mine.host,
                mine.started,
            )
        except FileNotFoundError:
            return True  # not written yet (or deleted by a case: the controller says so at the end)
        except (OSError, ValueError):
            return True  # being written by the worker that won the O_EXCL race

    def manifest_problems(self) -> list[str]:
        """What is wrong with the manifest on disk (controller, before finish()): missing, or not
        the one claim() wrote. Empty when the run made no folder."""
        if not os.path.lexists(self.path):
            if self._claimed is None:
                return []  # the run had nothing to write (or this process never made the folder)
            return [f"{self.path} was deleted while the run's cases ran (by a case?); the run fails"]
        if not _is_real_folder(self.path):
            return [f"{self.path} is no longer the folder this run made (replaced by a link or a file, by a case?)"]
        try:
            found: str | None = files.read_text(self.manifest_path)
        except FileNotFoundError:
            found = None
        except OSError as exc:
            found = f"unreadable ({exc.strerror or exc})"
        if found == self.opening_manifest().to_json():
            return []
        what = "deleted" if found is None else "changed"
        return [
            f"{MANIFEST_NAME} of {self.run_id} was {what} while the run's cases ran (by a case?); its records "
            "cannot be trusted, and the run fails"
        ]

    def finish(
        self,
        exitstatus: int,
        counts: dict[str, int],
        failed_ids: list[str],
        junitxml: str | None,
        problems: list[str] | None = None,
        record_digests: dict[str, str] | None = None,
    ) -> None:
        """Close the run's manifest (controller only), if the run made its folder at all.

        Built from this process's memory, never from the file: whatever a case wrote there is
        replaced; `problems` (manifest_problems()) are written into it.
        """
        if not _is_real_folder(self.path):
            if os.path.lexists(self.path):
                raise OSError(f"{self.path} is no longer the folder this run made (replaced by a link or a file)")
            return  # the run had nothing to write
        manifest = self.opening_manifest()
        manifest.problems = list(problems or [])
        manifest.status = "finished"
        manifest.finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        manifest.exitstatus = int(exitstatus)
        manifest.counts = dict(counts)
        manifest.failed_ids = failed_ids[:MAX_FAILED_IDS]
        manifest.junitxml = junitxml
        manifest.record_digests = dict(record_digests or {})
        self._closed_text = manifest.to_json()
        replace_file(self.manifest_path, self._closed_text)

    def recheck(self) -> str | None:
        """After the run's last process ended: put back the manifest finish() wrote if something
        changed it since, saying so in it. Returns what was found wrong, or None."""
        if self._closed_text is None or not _is_real_folder(self.path):
            return None
        try:
            if files.read_text(self.manifest_path) == self._closed_text:
                return None
        except OSError:
            pass
        manifest = Manifest.from_json(self._closed_text)
        problem = f"{MANIFEST_NAME} was changed or deleted after pytest closed it; put back as pytest wrote it"
        manifest.problems.append(problem)
        self._closed_text = manifest.to_json()
        replace_file(self.manifest_path, self._closed_text)
        return problem


def read_manifest(run_path: Path) -> Manifest:
    """The run's manifest; a link in its place is not followed (OSError)."""
    return Manifest.from_json(files.read_text(run_path / MANIFEST_NAME))


def replace_file(path: Path, text: str) -> None:
    """Write text to path atomically, never through anything planted there (harness.isolation.system.files)."""
    files.replace_file(path, text)


def _is_real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_real_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_run_folder(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()


def point_latest(base: Path, run_path: Path) -> None:
    """Point base/latest at run_path, unless `latest` is something the harness did not make.

    The pointer is relative (the results folder can be moved or uploaded as a whole) and
    replaced atomically (rename over the old link), so a reader never finds it missing.
    """
    latest = base / LATEST_NAME
    if latest.exists() or latest.is_symlink():
        if not _points_at_a_run(latest):
            return  # a user's file or folder named `latest`: not ours to replace
    temp = base / f".{LATEST_NAME}.{os.getpid()}.tmp"
    try:
        temp.unlink(missing_ok=True)
        temp.symlink_to(run_path.name)
        os.replace(temp, latest)
    except OSError:
        temp.unlink(missing_ok=True)  # a filesystem without symlinks: readers fall back to the newest run


def _latest_target(base: Path) -> str | None:
    """The run `base/latest` names, if it is the harness's link."""
    latest = base / LATEST_NAME
    return os.readlink(latest) if _points_at_a_run(latest) else None


def _points_at_a_run(latest: Path) -> bool:
    """A `latest` the harness made: a link to a `run-*` name beside it."""
    try:
        target = os.readlink(latest)
    except OSError:
        return False
    return "/" not in target and target.startswith(RUN_PREFIX)


def resolve(path: Path) -> Path | None:
    """The run folder a reader means by `path`: the folder itself when it is a run (named `run-*`
    or holding a manifest; or a folder of verdicts written without one, as tests and GKE host
    folders hold), else where `latest` points, else the newest run folder in it; None when it
    holds no run. A run folder whose manifest is missing is still that run (its report fails),
    never a reason to show another one."""
    path = Path(path)
    if is_run_folder(path) or any(path.glob(VERDICTS_GLOB)) or (path.name.startswith(RUN_PREFIX) and path.is_dir()):
        return path
    latest = path / LATEST_NAME
    if _points_at_a_run(latest) and latest.is_dir():
        return latest.resolve()
    return next((run for run in runs_in(path) if is_run_folder(run)), None)


def runs_in(path: Path) -> list[Path]:
    """The run folders a results folder holds (`run-*` folders, never a link), newest first: the
    one order every reader picks a run from (resolve; a base run: harness.judges.basecompare)."""
    found = (p for p in Path(path).glob(f"{RUN_PREFIX}*") if p.is_dir() and not p.is_symlink())
    return sorted(found, key=lambda p: p.name, reverse=True)


def finished_at(run: Path) -> datetime.datetime | None:
    """When the run's manifest says pytest closed it (UTC); None when it did not, or cannot be read."""
    try:
        finished = read_manifest(run).finished
        when = datetime.datetime.fromisoformat(finished) if finished else None
    except (OSError, ValueError):
        return None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when


def newest_finished_first(runs: list[Path]) -> list[Path]:
    """runs ordered by the finish time their manifests hold, newest first; the unfinished last.
    Not by name: a wrapper names a run as it likes (--spmd-run-id), and a folder named to sort
    newest says nothing about when it ran. Nor by a finish time later than the manifest's file
    was last changed (its ctime, which no user can set): pytest writes run.json as it finishes,
    so such a time is made up (a run a case planted beside its own, "finished" in an hour)."""
    never = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)

    def finished(run: Path) -> datetime.datetime:
        when, written = finished_at(run), _changed_at(run / MANIFEST_NAME)
        if when is None or written is None:
            return when or never
        return min(when + _TO_THE_SECOND, written)  # a manifest's times are cut to the second

    return sorted(runs, key=finished, reverse=True)


_TO_THE_SECOND = datetime.timedelta(seconds=1)


def _changed_at(path: Path) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromtimestamp(os.lstat(path).st_ctime, datetime.timezone.utc)
    except OSError:
        return None


def find_runs(path: Path) -> list[Path]:
    """The run `path` means, else one run per subfolder (a GKE launch: a folder per host)."""
    own = resolve(path)
    if own is not None:
        return [own]
    if not Path(path).is_dir():
        return []
    found = []
    for child in sorted(p for p in Path(path).iterdir() if p.is_dir() and not p.is_symlink()):
        run = resolve(child)
        if run is not None:
            found.append(run)
    return found
