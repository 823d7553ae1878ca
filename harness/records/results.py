"""The results folder: one JSON record per case, written by the pytest plugin.

This is the contract between the harness and everything downstream of a run (the CI job
summary, the GKE worker's host report, the release matrix). Each pytest process appends its
records to `verdicts-<worker>.jsonl` in the run's own folder: one CaseRecord per line, and an
amendment (`{"amends": nodeid, "late_fault": ...}`) where a child misbehaved after a case's
verdict. The run folder's whole layout: harness.records.runfolder.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import DamagedRecord
from harness.isolation.system import files
from harness.isolation.system.processes import describe_exit
from harness.records import runfolder
from harness.schema import load_json, shown

# The shape of a CaseRecord line; readers can refuse what they do not know.
RECORD_SCHEMA = 2
# Evidence kept in a record: the cause leads, so the head is kept (tails are bounded already).
RECORD_EVIDENCE_LIMIT = 8000


@dataclasses.dataclass
class CaseRecord:
    """What one case did, as the plugin judged it."""

    nodeid: str  # pytest node id, e.g. "cases/test_scalar_specs.py::test_wrap[func-on]"
    family: str  # bug family: the case file's stem without "test_", e.g. "scalar_specs"
    outcome: str  # "passed" | "failed" | "xfailed" | "skipped"
    reason: str = ""  # one line: why it failed / was skipped / which known bug it reproduced
    known_bug: str | None = None  # registry entry id the case was judged against, if any
    # The registry's judgement (harness.registry.JudgementKind): reproduced / passed / unexpected-pass /
    # regressed / failed / unjudged; None for a case that names no entry. Readers use this
    # instead of judging again.
    registry_verdict: str | None = None
    signature: str | None = None  # the registry signature the evidence matched
    known_bugs: list[str] = dataclasses.field(default_factory=list)  # every entry the case names
    # Cause first: "SIGABRT: F... Check failed: has_sharding()" or "TypeError: ...", then a bounded log tail.
    evidence: str = ""
    torch_xla: str | None = None  # torch_xla version the child ran (None if no child ran)
    backend: str = ""
    devices: int | None = None
    duration_s: float = 0.0  # the test as pytest timed it (waits for children included)
    body_s: float = 0.0  # the case bodies' own time, as their children measured it
    # Sharding spec per named tensor as the child observed it, e.g. {"fc.weight": "{devices=[4,1]0,1,2,3}"}.
    shardings: dict[str, str] = dataclasses.field(default_factory=dict)
    # False for a case marked no_sharding_baseline (its tensors vary by design, e.g. Hypothesis
    # draws): kept out of baselines and of the release matrix's sharding changes.
    sharding_baseline: bool = True
    # How the shardings differ from the case's baseline entry (harness.judges.baseline), one line per tensor.
    sharding_changes: list[str] = dataclasses.field(default_factory=list)
    # Each training loop's cost signature (harness.costs.comparable), by loop label; and how it
    # differs from the case's cost baseline entry or breaks steady state, one line per item.
    costs: dict[str, Any] = dataclasses.field(default_factory=dict)
    cost_changes: list[str] = dataclasses.field(default_factory=list)
    # Where the host ran (filled in by the GKE worker and the --local launcher).
    slice_id: int | None = None
    host_id: int | None = None

    # Set when the case's child died or misbehaved after the verdict (before the next case
    # started): the evidence of that fault. The outcome is then "failed".
    late_fault: str = ""

    # What else the run used, from the installed packages (harness.records.versions): the torch_xla above
    # is the one the child imported; these say which torch and jax came with it, which harness
    # judged it, and the record layout (schema) a reader can check.
    torch: str | None = None
    jax: str | None = None
    harness: str | None = None
    schema: int = RECORD_SCHEMA

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> CaseRecord:
        """A record read back from JSON: a results folder is untrusted input (a crash, a hand edit,
        another version of the harness), so each field's type is checked here, once, instead of
        failing later in whatever formats it. Raises DamagedRecord naming the field."""
        if not isinstance(data, dict):
            raise DamagedRecord(f"{shown(data)}, not a case record (a JSON object)")
        missing = [name for name in ("nodeid", "family", "outcome") if name not in data]
        if missing:
            raise DamagedRecord(f"a record without {', '.join(missing)}")
        for name, value in data.items():
            check = _FIELD_TYPES.get(name)
            if check is not None and not check[1](value):
                raise DamagedRecord(f"{name} is {shown(value)}, not {check[0]}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each field of a record read back must be (JSON gives str, int, float, bool, list, dict, None).
_FIELD_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "nodeid": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    **{
        name: ("a string", lambda v: isinstance(v, str))
        for name in ("family", "outcome", "reason", "evidence", "backend", "late_fault")
    },
    **{
        name: ("a string or null", lambda v: v is None or isinstance(v, str))
        for name in ("known_bug", "registry_verdict", "signature", "torch_xla", "torch", "jax", "harness")
    },
    "schema": ("a whole number", _is_int),
    **{
        name: ("a whole number or null", lambda v: v is None or _is_int(v))
        for name in ("devices", "slice_id", "host_id")
    },
    **{name: ("a number", lambda v: _is_int(v) or isinstance(v, float)) for name in ("duration_s", "body_s")},
    **{
        name: ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
        for name in ("known_bugs", "sharding_changes", "cost_changes")
    },
    "costs": ("a mapping of training loops to cost signatures", lambda v: _are_signatures(v)),
    "shardings": (
        "a mapping of tensor names to sharding text",
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    ),
    "sharding_baseline": ("true or false", lambda v: isinstance(v, bool)),
}


def item_case_id(item: pytest.Item) -> str:
    """The case's one key in records and both baselines (case_id below)."""
    return case_id(item.nodeid, item.path, item.config.rootpath)


def case_id(nodeid: str, path: Path, rootpath: Path) -> str:
    """The case's stable name in records, baselines and the journal: pytest's node id when the
    file lies under the rootdir, else the file's path from its outermost package folder.

    A case file outside the rootdir (pytorch/xla's test/ tree run with this repository's config,
    `-c pyproject.toml --rootdir=...`) gets a node id of `::test_x` from pytest: its file is gone
    from the id, so cases of two files would collide, and its family would be empty.
    """
    file_part, _, rest = nodeid.partition("::")
    if file_part and not file_part.startswith(".."):
        return nodeid
    path = Path(path)
    try:
        relative = path.relative_to(rootpath)
    except ValueError:
        top = path.parent
        while (top / "__init__.py").is_file():
            top = top.parent
        relative = path.relative_to(top)
    return f"{relative.as_posix()}::{rest}"


def _are_signatures(value: Any) -> bool:
    from harness.costs import CostReadError, check_signature

    if not isinstance(value, dict):
        return False
    try:
        for label, signature in value.items():
            check_signature(signature, label)
    except CostReadError:
        return False
    return True


def family_of(nodeid: str) -> str:
    """`cases/test_scalar_specs.py::x` -> `scalar_specs`."""
    stem = Path(nodeid.split("::", 1)[0]).stem
    return stem[len("test_") :] if stem.startswith("test_") else stem


def bounded_evidence(text: str, limit: int = RECORD_EVIDENCE_LIMIT) -> str:
    """Evidence as a record keeps it: its head, and how much of the child log was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters in the child log ...]"


# A report's user property: the digest of the case record its process wrote (record_digest), which
# reaches the controlling pytest process with the report, out of any case's reach.
RECORD_DIGEST_PROPERTY = "spmd_record_digest"


def record_digest(record: CaseRecord) -> str:
    """What the process that judged a case keeps of its record: a later case that rewrites the
    line cannot make it match (harness.records.vouching)."""
    return hashlib.sha256(record.to_json().encode("utf-8", "backslashreplace")).hexdigest()


def write_record(results_dir: Path, record: CaseRecord, worker: str = "main") -> None:
    _append(results_dir / runfolder.verdicts_name(worker), record.to_json())


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.append_line(path, line, durable=True)  # a later crash of this process must not lose the verdict


def write_amendment(results_dir: Path, nodeid: str, late_fault: str, worker: str = "main") -> None:
    """Charge a fault found after a case's verdict to that case; read_records folds it in."""
    _append(results_dir / runfolder.verdicts_name(worker), json.dumps({"amends": nodeid, "late_fault": late_fault}))


def read_records(
    results_dir: Path,
    unreadable: list[str] | None = None,
    recursive: bool = False,
    digests: dict[str, str] | None = None,
) -> Iterator[CaseRecord]:
    """Every case's record, with later amendments (late faults) folded into it.

    results_dir may be a run folder or a results folder (its `latest` run is read; see
    harness.records.runfolder). unreadable: when given, a damaged line (cut by a crash mid-write, or not
    a record of the right shape) is listed there as "verdicts-gw1.jsonl:7"; without it,
    DamagedRecord is raised naming the file, the line and what is wrong. recursive: a folder of
    per-host results folders (GKE) is read as one run per host. digests: when given, each record's
    record_digest as read, before amendments, by case id.
    """
    root = Path(results_dir)
    runs = runfolder.find_runs(root) if recursive else [runfolder.resolve(root) or root]
    for path in sorted(p for run in runs for p in run.glob(runfolder.VERDICTS_GLOB)):
        records: dict[str, CaseRecord] = {}
        try:
            fd = files.open_file(path, os.O_RDONLY)
            try:
                files.check_size(fd, path)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:  # a pipe, a link or a huge file a case put in its place: unread, never waited on
            if unreadable is None:
                raise DamagedRecord(f"{path}: cannot be read ({exc.strerror or exc})") from None
            unreadable.append(f"{_shown(path, root)} ({exc.strerror or exc})")
            continue
        with os.fdopen(fd, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    data = load_json(line)
                    if isinstance(data, dict) and "amends" in data:
                        apply_amendment(records, data)
                    else:
                        record = CaseRecord.from_dict(data)
                        records[record.nodeid] = record
                        if digests is not None:
                            digests[record.nodeid] = record_digest(record)
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    if unreadable is None:
                        why = (
                            exc
                            if isinstance(exc, DamagedRecord)
                            else f"not JSON ({exc})"
                            if isinstance(exc, ValueError)
                            else f"not a case record ({exc!r})"
                        )
                        raise DamagedRecord(f"{path}:{number}: {why}") from None
                    unreadable.append(f"{_shown(path, root)}:{number}")
        yield from records.values()


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:  # reached through `latest`
        return str(path.relative_to(path.parent.parent))


def apply_amendment(records: dict[str, CaseRecord], data: dict[str, Any]) -> None:
    if not (isinstance(data["amends"], str) and isinstance(data.get("late_fault"), str)):
        raise DamagedRecord("an amendment whose amends or late_fault is not a string")
    record = records.get(data["amends"])
    if record is None:
        return  # the case's own record was lost (a run killed mid-write): nothing to amend
    record.late_fault = data["late_fault"]
    if record.outcome in ("passed", "xfailed"):
        record.reason = (
            f"its child failed after the verdict ({record.outcome} before that): "
            f"{(data['late_fault'].splitlines() or [''])[0]}"  # a case's text: it may be empty
        )
        record.outcome = "failed"


def safe_filename(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180]


def keep_texts(folder: Path, case_id: str, texts: dict[str, str], suffix: str) -> None:
    """A case's texts (HLO modules, XLA dumps) as `<case>__<name><suffix>` files in `folder`."""
    if not texts:
        return
    files.own_folder(folder)  # a link a case put in its place is replaced, not written through
    for name, text in texts.items():
        # Written beside and renamed into place: a link or a pipe a case planted under the name is
        # replaced, never written through (the run folder is writable by the code under test).
        files.replace_file(folder / f"{safe_filename(case_id)}__{safe_filename(name)}{suffix}", text)


def keep_captures(folder: Path, case_id: str, captures: dict[str, str]) -> None:
    """memray's captures (base64, checked by harness.isolation.parent.observations) as
    `<case>__<loop>_step<N>.memray` files in `folder`, each written beside and renamed into place."""
    if not captures:
        return
    files.own_folder(folder)
    for name, text in captures.items():
        path = folder / f"{safe_filename(case_id)}__{safe_filename(name)}.memray"
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.unlink(missing_ok=True)
        with os.fdopen(files.open_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
            fh.write(base64.b64decode(text, validate=True))
        os.replace(temp, path)


def is_failure(record: CaseRecord) -> bool:
    # An outcome this module does not know is treated as a failure rather than silently passed.
    return record.outcome not in ("passed", "xfailed", "skipped")


def contradicting(failed_ids: Iterable[str], records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """The one rule for records that contradict their run's manifest: pytest reported the case
    failed (its manifest's failed_ids), yet its record says it did not fail. A record a case body
    edited, or a failure in set-up or teardown after the verdict was written; either way the
    record cannot be believed where it says pass."""
    failed = set(failed_ids)
    return [record for record in records if record.nodeid in failed and not is_failure(record)]


def suite_exit_problem(code: int | None) -> str | None:
    """Why a pytest run's exit code means its cases were not all judged; None for 0 and 1.

    0 (all passed) and 1 (some failed) are a suite that ran as a whole; anything else
    (interrupted, internal error, usage error, nothing collected, a signal) makes its records
    suspect, whatever they say.
    """
    if code in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return None
    if code is None or code < 0:
        return f"pytest died of {describe_exit(code)}"
    try:
        meaning = pytest.ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        meaning = "not one of pytest's exit codes"
    return f"pytest exited {code} ({meaning})"
