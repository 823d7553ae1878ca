"""The results folder: one JSON record per case, written by the pytest plugin.

This is the contract between the harness and everything downstream of a run (the CI job
summary, the GKE worker's host report, the release matrix). Under pytest-xdist every process
writes its own `verdicts-<worker>.jsonl`, so no two processes append to one file.

Layout of a results folder:
    verdicts-<worker>.jsonl   one CaseRecord per line
    junit.xml                 when pytest ran with --junitxml pointing here
    hlo/<case>.txt            HLO excerpts a case chose to keep
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

VERDICTS_GLOB = "verdicts-*.jsonl"


@dataclasses.dataclass
class CaseRecord:
    """What one case did, as the plugin judged it."""

    nodeid: str  # pytest node id, e.g. "cases/test_scalar_specs.py::test_wrap[func-on]"
    family: str  # bug family: the case file's stem without "test_", e.g. "scalar_specs"
    outcome: str  # "passed" | "failed" | "xfailed" | "skipped"
    reason: str = ""  # one line: why it failed / was skipped / which known bug it reproduced
    known_bug: str | None = None  # registry entry id the case was judged against, if any
    evidence: str = ""  # the exception line, signal or log tail that decided the verdict
    torch_xla: str | None = None  # torch_xla version the child ran (None if no child ran)
    backend: str = ""
    devices: int | None = None
    duration_s: float = 0.0
    # Sharding spec per named tensor as the child observed it, e.g. {"fc.weight": "{devices=[4,1]0,1,2,3}"}.
    shardings: dict[str, str] = dataclasses.field(default_factory=dict)
    # Where the host ran (filled in by the GKE worker and the --local launcher).
    slice_id: int | None = None
    host_id: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CaseRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def family_of(nodeid: str) -> str:
    """`cases/test_scalar_specs.py::x` -> `scalar_specs`."""
    stem = Path(nodeid.split("::", 1)[0]).stem
    return stem[len("test_") :] if stem.startswith("test_") else stem


def write_record(results_dir: Path, record: CaseRecord, worker: str = "main") -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"verdicts-{worker}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(record.to_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # a later crash of this process must not lose the verdict


def read_records(results_dir: Path) -> Iterator[CaseRecord]:
    for path in sorted(Path(results_dir).glob(VERDICTS_GLOB)):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield CaseRecord.from_dict(json.loads(line))


def safe_filename(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180]
