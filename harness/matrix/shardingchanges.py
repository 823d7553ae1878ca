"""What moves between releases: per case, the tensors whose sharding differs between consecutive columns.

Read from the records' `shardings` (what each case recorded with `ctx.record_sharding`),
compared by the one sharding comparison (harness.judges.shardingcompare), for tensors recorded in both columns. A
tensor recorded in one column only (a case that stopped earlier on a release carrying a bug) is
counted, not listed: that is a different story, told by the registry rows above.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.judges import shardingcompare
from harness.judges.shardingcompare import ShardingChange, shown
from harness.matrix import changes
from harness.matrix.changes import ColumnStep
from harness.matrix.table import ColumnResult


def _shardings(column: ColumnResult) -> dict[str, dict[str, str]]:
    # A case whose tensors vary by design (no_sharding_baseline: Hypothesis draws) would only show noise.
    return {r.nodeid: dict(r.shardings) for r in column.run.records if r.shardings and r.sharding_baseline}


def consecutive_changes(columns: Sequence[ColumnResult]) -> list[ColumnStep[ShardingChange]]:
    return changes.consecutive_changes(
        columns,
        _shardings,
        lambda case, before, after: shardingcompare.compare(before, after),
        case_of=lambda case: case,
        listed=lambda change: change.moved,
    )


def to_markdown(columns: Sequence[ColumnResult]) -> list[str]:
    lines = [
        "## Sharding changes between consecutive columns",
        "",
        "Tensors recorded by the same case in both columns whose sharding differs (canonical form; "
        "iota and explicit device lists compare equal).",
    ]
    for step in consecutive_changes(columns):
        lines += [
            "",
            f"### {step.before} -> {step.after}: {len(step.moved)} tensor(s) moved"
            + (f"; {step.one_sided} recorded in one column only" if step.one_sided else ""),
            "",
        ]
        if step.moved:
            lines += ["| case | tensor | before | after |", "|---|---|---|---|"]
            lines += [
                f"| `{m.case}` | `{m.change.tensor}` | `{shown(m.change.before)}` | `{shown(m.change.after)}` |"
                for m in step.moved
            ]
    return lines
