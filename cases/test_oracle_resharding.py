"""Analytic oracle of a resharding: the collectives a change of partition spec needs follow from
the two specs (harness.oracles.metamorphic's measurement reads the partitioned module's).

On a 1-D mesh of every device, a [2n, 2n] tensor marked with spec A, plus one, marked with spec B,
times two, marked with spec B again (an unmarked output's sharding is XLA's choice); from A to B,
    the same spec                      no collective
    replicated -> split                no collective (each device slices what it holds)
    split -> replicated                an all-gather among all devices
    split on dim 0 -> split on dim 1   an all-to-all among all devices
and nothing else. The prediction names the kinds and the group; counts and bytes are XLA's choice.
On a (2, n/2) mesh, adding, removing or moving one axis needs that axis's collective among its
groups alone (TRANSITIONS_2D; which devices talk, not the order XLA lists them in).

Nightly tier: reshardings drawn on 1-3-D meshes (permuted device orders, several axes on one dim)
until --spmd-fuzz-budget seconds are spent, for the three changes whose collectives follow from
any spec A: A -> A and replicated -> A need none, A -> replicated needs all-gathers and nothing
else (its groups are XLA's choice there: which axes it gathers over first).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest

from cases.test_oracle_metamorphic import Measurer
from harness.oracles import search

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


def resharding(devices: int, before: list[Any], after: list[Any], mesh: dict[str, Any] | None = None) -> dict[str, Any]:
    """The program of a change from spec `before` to `after`, on `mesh` (default: 1-D, every device)."""
    return {
        "mesh": mesh or {"shape": [devices], "axes": ["x"], "devices": list(range(devices))},
        "inputs": [{"shape": [2 * devices, 2 * devices], "seed": 0, "spec": before}],
        "ops": [
            {"op": "scalar", "fn": "add", "x": 0, "c": 1.0},
            {"op": "mark", "x": 1, "spec": after},
            {"op": "scalar", "fn": "mul", "x": 2, "c": 2.0},
            {"op": "mark", "x": 3, "spec": after},  # pinned: an unmarked output's sharding is XLA's choice
        ],
        "outputs": [4],
    }


def unexpected(measured: dict[str, Any], kinds: set[str], devices: int, any_groups: bool = False) -> str | None:
    if measured.get("status") != "ok":
        return f"{measured.get('status')}: {str(measured.get('detail'))[:300]}"
    if measured["collectives"] is None:
        return "no partitioned module was read (XLA dumps are off in this child)"
    found = {c["kind"] for c in measured["collectives"]}
    everyone = "{{" + ",".join(map(str, range(devices))) + "}}"
    groups = {c["replica_groups"] for c in measured["collectives"]}
    if found != kinds or (kinds and not any_groups and groups != {everyone}):
        return f"the specs imply {sorted(kinds) or 'no collective'} among {everyone}; the module has {measured['collectives']}"
    return None


# On a (2, n/2) mesh, a change that adds, removes or moves one axis needs the collective of that
# axis alone, among its groups (the devices that differ only in their coordinate on it):
#   adding 'y' to a split                          no collective
#   removing 'y' (dim 1, or dim 0's inner axis)    an all-gather among the 'y' groups
#   moving 'x' from dim 0 to dim 1                 an all-to-all among the 'x' groups
TRANSITIONS_2D = [
    (D0, ["x", "y"], set(), None),
    (["x", "y"], D0, {"all-gather"}, "y"),
    ([["x", "y"], None], D0, {"all-gather"}, "y"),
    (D0, D1, {"all-to-all"}, "x"),
]


def axis_groups(mesh: dict[str, Any], axis: str) -> list[list[int]]:
    """The devices of `mesh` that differ only in their coordinate on `axis`, each group in that order."""
    import numpy as np

    grid = np.array(mesh["devices"]).reshape(mesh["shape"])
    moved = np.moveaxis(grid, mesh["axes"].index(axis), -1)
    return sorted(row.tolist() for row in moved.reshape(-1, moved.shape[-1]))


def group_sets(replica_groups: str) -> list[list[int]]:
    """XLA's "{{0,1},{2,3}}" as sorted groups of sorted devices: which devices talk, not in which order."""
    return sorted(sorted(int(x) for x in group.split(",") if x) for group in replica_groups.strip("{}").split("},{"))


def unexpected_2d(measured: dict[str, Any], kinds: set[str], mesh: dict[str, Any], axis: str | None) -> str | None:
    wrong = unexpected(measured, kinds, 0, any_groups=True)
    if wrong or axis is None:
        return wrong
    want = sorted(sorted(group) for group in axis_groups(mesh, axis))
    groups = [group_sets(c["replica_groups"]) for c in measured["collectives"]]
    if any(found != want for found in groups):
        return f"the specs imply {sorted(kinds)} among the {axis!r} groups {want}; the module has {measured['collectives']}"
    return None


def failures(spmd: Any, fault: str | None = None) -> list[str]:
    devices = spmd.backend.devices
    measure, out = Measurer(spmd, fault), []
    for before, after, kinds in TRANSITIONS:
        wrong = unexpected(measure(resharding(devices, before, after)), kinds, devices)
        if wrong:
            out.append(f"{before} -> {after}: {wrong}")
    if devices >= 4 and devices % 2 == 0:
        # Devices in the order of the transposed grid ([0, 2, 1, 3] on 4): the 'y' groups are not
        # runs of consecutive devices, so a mesh whose device order was lost shows in the groups.
        order = [d for start in range(2) for d in range(start, devices, 2)]
        mesh = {"shape": [2, devices // 2], "axes": ["x", "y"], "devices": order}
        for before, after, kinds, axis in TRANSITIONS_2D:
            wrong = unexpected_2d(measure(resharding(devices, before, after, mesh)), kinds, mesh, axis)
            if wrong:
                out.append(f"mesh {mesh['shape']}: {before} -> {after}: {wrong}")
    return out


def test_resharding_moves_what_its_specs_imply(spmd) -> None:
    found = failures(spmd)
    print(f"resharding: {len(TRANSITIONS)} transitions on a 1-D mesh, {len(TRANSITIONS_2D)} on a 2-D one")
    assert not found, "\n".join(found)


def test_resharding_oracle_fails_when_a_mark_is_dropped(spmd) -> None:
    """harness.oracles.faults drop-marks: every mark_sharding after a process's first does
    nothing, so the asked-for resharding and its collective never happen."""
    found = failures(spmd, "drop-marks")
    assert found, "no transition noticed that torch_xla dropped the marks on intermediates"
    print(f"fault drop-marks: {len(found)} transitions differ; first: {found[0][:500]}")


@pytest.mark.needs(devices=4)
def test_resharding_oracle_fails_when_the_device_order_is_lost(spmd) -> None:
    """harness.oracles.faults mesh-order: the mesh's device order is ignored, so the 2-D mesh's
    collectives run among the wrong groups."""
    found = [f for f in failures(spmd, "mesh-order") if f.startswith("mesh [")]
    assert found, "no 2-D transition noticed that torch_xla ignored the mesh's device order"
    print(f"fault mesh-order: {len(found)} of {len(TRANSITIONS_2D)} 2-D transitions differ; first: {found[0][:500]}")


@pytest.mark.nightly
def test_drawn_reshardings_move_what_their_specs_imply(spmd, request) -> None:
    """Specs drawn by harness.oracles.generate until --spmd-fuzz-budget seconds are spent."""
    from hypothesis import strategies as st
    from hypothesis.errors import NonInteractiveExampleWarning

    from harness.oracles import generate
    from harness.oracles.program import axes_that_split

    devices = spmd.backend.devices
    shape = (2 * devices, 2 * devices)  # every spec splits it evenly: no padding to account for

    @st.composite
    def drawn(draw) -> tuple[dict[str, Any], list[Any]]:
        mesh = draw(generate.meshes(devices))
        spec = draw(generate.specs(shape, mesh).filter(lambda spec: any(entry is not None for entry in spec)))
        return mesh, spec

    deadline = time.monotonic() + search.budget(request.config)
    measure, found, checked = Measurer(spmd), [], 0
    while time.monotonic() < deadline:
        with warnings.catch_warnings():  # a draw outside @given is what this loop wants: no shrinking here
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            mesh, spec = drawn().example()
        # A spec over mesh axes of size 1 only splits nothing: replicated, nothing to gather.
        gathers = {"all-gather"} if axes_that_split(mesh, spec) else set()
        for before, after, kinds in ((spec, spec, set()), (R, spec, set()), (spec, R, gathers)):
            wrong = unexpected(measure(resharding(devices, before, after, mesh)), kinds, devices, any_groups=True)
            if wrong:
                found.append(f"mesh {mesh}: {before} -> {after}: {wrong}")
        checked += 1
    print(f"resharding search: {checked} drawn specs, {3 * checked} changes, {len(found)} differences")
    assert not found, "\n".join(found)
