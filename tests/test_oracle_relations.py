"""The metamorphic relations and the analytic layout, checked on hand-worked examples (no torch)."""

from __future__ import annotations

import pytest

from harness.oracles import layout, metamorphic
from harness.oracles.program import check_program

pytestmark = pytest.mark.selftest

PROGRAM = {
    "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [3, 1, 0, 2]},
    "inputs": [{"shape": [4, 6], "seed": 0, "spec": ["x", "y"]}],
    "ops": [{"op": "mark", "x": 0, "spec": [["y", "x"], None]}],
    "outputs": [1],
}


def test_every_relation_gives_valid_programs():
    for name, relation in metamorphic.RELATIONS.items():
        pair = relation(PROGRAM)
        assert pair is not None, name
        for program in pair:
            check_program(program)


def test_functionalization_leaves_out_programs_of_views_only():
    """Drawn by the nightly search on 2.9.0: outputs an input and its identity transpose compile
    one graph with functionalization (the view as a copy) and none without (an alias)."""
    views = {
        "mesh": {"shape": [2, 2, 1], "axes": ["x", "y", "z"], "devices": [0, 1, 2, 3]},
        "inputs": [{"shape": [5, 3, 8], "seed": 0, "spec": None}],
        "ops": [{"op": "transpose", "x": 0, "d0": 1, "d1": 1}],
        "outputs": [0, 1],
    }
    check_program(views)
    assert metamorphic.functionalization(views) is None
    computes = {**views, "ops": [*views["ops"], {"op": "unary", "fn": "tanh", "x": 1}], "outputs": [0, 2]}
    check_program(computes)
    assert metamorphic.functionalization(computes) is not None


def test_transposed_mesh_keeps_each_devices_coordinates():
    _, var = metamorphic.transposed_mesh(PROGRAM)
    assert var["mesh"] == {"shape": [2, 2], "axes": ["y", "x"], "devices": [3, 0, 1, 2]}
    case = {"shape": [4, 6], "spec": ["x", "y"]}
    assert layout.expected({**case, "mesh": PROGRAM["mesh"]}) == layout.expected({**case, "mesh": var["mesh"]})


def test_expected_layout_of_an_uneven_split_over_two_axes():
    mesh = {"shape": [2, 2], "axes": ["x", "y"], "devices": [3, 1, 0, 2]}
    case = {"mesh": mesh, "shape": [5, 2], "spec": [["y", "x"], None]}
    # tile = y * 2 + x, 2 rows each: device 3 (x0,y0) 0, device 1 (x0,y1) 2, device 0 (x1,y0) 1, device 2 (x1,y1) 3
    assert layout.expected(case) == {3: [[0, 2], [0, 2]], 0: [[2, 4], [0, 2]], 1: [[4, 5], [0, 2]], 2: [[5, 5], [0, 2]]}
    assert layout.padded_elements(case) == 4 and not layout.even(case)


def test_check_names_a_misplaced_shard():
    case = {"mesh": {"shape": [2], "axes": ["x"], "devices": [0, 1]}, "shape": [4], "spec": ["x"]}
    held = {
        "status": "ok",
        "devices": {
            "0": {"ranges": [[2, 4]], "bytes": 8, "data_ok": True},
            "1": {"ranges": [[0, 2]], "bytes": 12, "data_ok": False},
        },
    }
    problems = layout.check(case, held)
    assert any("device 0 holds [[2, 4]], the spec gives it [[0, 2]]" in p for p in problems)
    assert any("device 1 holds 12 bytes" in p for p in problems)
    assert any("device 1: its shard's data" in p for p in problems)


def test_differences_compare_numbers_compiles_and_collectives():
    ok = {"status": "ok", "outputs": [[1.0, 2.0]], "compiles": 1, "collectives": []}
    gathered = {**ok, "collectives": [{"kind": "all-gather", "replica_groups": "{{0,1}}", "count": 1}]}
    assert metamorphic.differences(ok, dict(ok)) == []
    assert metamorphic.differences(ok, {**ok, "outputs": [[1.0, 2.5]]})[0].startswith("numbers differ")
    assert metamorphic.differences(ok, {**ok, "compiles": 2})[0].startswith("compiles")
    assert metamorphic.differences(ok, gathered)[0].startswith("collectives differ")
    reordered = {**gathered, "collectives": [{"kind": "all-gather", "replica_groups": "{{1,0}}", "count": 1}]}
    assert metamorphic.differences(gathered, reordered)  # the order within a group is the placement


def test_functionalization_compares_only_numbers_of_a_program_with_an_inplace_op_through_a_view():
    """The nightly search on 2.9.0: x zeroed through x.transpose(1, 1), then a log_softmax along its
    split dim: no collective with functionalization (XLA folds the zeros), two all-reduces without."""
    through_view = {"ops": [{"op": "inplace", "x": 0, "fn": "zero_", "c": 0.25, "view": "transpose", "d0": 1, "d1": 1}]}
    on_itself = {"ops": [{"op": "inplace", "x": 0, "fn": "zero_", "c": 0.25, "view": "none"}]}
    assert not metamorphic.costs_compared("functionalization", through_view)
    assert metamorphic.costs_compared("functionalization", on_itself)
    assert metamorphic.costs_compared("unit-axis", through_view)
    ok = {"status": "ok", "outputs": [[1.0, 2.0]], "compiles": 1, "collectives": []}
    more = {
        **ok,
        "collectives": [{"kind": "all-reduce", "replica_groups": "{{0,1}}", "count": 2, "bytes_per_device": 16}],
    }
    assert metamorphic.differences(ok, more, costs=False) == []
    assert metamorphic.differences(ok, {**more, "outputs": [[1.0, 3.0]]}, costs=False)[0].startswith("numbers differ")
    assert metamorphic.differences(ok, more)[0].startswith("collectives differ")
