"""Registry entry x column: what each release did, what the registry predicts, and whether they agree.

A cell is read from the CaseRecords that name the entry, using the registry verdict the plugin
stored in each (nothing is judged again here):
    reproduced   every case xfailed (failed with the entry's signature on a carrying release)
    fixed        every case passed
    unexpected   anything else, and the detail says which: a new failure, an unexpected pass, a
                 regression (the entry's own signature on a release outside carried_by), a mix,
                 or no case ran in this column (no record at all: the case vanished or crashed collection)
    not run      every case for the entry skipped itself (a TPU-only case on CPU, or a mechanism the
                 release does not have, e.g. no guard function in 2.6.x): shown with the skip reason
    no case      no case anywhere names the entry: the registry claims something nothing tests
    n/a          the entry's cases name another entry that holds this release, and were judged by it
Skipped cases are set aside when another case for the entry ran, and counted in the detail.
The registry predicts `reproduced` where `carried_by` contains the column's torch_xla and `fixed`
elsewhere. Every cell that differs from the prediction is a disagreement, except `not run`: a
case that decided it cannot measure this release is not evidence against the registry, and
counting it would make every CPU run of a TPU-only case fail. Those cells are listed apart.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence

from harness.errors import RegistryError
from harness.matrix.suite import SuiteRun
from harness.records.results import CaseRecord
from harness.registry import JudgementKind, KnownBug


class State(str, enum.Enum):
    REPRODUCED = "reproduced"
    FIXED = "fixed"
    UNEXPECTED = "unexpected"
    NOT_RUN = "not run"
    NO_CASE = "no case"
    # The entry's cases name another entry too, and that one holds this release: they were judged
    # by it (the bug-4 trace_pallas row is megascale-no-guard's on 2.4-2.5, the 2.6 entry's after).
    ELSEWHERE = "n/a"


@dataclasses.dataclass(frozen=True)
class CaseOutcome:
    nodeid: str
    kind: str  # xfailed | passed | skipped | failed | unexpected pass | regressed | xpassed
    reason: str


@dataclasses.dataclass(frozen=True)
class Observation:
    state: State
    detail: str  # "2 xfailed", "mixed: 1 xfailed, 1 failed", "no case ran", ...
    cases: tuple[CaseOutcome, ...] = ()


@dataclasses.dataclass(frozen=True)
class Cell:
    observed: Observation
    expected: State | None  # None when the column's torch_xla version is unknown

    @property
    def agrees(self) -> bool:
        return self.expected is not None and self.observed.state is self.expected

    @property
    def disagrees(self) -> bool:
        return not self.agrees and self.observed.state is not State.NOT_RUN


@dataclasses.dataclass
class ColumnResult:
    """One column's inputs to the table: its name, how it was made, and its suite run."""

    name: str  # the header: a release ("2.7.0") or the torch_xla version of a wheel build
    kind: str  # "release" | "wheels" | "env" | "results"
    run: SuiteRun
    declared: str | None = None  # the torch_xla version the column was asked for
    versions: dict[str, str] = dataclasses.field(default_factory=dict)  # torch/torch_xla/jax in its env
    env: str | None = None  # where the environment lives (None for results read back)
    env_note: str = ""  # "built in 323 s", "cached (built in 323 s)", "existing venv"

    @property
    def observed_version(self) -> str | None:
        counts = collections.Counter(r.torch_xla for r in self.run.records if r.torch_xla)
        return counts.most_common(1)[0][0] if counts else None

    @property
    def torch_xla(self) -> str | None:
        """What the registry is asked about: the version the children ran, else the declared one."""
        return self.observed_version or self.declared or self.versions.get("torch_xla")


@dataclasses.dataclass(frozen=True)
class Disagreement:
    column: str
    entry: str | None  # None for a column-wide problem or a case without a registry entry
    message: str


@dataclasses.dataclass
class Matrix:
    columns: list[ColumnResult]
    entries: list[KnownBug]
    cells: dict[tuple[str, str], Cell]  # (entry id, column name) -> cell
    disagreements: list[Disagreement]
    not_run: list[Disagreement] = dataclasses.field(default_factory=list)  # cells whose cases all skipped

    @property
    def agrees(self) -> bool:
        return not self.disagreements

    def cell(self, entry_id: str, column: str) -> Cell:
        return self.cells[(entry_id, column)]


def case_kind(record: CaseRecord) -> str:
    """The record's outcome, a failure split by the registry verdict the plugin stored with it."""
    if record.outcome != "failed" or record.late_fault:
        return record.outcome
    return {"unexpected-pass": "unexpected pass", "regressed": "regressed"}.get(record.registry_verdict or "", "failed")


def _named(record: CaseRecord) -> list[str]:
    """Every entry the case names; a record without that list names the one that judged it."""
    return record.known_bugs or ([record.known_bug] if record.known_bug else [])


def entries_of(record: CaseRecord) -> list[str]:
    """The entries a record counts for: the one that judged it, or, where no named entry holds
    the release (a pass, a skip), every entry the case names."""
    named = _named(record)
    if record.registry_verdict in (None, JudgementKind.PASSED.value):
        return named
    return [record.known_bug] if record.known_bug else named


def observe(entry: KnownBug, records: Sequence[CaseRecord]) -> Observation:
    if not records:
        return Observation(State.UNEXPECTED, "no case ran")
    cases = tuple(CaseOutcome(r.nodeid, case_kind(r), r.reason) for r in records)
    skipped = [c for c in cases if c.kind == "skipped"]
    if len(skipped) == len(cases):
        return Observation(State.NOT_RUN, f"{len(skipped)} skipped: {skipped[0].reason}", cases)
    counts = collections.Counter(c.kind for c in cases if c.kind != "skipped")
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    summary += f", +{len(skipped)} skipped" if skipped else ""
    if set(counts) == {"xfailed"}:
        return Observation(State.REPRODUCED, summary, cases)
    if set(counts) == {"passed"}:
        return Observation(State.FIXED, summary, cases)
    return Observation(State.UNEXPECTED, ("mixed: " if len(counts) > 1 else "") + summary, cases)


def expected_state(entry: KnownBug, version: str | None) -> State | None:
    if version is None:
        return None
    try:
        return State.REPRODUCED if entry.carried_by_release(version) else State.FIXED
    except RegistryError:
        return None


def build_matrix(registry: Mapping[str, KnownBug], columns: Sequence[ColumnResult]) -> Matrix:
    entries = list(registry.values())
    tested = {e for c in columns for r in c.run.records for e in _named(r) if e}
    cells: dict[tuple[str, str], Cell] = {}
    disagreements: list[Disagreement] = []
    not_run: list[Disagreement] = []
    for column in columns:
        disagreements += _column_problems(column, registry)
        by_entry: dict[str, list[CaseRecord]] = collections.defaultdict(list)
        judged_by: dict[str, set[str]] = collections.defaultdict(set)  # entry -> entries that judged its cases here
        for record in column.run.records:
            for entry_id in entries_of(record):
                by_entry[entry_id].append(record)
            for entry_id in set(record.known_bugs) - set(entries_of(record)):
                judged_by[entry_id].add(record.known_bug or "?")
        for entry in entries:
            expected = expected_state(entry, column.torch_xla)
            if entry.id in tested and not by_entry.get(entry.id) and judged_by.get(entry.id):
                observed = Observation(State.ELSEWHERE, f"judged as {', '.join(sorted(judged_by[entry.id]))}")
                expected = State.ELSEWHERE if expected is State.FIXED else expected
            elif entry.id in tested:
                observed = observe(entry, by_entry.get(entry.id, []))
            else:
                observed = Observation(State.NO_CASE, "no case names this entry")
            cell = Cell(observed, expected)
            cells[(entry.id, column.name)] = cell
            if cell.disagrees:
                disagreements.append(Disagreement(column.name, entry.id, _explain(entry, column, cell)))
            elif observed.state is State.NOT_RUN:
                not_run.append(Disagreement(column.name, entry.id, f"{entry.id} on {column.name}: {observed.detail}"))
    return Matrix(list(columns), entries, cells, disagreements, not_run)


def _explain(entry: KnownBug, column: ColumnResult, cell: Cell) -> str:
    observed = cell.observed
    if cell.expected is None:
        return (
            f"{entry.id} on {column.name}: no torch_xla version known for the column, so the registry cannot be applied"
        )
    if observed.state is State.NO_CASE:
        return (
            f"{entry.id}: no case is marked known_bug({entry.id!r}); the registry claims something nothing tests "
            f"(add a case, or remove the entry)"
        )
    said = (
        f"{entry.id} on torch_xla {column.torch_xla}: observed {observed.state.value} ({observed.detail}), "
        f"registry expects {cell.expected.value} (carried_by {entry.window})"
    )
    kinds = {c.kind for c in observed.cases}
    if "unexpected pass" in kinds or observed.state is State.FIXED:
        said += " -> the bug did not reproduce: if it is fixed there, update carried_by; if not, the case no longer detects it"
    elif "regressed" in kinds:
        said += " -> the entry's own signature on a release the registry calls fixed: a regression, or carried_by is too narrow"
    elif observed.state is State.REPRODUCED:
        said += " -> reproduced where the registry says fixed"
    return said


def _column_problems(column: ColumnResult, registry: Mapping[str, KnownBug]) -> Iterable[Disagreement]:
    if column.run.problem:
        yield Disagreement(column.name, None, f"{column.name}: {column.run.problem}")
    observed, declared = column.observed_version, column.declared
    if observed and declared and observed != declared:
        yield Disagreement(
            column.name, None, f"{column.name}: the cases ran torch_xla {observed}, but the column is {declared}"
        )
    for record in column.run.records:
        if record.known_bug and record.known_bug not in registry:
            yield Disagreement(
                column.name, None, f"{record.nodeid} names known_bug({record.known_bug!r}), which the registry lacks"
            )
        elif not record.known_bug and record.outcome in ("failed", "xpassed"):
            # Not a registry entry, but a release manager must not miss a case that breaks on a release.
            yield Disagreement(
                column.name,
                None,
                f"{record.nodeid} {record.outcome} on {column.name} (no registry entry): {record.reason[:200]}",
            )
