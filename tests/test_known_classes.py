"""The known classes (harness.oracles.knownclasses): each recognises its own narrowed example, and
taking its condition away leaves a valid program that no longer looks like the class, so a search
rerun of it can tell the known bug from another. What each class says the bug needs was measured
on the releases its entry names (cases/test_oracle_findings.py runs the examples and the controls)."""

from __future__ import annotations

import pytest

from harness.oracles import knownclasses, program, search
from harness.registry import get_entry

pytestmark = pytest.mark.selftest

CLASSES = {known.entry: known for known in knownclasses.CLASSES}


@pytest.mark.parametrize("entry", list(CLASSES))
def test_a_class_recognises_its_example_and_not_the_example_without_its_condition(entry):
    known = CLASSES[entry]
    get_entry(entry)  # the registry names it
    program.check_program(known.example)
    assert known.looks_like(known.example)
    variant = known.without_condition(known.example)
    program.check_program(variant)
    assert not known.looks_like(variant), variant
    assert known.example != variant


def test_the_roll_cat_class_takes_every_split_away_and_needs_one_of_its_ops():
    known = CLASSES["roll-cat-partially-replicated-adds-replicas"]
    example = known.example  # [3, 3] marked ('x', None) on a (2, 2) mesh
    assert known.without_condition(example)["inputs"][0]["spec"] == [None, None]
    stacked = {**example, "ops": [{"op": "stack", "x": 0, "y": 0, "dim": 0}]}
    assert known.looks_like(stacked)
    convolved = {  # the oracle rerun on 2.6.0: a conv1d whose weight is split over one axis of two
        "mesh": {"shape": [2, 1, 2], "axes": ["x", "y", "z"], "devices": [0, 1, 2, 3]},
        "inputs": [{"shape": [1, 1, 1], "seed": 0, "spec": [None, None, ["x", "y"]]}],
        "ops": [
            {
                "op": "conv",
                "x": 0,
                "w": {"shape": [1, 1, 3], "seed": 0, "spec": [None, None, "x"]},
                "stride": 1,
                "padding": 1,
            }
        ],
        "outputs": [1],
    }
    assert known.looks_like(convolved)
    assert known.without_condition(convolved)["ops"][0]["w"]["spec"] == [None, None, None]
    no_roll = {**example, "ops": [{"op": "unary", "fn": "tanh", "x": 0}]}
    assert not known.looks_like(no_roll)


def test_only_the_unevenly_split_dims_are_left_whole():
    known = CLASSES["functionalization-off-adds-collectives"]
    two_inputs = {
        "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 1, 2, 3]},
        "inputs": [
            {"shape": [3, 4], "seed": 0, "spec": ["x", "y"]},
            {"shape": [4, 4], "seed": 1, "spec": [["x", "y"], None]},
        ],
        "ops": [{"op": "unary", "fn": "neg", "x": 0}],
        "outputs": [2],
    }
    variant = known.without_condition(two_inputs)
    assert [leaf["spec"] for leaf in variant["inputs"]] == [[None, "y"], [["x", "y"], None]]


def test_a_mark_op_that_splits_unevenly_is_of_the_class_too():
    """The nightly search on 2.7.0: [2, 1, 8] marked (None, 'y', ('z', 'x')) on a (1, 2, 2) mesh."""
    known = CLASSES["functionalization-off-adds-collectives"]
    program = {
        "mesh": {"shape": [1, 2, 2], "axes": ["x", "y", "z"], "devices": [0, 1, 2, 3]},
        "inputs": [{"shape": [2, 1, 8], "seed": 0, "spec": None}],
        "ops": [{"op": "mark", "x": 0, "spec": [None, "y", ["z", "x"]]}, {"op": "unary", "fn": "neg", "x": 1}],
        "outputs": [2],
    }
    assert known.looks_like(program)
    assert known.without_condition(program)["ops"][0]["spec"] == [None, None, ["z", "x"]]


def test_the_gather_class_needs_an_index_shorter_than_its_input_and_a_split():
    known = CLASSES["gather-index-shorter-along-split-dim-wrong-numbers"]
    example = known.example  # [2, 8] split over its columns, gathered along dim 0 with [2, 3]
    full_index = {**example, "ops": [{**example["ops"][0], "index": {"shape": [2, 8], "seed": 0, "high": 2}}]}
    assert not known.looks_like(full_index)
    assert known.without_condition(example)["inputs"][0]["spec"] == [None, None]


def test_the_gather_class_takes_a_scatter_add_and_a_split_that_comes_through_another_op():
    """The nightly search's 2.4.0 findings: src [4, 1, 1] split over dim 0 added along dim 1 of a
    [5, 1, 1]; a gather of tanh(x), x [5, 1, 1] split over dim 0, index [2, 1, 1] along dim 1."""
    known = CLASSES["gather-index-shorter-along-split-dim-wrong-numbers"]
    mesh = {"shape": [4], "axes": ["x"], "devices": [0, 1, 2, 3]}
    src = {"shape": [4, 1, 1], "seed": 0, "spec": ["x", None, None]}
    scatter = {
        "mesh": mesh,
        "inputs": [{"shape": [5, 1, 1], "seed": 0, "spec": None}],
        "ops": [
            {"op": "scatter_add", "x": 0, "dim": 1, "index": {"shape": [4, 1, 1], "seed": 0, "high": 1}, "src": src}
        ],
        "outputs": [1],
    }
    assert known.looks_like(scatter)
    assert known.without_condition(scatter)["ops"][0]["src"]["spec"] == [None, None, None]
    through_tanh = {
        "mesh": mesh,
        "inputs": [{"shape": [5, 1, 1], "seed": 0, "spec": ["x", None, None]}],
        "ops": [
            {"op": "unary", "fn": "tanh", "x": 0},
            {"op": "gather", "x": 1, "dim": 1, "index": {"shape": [2, 1, 1], "seed": 0, "high": 1}},
        ],
        "outputs": [2],
    }
    assert known.looks_like(through_tanh)
    unsplit = {**through_tanh, "inputs": [{"shape": [5, 1, 1], "seed": 0, "spec": None}]}
    assert not known.looks_like(unsplit)


# The metamorphic search asks the same question with its relation as the rerun: a difference of
# the class's kind, gone once the condition is taken away, is the known bug.
ENTRY = "functionalization-off-adds-collectives"
COLLECTIVES = {
    "status": "metamorphic",
    "detail": "functionalization: collectives differ: reference [], variant [('all-to-all', '[[0, 1, 2, 3]]', 1, 192)]",
}


def children_of(version: str):
    from types import SimpleNamespace

    return SimpleNamespace(results=[SimpleNamespace(torch_xla=version)])


@pytest.mark.parametrize(
    ("verdict", "holds", "version", "expected"),
    [
        (COLLECTIVES, True, "2.9.0", ENTRY),
        (COLLECTIVES, False, "2.9.0", None),
        ({**COLLECTIVES, "detail": "functionalization: numbers differ: output 0"}, True, "2.9.0", None),
        ({**COLLECTIVES, "detail": "unit-axis: collectives differ: reference [], variant []"}, True, "2.9.0", None),
        (COLLECTIVES, True, "2.3.0", None),
    ],
    ids=[
        "gone-without-uneven-splits",
        "stays-without-them",
        "numbers-not-collectives",
        "another-relation",
        "not-carried",
    ],
)
def test_a_metamorphic_difference_is_the_known_class_only_when_the_relation_holds_without_it(
    verdict, holds, version, expected
):
    asked: list[dict] = []
    known = CLASSES[ENTRY]

    def relation_holds(variant: dict) -> bool:
        asked.append(variant)
        return holds

    explains = search.known_bugs(children_of(version), [get_entry(ENTRY)], relation_holds)
    assert explains(known.example, verdict) == expected
    if verdict is COLLECTIVES and version == "2.9.0":
        assert asked == [known.without_condition(known.example)]
    else:
        assert asked == []


def test_the_scatter_add_class_is_the_program_the_2_4_0_search_found():
    """The nightly search on 2.4.0 drew this program (a permuted mesh, an input the ops never use);
    the class takes it, and its in-place op made out of place leaves a program it does not take."""
    known = CLASSES["functionalization-off-scatter-add-after-inplace-gathers"]
    found = {
        "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [2, 3, 1, 0]},
        "inputs": [{"shape": [1], "seed": 0, "spec": [None]}, {"shape": [7], "seed": 1, "spec": None}],
        "ops": [
            {"op": "inplace", "x": 1, "fn": "zero_", "c": 0.5, "view": "none"},
            {
                "op": "scatter_add",
                "x": 1,
                "dim": 0,
                "index": {"shape": [6], "seed": 999, "high": 7},
                "src": {"shape": [6], "seed": 243, "spec": ["y"]},
            },
        ],
        "outputs": [1, 2, 3],
    }
    assert known.looks_like(found)
    without = known.without_condition(found)
    assert not known.looks_like(without) and without["ops"][0] == {"op": "flip", "x": 1, "dim": 0}
    # through the in-place op's own value, too; a scatter_add into something left alone is not the class
    through_value = {**found, "ops": [found["ops"][0], {**found["ops"][1], "x": 2}]}
    assert known.looks_like(through_value)
    assert not known.looks_like({**found, "ops": [found["ops"][0], {**found["ops"][1], "x": 0}]})
