"""The differential oracle's programs: what the generator draws runs eagerly with the shapes the
program's rules state, renders as a standalone script, and the checker refuses what either side
could legitimately compute differently (harness.oracles.generate's module doc)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, given, settings

from harness.oracles import generate, repro
from harness.oracles.program import SHAPE_RULES, ProgramError, check_program

torch = pytest.importorskip("torch")
from harness.oracles import interpret  # noqa: E402  (imports torch)

MESH = {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 1, 2, 3]}
NEW_OPS = ("sort", "topk", "index_put", "conv")


def one_op(op: dict, inputs: list[list[int]]) -> dict:
    leaves = [{"shape": shape, "seed": i, "spec": None} for i, shape in enumerate(inputs)]
    return {"mesh": MESH, "inputs": leaves, "ops": [op], "outputs": [len(inputs)]}


def leaf(shape: list[int]) -> dict:
    return {"shape": shape, "seed": 7, "spec": ["x"] + [None] * (len(shape) - 1)}


def test_every_op_has_an_interpreter_and_a_script_form() -> None:
    assert set(SHAPE_RULES) == set(interpret.OPS)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generate.programs(4))
def test_a_drawn_program_runs_eagerly_with_the_shapes_its_rules_state(program: dict) -> None:
    shapes = check_program(program)
    values = interpret.run_program(program, interpret.Place(None))
    assert [tuple(v.shape) for v in values] == [tuple(s) for s in shapes]
    compile(repro.script(program, "drawn"), "<repro>", "exec")


@pytest.mark.parametrize("kind", NEW_OPS)
def test_the_generator_draws(kind: str) -> None:
    program = find(
        generate.programs(4),
        lambda p: any(op["op"] == kind for op in p["ops"]),
        settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)),
    )
    assert any(op["op"] == kind for op in program["ops"])


@pytest.mark.parametrize(
    ("op", "inputs", "shape", "line"),
    [
        (
            {"op": "sort", "x": 0, "dim": 1, "descending": True},
            [[3, 5]],
            (3, 5),
            "torch.sort(v0, 1, descending=True).values",
        ),
        (
            {"op": "topk", "x": 0, "dim": 0, "k": 2, "descending": False},
            [[3, 5]],
            (2, 5),
            "torch.topk(v0, 2, 0, largest=False).values",
        ),
        (
            {"op": "index_put", "x": 0, "dim": 1, "index": [4, 0, 4], "src": leaf([3, 3]), "accumulate": True},
            [[3, 5]],
            (3, 5),
            "accumulate=True",
        ),
        (
            {"op": "conv", "x": 0, "w": leaf([4, 2, 3]), "padding": 1, "stride": 2},
            [[2, 2, 7]],
            (2, 4, 4),
            "F.conv1d(v0,",
        ),
        (
            {"op": "conv", "x": 0, "w": leaf([3, 2, 2, 3]), "padding": 0, "stride": 1},
            [[1, 2, 4, 5]],
            (1, 3, 3, 3),
            "F.conv2d(v0,",
        ),
    ],
    ids=["sort", "topk", "index_put", "conv1d", "conv2d"],
)
def test_an_op_has_the_shape_eager_torch_gives_and_a_script_line(op, inputs, shape, line) -> None:
    program = one_op(op, inputs)
    assert check_program(program)[-1] == shape
    assert tuple(interpret.run_program(program, interpret.Place(None))[-1].shape) == shape
    assert line in repro.script(program, "one op")


def test_index_put_accumulates_a_repeated_position_as_torch_does() -> None:
    program = one_op(
        {"op": "index_put", "x": 0, "dim": 0, "index": [1, 1], "src": leaf([2, 3]), "accumulate": True}, [[2, 3]]
    )
    x, *_, out = interpret.run_program(program, interpret.Place(None))
    src = interpret.float_leaf([2, 3], 7)
    assert torch.equal(out[1], x[1] + src[0] + src[1])
    assert torch.equal(out[0], x[0])


@pytest.mark.parametrize(
    ("op", "inputs", "reason"),
    [
        (
            {"op": "index_put", "x": 0, "dim": 0, "index": [1, 1], "src": leaf([2, 3]), "accumulate": False},
            [[2, 3]],
            "without accumulate the positions must be distinct",
        ),
        (
            {"op": "index_put", "x": 0, "dim": 0, "index": [2], "src": leaf([1, 3]), "accumulate": True},
            [[2, 3]],
            "expected a whole number 0..1",
        ),
        (
            {"op": "index_put", "x": 0, "dim": 0, "index": [0], "src": leaf([2, 3]), "accumulate": True},
            [[2, 3]],
            "src must have x's shape",
        ),
        ({"op": "topk", "x": 0, "dim": 0, "k": 4, "descending": True}, [[3]], "expected a whole number 1..3"),
        ({"op": "sort", "x": 0, "dim": 0, "descending": 1}, [[3]], "descending must be true or false"),
        (
            {"op": "conv", "x": 0, "w": leaf([2, 2, 5]), "padding": 0, "stride": 1},
            [[1, 2, 3]],
            "larger than the padded",
        ),
        ({"op": "conv", "x": 0, "w": leaf([2, 3, 1]), "padding": 0, "stride": 1}, [[1, 2, 3]], "(out, C, kernel...)"),
        ({"op": "conv", "x": 0, "w": leaf([2, 2, 1]), "padding": 3, "stride": 1}, [[1, 2, 3]], "0..2"),
    ],
    ids=["put-repeat", "put-range", "put-src", "topk-k", "sort-flag", "conv-kernel", "conv-channels", "conv-pad"],
)
def test_the_checker_refuses_naming_the_rule(op, inputs, reason) -> None:
    with pytest.raises(ProgramError, match="ops\\[0\\]") as raised:
        check_program(one_op(op, inputs))
    assert reason in str(raised.value)
