"""Cost baselines: what every training step of every case cost, kept next to the sharding baseline.

`baselines/costs/<backend>-<devices>.json` holds, per case (results.case_id, the sharding baseline's keys)
and training loop (`train`), the comparable part of its cost signature (harness.costs.comparable:
per step compiles and executions; per step graph its collectives by kind and replica groups with
the bytes a device moves; per device the bytes of parameters, gradients and optimizer state), and
the torch_xla version it was taken on.

Judging (harness.costcheck, after the registry and the sharding baseline) follows the sharding
baseline's rule: on the baseline's release line a change fails the case with one line per item,
`step0: all-gather 3 -> 5 (+96 KiB per device)`; elsewhere it is reported. A case the file lacks is
listed, not failed. `--spmd-update-costs` rewrites the entries of the cases that ran and passed
(harness.baselinefile: locked, merged, atomic; refused across release lines).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import costs
from harness.baseline import checked_header, on_release_line
from harness.errors import BaselineError
from harness.schema import shown

COST_BASELINE_DIR = Path("baselines") / "costs"
REWRITE = "fix it, or delete it and write it again with --spmd-update-costs"


class CostBaselineError(BaselineError):
    """A cost baseline file is malformed or was taken on another backend or device count."""


def default_path(root: Path, backend: str, devices: int) -> Path:
    return root / COST_BASELINE_DIR / f"{backend}-{devices}.json"


@dataclasses.dataclass
class CostBaseline:
    path: Path
    backend: str
    devices: int
    torch_xla: str | None
    cases: dict[str, dict[str, dict[str, Any]]]  # case -> loop label -> comparable signature

    @classmethod
    def load(cls, path: Path, backend: str, devices: int) -> CostBaseline | None:
        """The baseline at path, or None where there is none yet; CostBaselineError for a file
        that is not one, or one of another backend or device count (whose costs it cannot predict)."""
        if not path.is_file():
            return None
        where = f"cost baseline {path}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CostBaselineError(f"{where} cannot be read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise CostBaselineError(f"{where} is not valid JSON ({exc}); {REWRITE}") from None
        base = cls(path, *_checked(data, where))
        if (base.backend, base.devices) != (backend, devices):
            raise CostBaselineError(
                f"{where} was taken on backend {base.backend!r} with {base.devices} devices; this run uses "
                f"backend {backend} with {devices} devices. Point --spmd-costs-baseline at a baseline of this backend "
                f"and device count (default: {COST_BASELINE_DIR}/{backend}-{devices}.json), or write one: "
                "--spmd-update-costs --spmd-costs-baseline=NEW.json"
            )
        return base

    @classmethod
    def empty(cls, path: Path, backend: str, devices: int) -> CostBaseline:
        return cls(path, backend, devices, None, {})

    def on_release_line(self, version: str | None) -> bool:
        """Same major.minor as the version the baseline was taken on (nightlies and +git builds too)."""
        return on_release_line(version, self.torch_xla)

    def compare(self, case: str, observed: Mapping[str, Mapping[str, Any]]) -> list[costs.CostChange] | None:
        """Per-item changes of every loop of the case; None when the baseline has no entry for it."""
        expected = self.cases.get(case)
        if expected is None:
            return None
        changes = []
        for label in sorted(set(expected) | set(observed)):
            if label not in observed:
                changes.append(costs.CostChange(f"{label}", "training loop no longer measured"))
            elif label not in expected:
                changes.append(costs.CostChange(f"{label}", "training loop not in the baseline"))
            else:
                changes += costs.compare(expected[label], costs.comparable(observed[label]), label)
        return changes

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


def _checked(data: Any, where: str) -> tuple[str, int, str | None, dict[str, dict[str, dict[str, Any]]]]:
    backend, devices, version, cases = checked_header(data, where, CostBaselineError, REWRITE, "costs")
    if not isinstance(cases, dict):
        raise CostBaselineError(f"{where}: cases must map case node ids to their training loops; got {shown(cases)}")
    for case, loops in cases.items():
        if not isinstance(loops, dict):
            raise CostBaselineError(f"{where}: case {case!r} must map loop labels to signatures; got {shown(loops)}")
        for label, signature in loops.items():
            try:
                costs.check_signature(signature, f"{where}: case {case!r}, loop {label!r}")
            except costs.CostReadError as exc:
                raise CostBaselineError(f"{exc}; {REWRITE}") from None
    return backend, devices, version, {case: dict(loops) for case, loops in cases.items()}
