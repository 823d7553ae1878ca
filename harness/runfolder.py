"""One folder per pytest run under the results folder, and the pointer to the newest.

    <results-dir>/
      latest -> run-20261124-040512-p4711   symlink, replaced only if it points at a run folder
      junit.xml                             where scripts/ci-spmd.sh and the GKE worker ask pytest for it
      run-20261124-040512-p4711/
        run.json                  the manifest: who ran, when, how it ended
        verdicts-<worker>.jsonl   one case record per line (harness.results; amendments: late faults)
        requests-<worker>.jsonl   every body run, journalled before it runs, for harness.replay
        logs/<worker>/            child and fork-server logs
        hlo/<case>__<name>.txt    HLO text a case chose to keep
        costs/                    the partitioned modules of a failing cost-measured case
        xla-dumps/                the children's XLA dumps, removed when the run ends
        summary.md                written by harness.report
        comparison.json           how the run compared with its base run (--spmd-compare; harness.basecompare)
        replay-group-<n>.json     written by harness.replay --print-commands

`<worker>` is `main`, or xdist's worker id (`gw0`, `gw1`, ...): every pytest process writes files
of its own, so no two processes append to one file. The names are defined once, below.

Why a folder per run: the plugin is a pytest11 entry point, so it is loaded by every pytest in
the venv, with whatever `--results-dir` (`.`, a home folder) someone gives. It must never delete
or overwrite what it did not write, and two runs sharing a results folder must keep each other's
evidence. So a run writes only into a folder it created for itself (and the `latest` pointer),
and nothing is created at all until a run has SPMD work to record.

The manifest lets readers (harness.report, the matrix, the GKE worker) tell a finished run from
one that was killed, and cross-check pytest's own failures against the case records.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from harness.errors import HarnessUsageError

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
    schema: int = MANIFEST_SCHEMA

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Strict: a manifest of the wrong shape is a ValueError naming the field."""
        data = json.loads(text)
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
        if not isinstance(kwargs.get("failed_ids", []), list) or not all(
            isinstance(v, str) for v in kwargs.get("failed_ids", [])
        ):
            raise ValueError("field 'failed_ids' is not a list of strings")
        kwargs.setdefault("argv", [])
        return cls(**kwargs)


@dataclasses.dataclass
class RunFolder:
    """This run's folder. Nothing exists on disk until `claim()`."""

    base: Path
    run_id: str
    controller_pid: int
    started: str

    @classmethod
    def new(cls, base: Path) -> RunFolder:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(base=check_results_dir(base), run_id=new_run_id(), controller_pid=os.getpid(), started=now)

    @property
    def path(self) -> Path:
        return self.base / self.run_id

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    def to_workerinput(self) -> dict[str, Any]:
        return {"base": str(self.base), "run_id": self.run_id, "pid": self.controller_pid, "started": self.started}

    @classmethod
    def from_workerinput(cls, data: dict[str, Any]) -> RunFolder:
        return cls(base=Path(data["base"]), run_id=data["run_id"], controller_pid=data["pid"], started=data["started"])

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def claim(self) -> Path:
        """Create the run folder and its manifest (once, whichever process of the run is first),
        and point `latest` at it. Returns the folder.

        The folder is made with exist_ok=False by the first claimer: a folder of that name that
        this run did not make (a clash, or a user's folder) is refused rather than written into.
        """
        if self.exists():
            return self.path
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()
        except FileExistsError:
            if not self._is_ours_in_progress():
                raise HarnessUsageError(
                    f"{self.path} already exists and is not this run's folder; remove it or choose "
                    "another --spmd-results-dir"
                ) from None
        manifest = Manifest(
            run_id=self.run_id,
            pid=self.controller_pid,
            host=socket.gethostname(),
            started=self.started,
            argv=list(sys.argv),
        )
        try:
            # O_EXCL: when several xdist workers claim at once, exactly one writes the manifest.
            fd = os.open(self.manifest_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return self.path
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(manifest.to_json())
        point_latest(self.base, self.path)
        return self.path

    def _is_ours_in_progress(self) -> bool:
        """Another process of this same run made the folder a moment ago (its manifest may follow)."""
        entries = {p.name for p in self.path.iterdir()}  # listed once: the manifest may appear any moment
        if MANIFEST_NAME not in entries:
            return not entries
        try:
            return read_manifest(self.path).run_id == self.run_id
        except ValueError:
            return True  # being written by the worker that won the O_EXCL race

    def finish(self, exitstatus: int, counts: dict[str, int], failed_ids: list[str], junitxml: str | None) -> None:
        """Close the run's manifest (controller only), if the run wrote anything at all."""
        if not self.exists():
            return
        manifest = read_manifest(self.path)
        manifest.status = "finished"
        manifest.finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        manifest.exitstatus = int(exitstatus)
        manifest.counts = dict(counts)
        manifest.failed_ids = failed_ids[:MAX_FAILED_IDS]
        manifest.junitxml = junitxml
        replace_file(self.manifest_path, manifest.to_json())


def read_manifest(run_path: Path) -> Manifest:
    return Manifest.from_json((run_path / MANIFEST_NAME).read_text(encoding="utf-8"))


def replace_file(path: Path, text: str) -> None:
    """Write text to path atomically: a reader sees the old or the new file, never half of one."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def is_run_folder(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()


def point_latest(base: Path, run_path: Path) -> None:
    """Point base/latest at run_path, unless `latest` is something the harness did not make.

    The pointer is relative (the results folder can be moved or uploaded as a whole) and
    replaced atomically (rename over the old link), so a reader never finds it missing.
    """
    latest = base / LATEST_NAME
    if latest.exists() or latest.is_symlink():
        if not latest.is_symlink() or not is_run_folder(latest):
            return  # a user's file or folder named `latest`: not ours to replace
    temp = base / f".{LATEST_NAME}.{os.getpid()}.tmp"
    try:
        temp.unlink(missing_ok=True)
        temp.symlink_to(run_path.name)
        os.replace(temp, latest)
    except OSError:
        temp.unlink(missing_ok=True)  # a filesystem without symlinks: readers fall back to the newest run


def resolve(path: Path) -> Path | None:
    """The run folder a reader means by `path`: the folder itself when it is a run (or a folder
    of verdicts written without one, as tests and GKE host folders hold), else where `latest`
    points, else the newest run folder in it; None when it holds no run."""
    path = Path(path)
    if is_run_folder(path) or any(path.glob(VERDICTS_GLOB)):
        return path
    latest = path / LATEST_NAME
    if latest.is_symlink() and is_run_folder(latest):
        return latest.resolve()
    runs = sorted(p for p in path.glob(f"{RUN_PREFIX}*") if is_run_folder(p))
    return runs[-1] if runs else None


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
