"""What moves between releases: per case, the tensors whose sharding differs between consecutive columns.

Read from the records' `shardings` (what each case recorded with `ctx.record_sharding`),
compared in canonical form (harness.sharding.canonical_text), for tensors recorded in both columns. A
tensor recorded in one column only (a case that stopped earlier on a release carrying a bug) is
counted, not listed: that is a different story, told by the registry rows above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from harness.matrix.table import ColumnResult
from harness.sharding import canonical_text


@dataclasses.dataclass(frozen=True)
class ShardingMove:
    case: str
    tensor: str
    before: str
    after: str


@dataclasses.dataclass(frozen=True)
class ShardingStep:
    """From one column to the next."""

    before: str
    after: str
    moved: tuple[ShardingMove, ...]
    one_sided: int  # tensors recorded in only one of the two columns (cases both ran)


def _shardings(column: ColumnResult) -> dict[str, dict[str, str]]:
    # A case whose tensors vary by design (no_sharding_baseline: Hypothesis draws) would only show noise.
    return {
        r.nodeid: {t: canonical_text(s) for t, s in r.shardings.items()}
        for r in column.run.records
        if r.shardings and r.sharding_baseline
    }


def consecutive_changes(columns: Sequence[ColumnResult]) -> list[ShardingStep]:
    steps = []
    for first, second in zip(columns, columns[1:]):
        a, b = _shardings(first), _shardings(second)
        moved, one_sided = [], 0
        for case in sorted(a.keys() & b.keys()):
            one_sided += len(a[case].keys() ^ b[case].keys())
            for tensor in sorted(a[case].keys() & b[case].keys()):
                if a[case][tensor] != b[case][tensor]:
                    moved.append(ShardingMove(case, tensor, a[case][tensor], b[case][tensor]))
        steps.append(ShardingStep(first.name, second.name, tuple(moved), one_sided))
    return steps


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
                f"| `{m.case}` | `{m.tensor}` | `{m.before or chr(39) * 2}` | `{m.after or chr(39) * 2}` |"
                for m in step.moved
            ]
    return lines
