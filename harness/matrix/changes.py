"""The one loop behind the matrix's change tables: what differs between each pair of consecutive
columns, per case, by the comparison of its kind (harness.judges.shardingcompare for shardings,
harness.costs.compare for cost signatures). harness.matrix.shardingchanges and
harness.matrix.costchanges say what each kind reads from a column and how it is shown."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from harness.matrix.table import ColumnResult

C = TypeVar("C")  # a kind's change: ShardingChange, CostChange
K = TypeVar("K", str, tuple[str, str])  # what is compared: a case, a (case, training loop)
V = TypeVar("V")  # what a column recorded for it


@dataclasses.dataclass(frozen=True)
class CaseChange(Generic[C]):
    case: str
    change: C


@dataclasses.dataclass(frozen=True)
class ColumnStep(Generic[C]):
    """From one column to the next."""

    before: str
    after: str
    moved: tuple[CaseChange[C], ...]  # the changes the table lists
    compared: int  # what both columns recorded (cases, or loops)
    one_sided: int  # changes counted, not listed (a tensor recorded in one column only)


def consecutive_changes(
    columns: Sequence[ColumnResult],
    read: Callable[[ColumnResult], dict[K, V]],
    compare: Callable[[K, V, V], list[C]],
    case_of: Callable[[K], str],
    listed: Callable[[C], bool] = lambda change: True,
) -> list[ColumnStep[C]]:
    steps = []
    for first, second in zip(columns, columns[1:]):
        a, b = read(first), read(second)
        both = sorted(a.keys() & b.keys())
        found = [CaseChange(case_of(key), change) for key in both for change in compare(key, a[key], b[key])]
        moved = tuple(c for c in found if listed(c.change))
        steps.append(ColumnStep(first.name, second.name, moved, len(both), len(found) - len(moved)))
    return steps
