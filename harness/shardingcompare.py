"""The one sharding comparison: two sets of recorded shardings, tensor by tensor, by canonical text
(harness.sharding.canonical_text: an iota and its explicit device list compare equal), beside the
sharding model as harness.costs.compare is beside the cost signature.

Every reference a case's shardings are held to uses it: the committed baseline
(harness.judges.baseline), a base build's run (harness.judges.basecompare) and consecutive
release columns (harness.matrix.shardingchanges), and the hosts of one GKE run (group, the N-way
form: harness.gke.aggregate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from harness.sharding import canonical_text
from harness.tiles import grids_side_by_side, is_multi_axis


@dataclasses.dataclass(frozen=True)
class ShardingChange:
    tensor: str
    before: str | None  # None: the tensor is new
    after: str | None  # None: the tensor disappeared
    reference: str = dataclasses.field(default="baseline", compare=False)  # what `before` was read from

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.tensor}: new, {shown(self.after)} (not in the {self.reference})"
        if self.after is None:
            return f"{self.tensor}: {shown(self.before)} -> no longer recorded"
        return f"{self.tensor}: {shown(self.before)} -> {shown(self.after)}"

    @property
    def moved(self) -> bool:
        """Recorded on both sides, sharded differently (not a tensor new or gone)."""
        return self.before is not None and self.after is not None

    def grids(self, labels: tuple[str, str]) -> list[str]:
        """Both layouts as device grids (harness.tiles) where the one-line texts say little at a
        glance (a partially replicated or multi-axis sharding); else nothing."""
        if self.before is None or self.after is None or not (is_multi_axis(self.before) or is_multi_axis(self.after)):
            return []
        return grids_side_by_side(self.before, self.after, labels)


def shown(spec: str | None) -> str:
    return spec or "''"  # torch_xla's text for "no sharding annotation"


def canonical(shardings: Mapping[str, str]) -> dict[str, str]:
    return {name: canonical_text(spec) for name, spec in shardings.items()}


def compare(before: Mapping[str, str], after: Mapping[str, str], reference: str = "baseline") -> list[ShardingChange]:
    """What differs from `before` to `after`, both compared in canonical form: the tensors of
    `before` that moved or are no longer recorded, then the new ones, each group by name."""
    old, new = canonical(before), canonical(after)
    changes = [
        ShardingChange(name, old[name], new.get(name), reference) for name in sorted(old) if old[name] != new.get(name)
    ]
    return changes + [ShardingChange(name, None, new[name], reference) for name in sorted(set(new) - set(old))]


def group(observations: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The N-way form, for the hosts of one run: (text first seen, who saw it) per sharding, by
    canonical text, the most common first; a tie keeps the order they were seen in."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for who, text in observations:
        groups.setdefault(canonical_text(text), (text, []))[1].append(who)
    return sorted(groups.values(), key=lambda found: -len(found[1]))
