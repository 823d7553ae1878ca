"""What costs more or less between releases: per case and training loop, the items of the cost
signature (harness.costs) that differ between consecutive columns.

Read from the records' `costs` of passing cases, for loops measured in both columns (a case that
stops mid-loop on a release carrying a bug records part of one: the registry rows tell that story). A case
whose loop was judged by no_cost_check (self-tests that record regressions on purpose) is left out.
Then, per loop and column, the memory it was seen to hold: each step graph's temp and peak bytes
on one device (XLA's buffer assignment) and the XLA tensors alive after the last step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import costs
from harness.matrix import changes
from harness.matrix.changes import ColumnStep
from harness.matrix.table import ColumnResult

# Self-test cases record cost regressions on purpose; their "changes" would be noise.
SELFTEST_FAMILIES = ("costs",)


def _signatures(column: ColumnResult) -> dict[tuple[str, str], dict[str, Any]]:
    # Only passing cases: a case that fails mid-loop (a release carrying its bug) records part of one.
    return {
        (r.nodeid, loop): sig
        for r in column.run.records
        if r.outcome == "passed" and r.family not in SELFTEST_FAMILIES
        for loop, sig in r.costs.items()
    }


def consecutive_changes(columns: Sequence[ColumnResult]) -> list[ColumnStep[costs.CostChange]]:
    return changes.consecutive_changes(
        columns,
        _signatures,
        lambda key, before, after: costs.compare(before, after, key[1]),
        case_of=lambda key: key[0],
    )


def to_markdown(columns: Sequence[ColumnResult]) -> list[str]:
    lines = [
        "## Cost changes between consecutive columns",
        "",
        "Training loops measured by the same case in both columns (harness.costs: per step compilations and "
        "executions, per step graph the collectives of XLA's partitioned module with the bytes a device moves "
        "under the ring model, per step graph its memory from XLA's buffer assignment, per step the XLA tensors "
        "alive after it, per device bytes of parameters, gradients and optimizer state) whose signature differs.",
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
            lines += [
                f"| `{m.case}` | {m.change.item} | {m.change.detail.replace('|', chr(92) + '|')} |" for m in step.moved
            ]
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
    return lines + memory_table(columns)


def memory_cell(signature: dict[str, Any]) -> str | None:
    """'step0 temp 113.1 KiB, peak 140 KiB; live after step2: 34 tensors (20.2 KiB)'; None when
    the loop recorded neither graph memory nor live XLA tensors (a host-only loop, no step run)."""
    parts = [
        f"{name} " + ", ".join(f"{k} {costs.kib(g['memory'][k])}" for k in ("temp", "peak") if k in g["memory"])
        for name, g in sorted(signature.get("graphs", {}).items())
        if g.get("memory")
    ]
    steps = signature.get("steps", [])
    live = steps[-1].get("live") if steps else None
    if live and "tensors" in live:
        parts.append(
            f"live after step{len(steps) - 1}: {live['tensors']} tensors ({costs.kib(live.get('bytes_per_device', 0))})"
        )
    parts += costs.held_cell(signature)
    return "; ".join(parts) or None


def memory_table(columns: Sequence[ColumnResult]) -> list[str]:
    """Loop x column: what each loop's graphs and live tensors held on one device there."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for column in columns:
        for key, signature in _signatures(column).items():
            cell = memory_cell(signature)
            if cell:
                cells.setdefault(key, {})[column.name] = cell
    if not cells:
        return []
    names = [c.name for c in columns]
    lines = [
        "",
        "### Memory per release",
        "",
        "Per device, seen rather than derived: each step graph's temp and peak bytes (XLA's buffer assignment of "
        "the partitioned module) and the XLA tensors alive after the last step with their bytes; "
        "`footprint`: every XLA tensor Python holds after the last step, those made before the loop too; "
        "`step peak`: the step program's arguments, outputs and temp (XLA's buffer assignment) and the other live buffers; `native`: heap and resident-set growth per "
        "step after the warm-up (the least of the judged steps). "
        "`-`: the loop did not pass there (a release carrying its bug) or recorded no memory.",
        "",
        "| case | loop | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for (case, loop), row in sorted(cells.items()):
        shown = case.replace("|", "\\|")  # a nodeid's parametrize id may hold one
        lines.append(f"| `{shown}` | {loop} | " + " | ".join(row.get(n, "-") for n in names) + " |")
    return lines
