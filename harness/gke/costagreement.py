"""Cross-host check of cost signatures: every host runs the same SPMD program, so the same case
must compile, execute and communicate the same on each (harness.costs). A host whose training
step gathers more, or compiles again, is a finding of its own even when every host passed
against the baseline (a TPU host has no cost baseline; a --local host's may be missing).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from harness import costs
from harness.gke.hostreport import HostReport


@dataclasses.dataclass
class CostDisagreement:
    """One training loop of one case whose cost signature differed between hosts."""

    nodeid: str
    loop: str
    hosts: list[list[str]]  # hosts per variant, most common first
    differences: list[list[str]]  # per variant after the first: its lines against the first

    def describe(self) -> str:
        parts = [
            f"{', '.join(hosts)} against {', '.join(self.hosts[0])}: {'; '.join(lines)}"
            for hosts, lines in zip(self.hosts[1:], self.differences)
        ]
        return f"{self.nodeid}: cost signature of {self.loop!r} differs across hosts: " + " | ".join(parts)


def compare_costs(reports: list[HostReport]) -> list[CostDisagreement]:
    """Same case and loop, different comparable signature on two hosts -> a CostDisagreement.
    Only hosts on which the case passed are compared (a case that failed on one host is a failure
    of its own, and its loop may have stopped part way)."""
    seen: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for report in reports:
        for record in report.records:
            if record.outcome != "passed":  # stopped mid-loop: part of a signature, a failure of its own
                continue
            for loop, signature in record.costs.items():
                seen.setdefault((record.nodeid, loop), []).append((report.label, signature))
    out = []
    for (nodeid, loop), observations in sorted(seen.items()):
        groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
        for host, signature in observations:
            key = json.dumps(costs.comparable(signature), sort_keys=True)
            groups.setdefault(key, (signature, []))[1].append(host)
        if len(groups) < 2:
            continue
        ordered = sorted(groups.values(), key=lambda g: -len(g[1]))
        first = costs.comparable(ordered[0][0])
        differences = [
            [str(c) for c in costs.compare(first, costs.comparable(sig), loop)] or ["differs"] for sig, _ in ordered[1:]
        ]
        out.append(CostDisagreement(nodeid, loop, [hosts for _, hosts in ordered], differences))
    return out


def baseline_changes(reports: list[HostReport]) -> list[str]:
    """What each host's pytest reported against its cost baseline (passing cases; failing ones are
    listed with the failures)."""
    return [
        f"{r.label}: {c.nodeid}: {change}"
        for r in reports
        for c in r.records
        if c.outcome != "failed"
        for change in c.cost_changes
    ]
