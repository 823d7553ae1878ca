"""Analytic oracle of a resharding: the collectives a change of partition spec needs follow from
the two specs (harness.oracles.metamorphic's measurement reads the partitioned module's).

On a 1-D mesh of every device, a [2n, 2n] tensor marked with spec A, plus one, marked with spec B,
times two, marked with spec B again (an unmarked output's sharding is XLA's choice); from A to B,
    the same spec                      no collective
    replicated -> split                no collective (each device slices what it holds)
    split -> replicated                an all-gather among all devices
    split on dim 0 -> split on dim 1   an all-to-all among all devices
and nothing else. The prediction names the kinds and the group; counts and bytes are XLA's choice.
"""

from __future__ import annotations

from typing import Any

import pytest

from cases.test_oracle_metamorphic import Measurer

pytestmark = pytest.mark.spmd

R, D0, D1 = [None, None], ["x", None], [None, "x"]
# (spec A, spec B, the collective kinds the change needs)
TRANSITIONS = [
    (D0, D0, set()),
    (R, D0, set()),
    (R, D1, set()),
    (D0, R, {"all-gather"}),
    (D1, R, {"all-gather"}),
    (D0, D1, {"all-to-all"}),
    (D1, D0, {"all-to-all"}),
]


def resharding(devices: int, before: list[Any], after: list[Any]) -> dict[str, Any]:
    return {
        "mesh": {"shape": [devices], "axes": ["x"], "devices": list(range(devices))},
        "inputs": [{"shape": [2 * devices, 2 * devices], "seed": 0, "spec": before}],
        "ops": [
            {"op": "scalar", "fn": "add", "x": 0, "c": 1.0},
            {"op": "mark", "x": 1, "spec": after},
            {"op": "scalar", "fn": "mul", "x": 2, "c": 2.0},
            {"op": "mark", "x": 3, "spec": after},  # pinned: an unmarked output's sharding is XLA's choice
        ],
        "outputs": [4],
    }


def unexpected(measured: dict[str, Any], kinds: set[str], devices: int) -> str | None:
    if measured.get("status") != "ok":
        return f"{measured.get('status')}: {str(measured.get('detail'))[:300]}"
    if measured["collectives"] is None:
        return "no partitioned module was read (XLA dumps are off in this child)"
    found = {c["kind"] for c in measured["collectives"]}
    everyone = "{{" + ",".join(map(str, range(devices))) + "}}"
    groups = {c["replica_groups"] for c in measured["collectives"]}
    if found != kinds or (kinds and groups != {everyone}):
        return f"the specs imply {sorted(kinds) or 'no collective'} among {everyone}; the module has {measured['collectives']}"
    return None


def failures(spmd: Any, fault: str | None = None) -> list[str]:
    measure, out = Measurer(spmd, fault), []
    for before, after, kinds in TRANSITIONS:
        wrong = unexpected(measure(resharding(spmd.backend.devices, before, after)), kinds, spmd.backend.devices)
        if wrong:
            out.append(f"{before} -> {after}: {wrong}")
    return out


def test_resharding_moves_what_its_specs_imply(spmd) -> None:
    found = failures(spmd)
    print(f"resharding: {len(TRANSITIONS)} transitions")
    assert not found, "\n".join(found)


def test_resharding_oracle_fails_when_a_mark_is_dropped(spmd) -> None:
    """harness.oracles.faults drop-marks: every mark_sharding after a process's first does
    nothing, so the asked-for resharding and its collective never happen."""
    found = failures(spmd, "drop-marks")
    assert found, "no transition noticed that torch_xla dropped the marks on intermediates"
    print(f"fault drop-marks: {len(found)} of {len(TRANSITIONS)} transitions differ; first: {found[0][:500]}")
