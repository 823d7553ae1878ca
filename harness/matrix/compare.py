"""Bisect help: which registry entries changed verdict between a good and a bad column.

Only observations are compared (no registry prediction): "reproduced on good, unexpected on bad"
is exactly what a maintainer bisecting nightlies wants named, whatever carried_by says.
An entry that did not run on one side (a partial run against a full one) has no verdict there to
have changed: it is listed as not run, and does not fail the comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from harness.matrix.table import ColumnResult, Observation, State, entries_of, observe
from harness.registry import KnownBug


@dataclasses.dataclass(frozen=True)
class VerdictChange:
    entry: str
    good: Observation
    bad: Observation
    cases: tuple[tuple[str, str, str], ...]  # (nodeid, kind on good, kind on bad) for cases that changed


@dataclasses.dataclass(frozen=True)
class NotRun:
    entry: str
    good: Observation
    bad: Observation


def compare(registry: Mapping[str, KnownBug], good: ColumnResult, bad: ColumnResult) -> list[VerdictChange]:
    return compare_all(registry, good, bad)[0]


def compare_all(
    registry: Mapping[str, KnownBug], good: ColumnResult, bad: ColumnResult
) -> tuple[list[VerdictChange], list[NotRun]]:
    """The entries whose verdict changed, and those measured on one side only."""
    changes = []
    not_run = []
    ids = list(registry) + sorted(
        {r.known_bug for c in (good, bad) for r in c.run.records if r.known_bug and r.known_bug not in registry}
    )
    for entry_id in ids:
        entry = registry.get(entry_id)
        before, after = _observe(entry, entry_id, good), _observe(entry, entry_id, bad)
        if before.state is after.state and before.detail == after.detail:
            continue
        if not _measured(before) or not _measured(after):
            not_run.append(NotRun(entry_id, before, after))
            continue
        kinds_before = {c.nodeid: c.kind for c in before.cases}
        kinds_after = {c.nodeid: c.kind for c in after.cases}
        cases = tuple(
            (n, kinds_before.get(n, "absent"), kinds_after.get(n, "absent"))
            for n in sorted(kinds_before.keys() | kinds_after.keys())
            if kinds_before.get(n) != kinds_after.get(n)
        )
        changes.append(VerdictChange(entry_id, before, after, cases))
    return changes, not_run


def _measured(observation: Observation) -> bool:
    """Some case of the entry ran on that side (none recorded, or each skipped itself: not measured)."""
    return bool(observation.cases) and observation.state not in (State.NOT_RUN, State.NO_CASE)


def _observe(entry: KnownBug | None, entry_id: str, column: ColumnResult) -> Observation:
    records = [r for r in column.run.records if entry_id in entries_of(r)]
    if entry is None:  # a case names an id the registry lacks: still worth a line
        kinds = sorted({r.outcome for r in records})
        return Observation(State.UNEXPECTED, ", ".join(kinds) or "no case ran")
    return observe(entry, records)


def to_text(changes: list[VerdictChange], good: ColumnResult, bad: ColumnResult, not_run: Sequence[NotRun] = ()) -> str:
    head = f"good: {good.name} (torch_xla {good.torch_xla or '?'}), bad: {bad.name} (torch_xla {bad.torch_xla or '?'})"
    tail = _not_run_text(not_run)
    if not changes:
        return f"{head}\nNo registry entry changed verdict.\n{tail}"
    lines = [head, f"{len(changes)} entr{'y' if len(changes) == 1 else 'ies'} changed verdict:", ""]
    for change in changes:
        lines.append(
            f"- {change.entry}: {change.good.state.value} ({change.good.detail}) -> "
            f"{change.bad.state.value} ({change.bad.detail})"
        )
        lines += [f"    {nodeid}: {before} -> {after}" for nodeid, before, after in change.cases]
    return "\n".join(lines) + "\n" + tail


def _not_run_text(not_run: Sequence[NotRun]) -> str:
    if not not_run:
        return ""
    lines = ["", f"{len(not_run)} entr{'y' if len(not_run) == 1 else 'ies'} not run on one side (not compared):"]
    lines += [
        f"- {n.entry}: {n.good.state.value} ({n.good.detail}) -> {n.bad.state.value} ({n.bad.detail})" for n in not_run
    ]
    return "\n".join(lines) + "\n"
