"""What the differential oracle (harness.oracles, cases/test_oracle_differential.py) found, each
as a regular case: the shrunk program, run sharded and eagerly on the CPU, must agree.

Each program is the oracle's own shrunk repro; the body runs it through the same interpreter and
comparison, in a child of its own (a finding may abort its process).
"""

from __future__ import annotations

import copy

import pytest

from harness.oracles import knownclasses

pytestmark = pytest.mark.spmd

MESH_4 = {"shape": [4], "axes": ["x"], "devices": [0, 1, 2, 3]}


def body_program_agrees_with_cpu(ctx, program: dict) -> None:
    from harness.oracles import compare

    verdict = ctx.record("verdict", compare.check_program_on_xla(program))
    if verdict["status"] != "ok":
        raise AssertionError(f"the sharded program differs from eager CPU ({verdict['status']}): {verdict['detail']}")


def _scatter_add_program(shape: list[int], src_spec: list) -> dict:
    return {
        "mesh": MESH_4,
        "inputs": [{"shape": shape, "seed": 0, "spec": None}],
        "ops": [
            {
                "op": "scatter_add",
                "x": 0,
                "dim": 0,
                "index": {"shape": shape, "seed": 0, "high": shape[0]},
                "src": {"shape": shape, "seed": 1, "spec": src_spec},
            }
        ],
        "outputs": [1],
    }


@pytest.mark.needs(devices=4)
@pytest.mark.known_bug("scatter-add-uneven-src-aborts")
@pytest.mark.parametrize("shape", [[1, 1], [2, 3]], ids=["1x1", "2x3"])
def test_scatter_add_with_unevenly_sharded_src(spmd, shape) -> None:
    spmd.run(body_program_agrees_with_cpu, program=_scatter_add_program(shape, [None, "x"]), fresh=True)


@pytest.mark.needs(devices=4)
@pytest.mark.parametrize("shape,spec", [([2, 4], [None, "x"]), ([4, 3], ["x", None])], ids=["2x4-cols", "4x3-rows"])
def test_scatter_add_with_evenly_sharded_src(spmd, shape, spec) -> None:
    """The control: evenly sharded src computes the right numbers on every release measured."""
    spmd.run(body_program_agrees_with_cpu, program=_scatter_add_program(shape, spec))


def _inplace_select_program(shape: list[int], spec: list, view: str) -> dict:
    view_args = {"dim": 0, "index": 3} if view == "select" else {"dim": 0, "start": 3, "length": 1}
    return {
        "mesh": MESH_4,
        "inputs": [{"shape": shape, "seed": 0, "spec": spec}],
        "ops": [{"op": "inplace", "x": 0, "fn": "zero_", "c": 0.0, "view": view, **view_args}],
        "outputs": [1],
    }


@pytest.mark.needs(devices=4)
@pytest.mark.known_bug("inplace-select-on-sharded-dim-compile-error")
@pytest.mark.parametrize("shape,spec", [([8], ["x"]), ([8, 5], ["x", None])], ids=["rank1", "rank2"])
def test_inplace_op_through_select_on_sharded_dim(spmd, shape, spec) -> None:
    spmd.run(body_program_agrees_with_cpu, program=_inplace_select_program(shape, spec, "select"))


@pytest.mark.needs(devices=4)
def test_inplace_op_through_narrow_on_sharded_dim(spmd) -> None:
    """The control: the same row through narrow compiles and agrees on every release measured."""
    spmd.run(body_program_agrees_with_cpu, program=_inplace_select_program([8, 5], ["x", None], "narrow"))


MATMUL_SIZE1_PROGRAM = {
    "mesh": {"shape": [2, 1, 2], "axes": ["x", "y", "z"], "devices": [0, 2, 3, 1]},
    "inputs": [{"shape": [1], "seed": 0, "spec": None}],
    "ops": [{"op": "matmul", "x": 0, "w": {"shape": [1, 2], "seed": 0, "spec": ["z", "x"]}}],
    "outputs": [1],
}


@pytest.mark.needs(devices=4)
@pytest.mark.known_bug("matmul-size1-dim-sharded-weight-wrong-numbers")
def test_matmul_with_weight_sharded_over_size1_contraction_dim(spmd) -> None:
    """The nightly search's shrunk program (values numbered as the oracle numbers them)."""
    spmd.run(body_program_agrees_with_cpu, program=MATMUL_SIZE1_PROGRAM, fresh=True)


# The same bug without the size-1 dim, the padding or the 3-D mesh (the nightly search drew it as a
# view, then an einsum; narrowed by hand): what it needs is the permuted device order and an x made
# by a view. The controls take one of the two away and agree.
VIEW_MATMUL_PERMUTED = knownclasses.of_entry("matmul-size1-dim-sharded-weight-wrong-numbers").example


@pytest.mark.needs(devices=4)
@pytest.mark.known_bug("matmul-size1-dim-sharded-weight-wrong-numbers")
def test_matmul_of_a_view_with_weight_over_both_axes_of_a_permuted_mesh(spmd) -> None:
    spmd.run(body_program_agrees_with_cpu, program=VIEW_MATMUL_PERMUTED, fresh=True)


@pytest.mark.needs(devices=4)
@pytest.mark.parametrize("control", ["identity-device-order", "input-not-a-view"])
def test_matmul_with_weight_over_both_axes_agrees_without_the_condition(spmd, control: str) -> None:
    program = copy.deepcopy(VIEW_MATMUL_PERMUTED)
    if control == "identity-device-order":
        program["mesh"]["devices"] = [0, 1, 2, 3]
    else:
        program["inputs"][0]["shape"] = [1, 2]
        program["ops"] = [{"op": "matmul", "x": 0, "w": VIEW_MATMUL_PERMUTED["ops"][1]["w"]}]
        program["outputs"] = [1]
    spmd.run(body_program_agrees_with_cpu, program=program)


def _gather_program(dim: int) -> dict:
    """A [4, 3] tensor cut over its columns on a (2, 2) mesh, gathered along `dim`."""
    return {
        "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 1, 2, 3]},
        "inputs": [{"shape": [4, 3], "seed": 0, "spec": [None, "y"]}],
        "ops": [{"op": "gather", "x": 0, "dim": dim, "index": {"shape": [2, 3], "seed": 8, "high": [4, 3][dim]}}],
        "outputs": [1],
    }


@pytest.mark.needs(devices=4)
@pytest.mark.known_bug("gather-along-sharded-dim-hlo-verifier")
def test_gather_along_the_sharded_dim(spmd) -> None:
    """A committed program's failure on 2.7.0 (release matrix), shrunk by hand."""
    spmd.run(body_program_agrees_with_cpu, program=_gather_program(1))


@pytest.mark.needs(devices=4)
def test_gather_along_an_unsharded_dim(spmd) -> None:
    """The control: the same tensor gathered along its rows compiles and agrees."""
    spmd.run(body_program_agrees_with_cpu, program=_gather_program(0))


# Wrong numbers the nightly search found on 2.4.0-2.6.0 (release matrix, 2026-11-29), each narrowed
# by hand to its class's example (harness.oracles.knownclasses): the example must agree with the CPU,
# and so must the same program with the class's condition taken away (the control, on every release).
FIXED_CLASSES = [
    pytest.param(
        "einsum-reads-base-before-inplace-through-view",
        marks=pytest.mark.known_bug("einsum-reads-base-before-inplace-through-view"),
        id="einsum-after-inplace-through-view",
    ),
    pytest.param(
        "gather-index-shorter-along-split-dim-wrong-numbers",
        # 2.7.0 does not compile the same gather (its own entry; the windows are disjoint).
        marks=[
            pytest.mark.known_bug("gather-index-shorter-along-split-dim-wrong-numbers"),
            pytest.mark.known_bug("gather-along-sharded-dim-hlo-verifier"),
        ],
        id="gather-index-shorter-along-split-dim",
    ),
    pytest.param(
        "roll-cat-partially-replicated-adds-replicas",
        marks=pytest.mark.known_bug("roll-cat-partially-replicated-adds-replicas"),
        id="roll-partially-replicated",
    ),
]


@pytest.mark.needs(devices=4)
@pytest.mark.parametrize("entry", FIXED_CLASSES)
def test_known_class_example_agrees_with_cpu(spmd, entry: str) -> None:
    spmd.run(body_program_agrees_with_cpu, program=knownclasses.of_entry(entry).example)


@pytest.mark.needs(devices=4)
@pytest.mark.parametrize("entry", [p.values[0] for p in FIXED_CLASSES], ids=[p.id for p in FIXED_CLASSES])
def test_known_class_example_agrees_without_its_condition(spmd, entry: str) -> None:
    """The control: what the class says the bug needs, taken away, leaves a program every release computes right."""
    known = knownclasses.of_entry(entry)
    spmd.run(body_program_agrees_with_cpu, program=known.without_condition(known.example))


# What the metamorphic search found with functionalization off (XLA_DISABLE_FUNCTIONALIZATION=1) on
# 2.4.0-2.7.0 (release matrix, 2026-11-29): the same program must compute, compile and communicate
# alike with it on and off (harness.oracles.metamorphic), each side in a child of its own.
FUNCTIONALIZATION_FINDINGS = {
    # An in-place op through x.transpose(0, 0), a view that moves nothing.
    "inplace-through-identity-transpose": {
        "mesh": MESH_4,
        "inputs": [{"shape": [8], "seed": 0, "spec": ["x"]}],
        "ops": [{"op": "inplace", "x": 0, "fn": "add_", "c": 0.5, "view": "transpose", "d0": 0, "d1": 0}],
        "outputs": [0, 1],
    },
    # A matmul of a [2, 1, 6] input split unevenly over dim 0 (narrowed from the search's [1, 1, 6]).
    "matmul-of-unevenly-split-input": knownclasses.of_entry("functionalization-off-adds-collectives").example,
    # The control: the same program with dim 0 left whole keeps its collectives on every release.
    "matmul-of-unsplit-input": knownclasses.of_entry("functionalization-off-adds-collectives").without_condition(
        knownclasses.of_entry("functionalization-off-adds-collectives").example
    ),
    # A scatter_add into a tensor zeroed in place, src split over 'y' (found on 2.4.0).
    "scatter-add-after-inplace": knownclasses.of_entry(
        "functionalization-off-scatter-add-after-inplace-gathers"
    ).example,
    # The control: the in-place op made out of place.
    "scatter-add-after-out-of-place": knownclasses.of_entry(
        "functionalization-off-scatter-add-after-inplace-gathers"
    ).without_condition(knownclasses.of_entry("functionalization-off-scatter-add-after-inplace-gathers").example),
}


@pytest.mark.needs(devices=4)
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            "inplace-through-identity-transpose",
            marks=pytest.mark.known_bug("functionalization-off-identity-transpose-view-check-failed"),
        ),
        pytest.param(
            "matmul-of-unevenly-split-input", marks=pytest.mark.known_bug("functionalization-off-adds-collectives")
        ),
        "matmul-of-unsplit-input",
        pytest.param(
            "scatter-add-after-inplace",
            marks=pytest.mark.known_bug("functionalization-off-scatter-add-after-inplace-gathers"),
        ),
        "scatter-add-after-out-of-place",
    ],
)
def test_functionalization_off_keeps_the_program(spmd, name: str) -> None:
    from cases.test_oracle_metamorphic import Measurer, relation_failures

    failures = relation_failures(Measurer(spmd), FUNCTIONALIZATION_FINDINGS[name], ["functionalization"])
    assert not failures, "\n\n".join(failures)
