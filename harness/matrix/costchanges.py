"""What costs more or less between releases: per case and training loop, the items of the cost
signature (harness.costs) that differ between consecutive columns.

Read from the records' `costs` of passing cases, for loops measured in both columns (a case that
stops mid-loop on a release carrying a bug records part of one: the registry rows tell that story). A case
whose loop was judged by no_cost_check (self-tests that record regressions on purpose) is left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from harness import costs
from harness.matrix.table import ColumnResult

# Self-test cases record cost regressions on purpose; their "changes" would be noise.
SELFTEST_FAMILIES = ("costs",)


@dataclasses.dataclass(frozen=True)
class CostMove:
    case: str
    item: str
    detail: str


@dataclasses.dataclass(frozen=True)
class CostStep:
    before: str
    after: str
    moved: tuple[CostMove, ...]
    compared: int  # loops measured in both columns


def _signatures(column: ColumnResult) -> dict[tuple[str, str], dict[str, Any]]:
    # Only passing cases: a case that fails mid-loop (a release carrying its bug) records part of one.
    return {
        (r.nodeid, loop): sig
        for r in column.run.records
        if r.outcome == "passed" and r.family not in SELFTEST_FAMILIES
        for loop, sig in r.costs.items()
    }


def consecutive_changes(columns: Sequence[ColumnResult]) -> list[CostStep]:
    steps = []
    for first, second in zip(columns, columns[1:]):
        a, b = _signatures(first), _signatures(second)
        both = sorted(a.keys() & b.keys())
        moved = tuple(
            CostMove(case, change.item, change.detail)
            for case, loop in both
            for change in costs.compare(a[(case, loop)], b[(case, loop)], loop)
        )
        steps.append(CostStep(first.name, second.name, moved, len(both)))
    return steps


def to_markdown(columns: Sequence[ColumnResult]) -> list[str]:
    lines = [
        "## Cost changes between consecutive columns",
        "",
        "Training loops measured by the same case in both columns (harness.costs: per step compilations and "
        "executions, per step graph the collectives of XLA's partitioned module with the bytes a device moves "
        "under the ring model, per device bytes of parameters, gradients and optimizer state) whose signature "
        "differs.",
    ]
    for step in consecutive_changes(columns):
        lines += [
            "",
            f"### {step.before} -> {step.after}: {len(step.moved)} item(s) changed in "
            f"{step.compared} loop(s) measured in both",
            "",
        ]
        if step.moved:
            lines += ["| case | item | change |", "|---|---|---|"]
            lines += [f"| `{m.case}` | {m.item} | {m.detail.replace('|', chr(92) + '|')} |" for m in step.moved]
    first = _signatures(columns[0]) if columns else {}
    if first:
        lines += [
            "",
            f"Signatures in {columns[0].name} (the first column):",
            "",
            "| case | loop | signature |",
            "|---|---|---|",
        ]
        lines += [f"| `{case}` | {loop} | {costs.summary(sig)} |" for (case, loop), sig in sorted(first.items())]
    return lines
