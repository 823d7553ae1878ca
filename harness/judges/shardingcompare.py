"""The one sharding comparison: two sets of recorded shardings, tensor by tensor, by canonical text
(harness.sharding.canonical_text: an iota and its explicit device list compare equal), beside the
sharding model as harness.costs.compare is beside the cost signature.

Every reference a case's shardings are held to uses it: the committed baseline
(harness.judges.baseline), a base build's run (harness.judges.basecompare) and consecutive
release columns (harness.matrix.shardingchanges), and the hosts of one GKE run (group, the N-way
form: harness.gke.aggregate).
"""

from __future__ import annotations

import collections
import dataclasses
import re
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


# A step graph's parameters as the cost meter records them: `step0:parameter(7)`. XLA numbers them in
# the order the graph takes them, so a graph that gains or loses one (a step split in four) renumbers
# the rest: they are compared as each graph's multiset of shardings, never number against number.
GRAPH_PARAMETER = re.compile(r"(?P<graph>.+):parameter\(\d+\)")


@dataclasses.dataclass(frozen=True)
class GraphParametersChange(ShardingChange):
    """A step graph's parameters whose shardings differ as a multiset: `before` lists the shardings
    it lost (None: none lost, only gained, not a drift), `after` those it gained."""

    counts: tuple[int, int] = (0, 0)  # parameters before, after

    def __str__(self) -> str:
        parts = [f"-{self.before}"] if self.before else []
        parts += [f"+{self.after}"] if self.after else []
        return (
            f"{self.tensor}: graph parameters {self.counts[0]} -> {self.counts[1]} (matched by sharding, "
            f"whatever their numbers): {', '.join(parts)}"
        )

    def grids(self, labels: tuple[str, str]) -> list[str]:
        return []


def compare_by_role(
    before: Mapping[str, str], after: Mapping[str, str], reference: str = "baseline"
) -> list[ShardingChange]:
    """compare(), with each step graph's numbered parameters matched by their shardings (one line per
    graph whose multiset differs), the named tensors by name."""
    named_a, graphs_a = _split(canonical(before))
    named_b, graphs_b = _split(canonical(after))
    changes = compare(named_a, named_b, reference)
    for graph in sorted(set(graphs_a) | set(graphs_b)):
        was, now = graphs_a.get(graph, collections.Counter()), graphs_b.get(graph, collections.Counter())
        if was == now:
            continue
        lost, gained = was - now, now - was
        changes.append(
            GraphParametersChange(
                graph,
                ", -".join(f"{n} x {spec}" for spec, n in sorted(lost.items())) or None,
                ", +".join(f"{n} x {spec}" for spec, n in sorted(gained.items())) or None,
                reference,
                (sum(was.values()), sum(now.values())),
            )
        )
    return changes


def _split(shardings: Mapping[str, str]) -> tuple[dict[str, str], dict[str, collections.Counter[str]]]:
    named: dict[str, str] = {}
    graphs: dict[str, collections.Counter[str]] = {}
    for name, spec in shardings.items():
        match = GRAPH_PARAMETER.fullmatch(name)
        if match:
            graphs.setdefault(match["graph"], collections.Counter())[spec] += 1
        else:
            named[name] = spec
    return named, graphs


def group(observations: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The N-way form, for the hosts of one run: (text first seen, who saw it) per sharding, by
    canonical text, the most common first; a tie keeps the order they were seen in."""
    groups: dict[str, tuple[str, list[str]]] = {}
    for who, text in observations:
        groups.setdefault(canonical_text(text), (text, []))[1].append(who)
    return sorted(groups.values(), key=lambda found: -len(found[1]))
