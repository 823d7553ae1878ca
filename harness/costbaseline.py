"""Cost baselines: what every training step of every case cost, kept next to the sharding baseline.

`baselines/costs/<backend>-<devices>.json` holds, per case (results.case_id, the sharding baseline's keys)
and training loop (`train`), the comparable part of its cost signature (harness.costs.comparable:
per step compiles and executions; per step graph its collectives by kind and replica groups with
the bytes a device moves; per device the bytes of parameters, gradients and optimizer state), and
the torch_xla version it was taken on.

Judging (harness.judges.costcheck, after the registry and the sharding baseline) follows the sharding
baseline's rule: on the baseline's release line a change fails the case with one line per item,
`step0: all-gather 3 -> 5 (+96 KiB per device)`; elsewhere it is reported. A case the file lacks is
listed, not failed. `--spmd-update-costs` rewrites the entries of the cases that ran and passed
(harness.baselinefile: locked, merged, atomic; refused across release lines).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import costs
from harness.baselinefile import BaselineFile
from harness.errors import BaselineError
from harness.schema import shown

COST_BASELINE_DIR = Path("baselines") / "costs"


class CostBaselineError(BaselineError):
    """A cost baseline file is malformed or was taken on another backend or device count."""


class CostBaseline(BaselineFile[dict[str, dict[str, Any]]]):
    """The cost baseline: per case, each training loop's comparable signature, by loop label."""

    KIND = "cost"
    PREDICTS = "costs"
    DIR = COST_BASELINE_DIR
    OPTION = "spmd_costs_baseline"
    FLAG = "--spmd-update-costs"
    ENTRIES = "their training loops"
    ERROR = CostBaselineError

    @classmethod
    def checked_entry(cls, entry: Any, where: str) -> dict[str, dict[str, Any]]:
        if not isinstance(entry, dict):
            raise CostBaselineError(f"{where} must map loop labels to signatures; got {shown(entry)}")
        for label, signature in entry.items():
            try:
                costs.check_signature(signature, f"{where}, loop {label!r}")
            except costs.CostReadError as exc:
                raise CostBaselineError(f"{exc}; {cls.rewrite_hint()}") from None
        return dict(entry)

    def compare(self, case: str, observed: Mapping[str, Mapping[str, Any]]) -> list[costs.CostChange] | None:
        """Per-item changes of every loop of the case; None when the baseline has no entry for it."""
        expected = self.cases.get(case)
        return None if expected is None else costs.compare_loops(expected, observed)

    def update(
        self, case: str, observed: Mapping[str, Mapping[str, Any]], torch_xla: str | None
    ) -> list[costs.CostChange]:
        before = self.cases.get(case, {})
        after = {label: costs.comparable(sig) for label, sig in observed.items()}
        self.cases[case] = after
        self.torch_xla = torch_xla or self.torch_xla
        changes = []
        for label in sorted(set(before) | set(after)):
            if label not in before:
                changes.append(costs.CostChange(label, "new, " + costs.summary(after[label])))
            elif label not in after:
                changes.append(costs.CostChange(label, "no longer measured"))
            else:
                changes += costs.compare(before[label], after[label], label)
        return changes

    def render(self) -> str:
        """The file's text (harness.baselinefile.rewrite writes it), sorted: a reviewable diff in a pull request."""
        data = {
            "backend": self.backend,
            "devices": self.devices,
            "torch_xla": self.torch_xla,
            "cases": {case: dict(sorted(loops.items())) for case, loops in sorted(self.cases.items())},
        }
        return _compact(data) + "\n"


def _compact(value: Any, depth: int = 0) -> str:
    """JSON with each innermost object (a step, a collective, the memory) on one line, and any
    object that fits on a line of ~130 characters (a step with what was alive after it)."""
    flat = all(
        not isinstance(v, (dict, list)) or (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))
        for v in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
    )
    if not isinstance(value, (dict, list)) or flat or len(json.dumps(value)) + depth <= 130:
        return json.dumps(value)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict):
        body = ",\n".join(f"{inner}{json.dumps(k)}: {_compact(v, depth + 1)}" for k, v in value.items())
        return "{\n" + body + "\n" + pad + "}"
    return "[\n" + ",\n".join(inner + _compact(v, depth + 1) for v in value) + "\n" + pad + "]"
