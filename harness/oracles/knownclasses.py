"""Wrong numbers a registry entry already names, recognised in a drawn program by taking its
condition away.

A crash or an error is recognised by its text (the entry's signatures). A mismatch is not: the
numbers differ with every program; nor is a metamorphic difference (its collectives and bytes
differ with every program). An entry whose bug needs a condition the program can be run without
has a class here: a failure of the class's kind (`failure`, searched in "status: detail") of a
program that looks like the class (`looks_like`), gone once the condition is taken away
(`without_condition`, run again in new children by the oracle that failed it), is that bug, found
again. A program that still fails without it is a finding, whatever it looks like: another bug
there is not hidden by this one.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any

from harness.oracles.program import axes_that_split, check_program, spec_places

Program = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class KnownClass:
    entry: str  # the registry entry (harness/known_bugs.toml) whose bug this is
    looks_like: Callable[[Program], bool]
    without_condition: Callable[[Program], Program]
    example: Program  # a smallest program of the class, as narrowed (its case runs it)
    # The failures it explains: the differential oracle's wrong numbers, unless it says otherwise.
    failure: str = "^mismatch: "


def _matmul_weight_over_two_axes(program: Program) -> bool:
    mesh = program["mesh"]
    if mesh["devices"] == sorted(mesh["devices"]):
        return False  # the bug needs a device order other than the mesh's own
    return any(
        op["op"] in ("matmul", "einsum") and len(axes_that_split(mesh, op["w"].get("spec"))) >= 2
        for op in program["ops"]
    )


def _identity_device_order(program: Program) -> Program:
    variant = copy.deepcopy(program)
    variant["mesh"]["devices"] = sorted(variant["mesh"]["devices"])
    return variant


def _einsum_after_inplace_through_view(program: Program) -> bool:
    ops = program["ops"]
    return any(op["op"] == "einsum" for op in ops) and any(op["op"] == "inplace" and op["view"] != "none" for op in ops)


def _inplace_ops_on_their_base(program: Program) -> Program:
    variant = copy.deepcopy(program)
    for op in variant["ops"]:
        if op["op"] == "inplace":
            op["view"] = "none"
    return variant


def _index_shorter_than_its_input_of_something_split(program: Program) -> bool:
    """A gather or scatter_add whose index is shorter than its input along a dim other than the
    op's, in a program that splits something."""
    mesh = program["mesh"]
    if not any(axes_that_split(mesh, place["spec"]) for place in spec_places(program)):
        return False
    shapes = check_program(program)
    return any(
        op["op"] in ("gather", "scatter_add")
        and any(
            d != op["dim"] and want < size for d, (size, want) in enumerate(zip(shapes[op["x"]], op["index"]["shape"]))
        )
        for op in program["ops"]
    )


def _roll_cat_stack_or_conv_of_something_split(program: Program) -> bool:
    mesh = program["mesh"]
    return any(op["op"] in ("roll", "cat", "stack", "conv") for op in program["ops"]) and any(
        axes_that_split(mesh, place["spec"]) for place in spec_places(program)
    )


def _unsplit(program: Program) -> Program:
    """The same program with nothing split: every spec replicated (a mark op keeps its place)."""
    variant = copy.deepcopy(program)
    for place in spec_places(variant):
        if place["spec"] is not None:
            place["spec"] = [None] * len(place["spec"])
    return variant


def _scatter_add_into_what_an_inplace_op_changed(program: Program) -> bool:
    """A scatter_add whose destination an in-place op changed before it (the tensor or the op's value)."""
    changed: set[int] = set()
    for index, op in enumerate(program["ops"], start=len(program["inputs"])):
        if op["op"] == "inplace" and op["view"] == "none":
            changed |= {op["x"], index}
        elif op["op"] == "scatter_add" and op["x"] in changed:
            return True
    return False


def _inplace_ops_out_of_place(program: Program) -> Program:
    """Each in-place op replaced by an out-of-place one on the same value (a flip: a new tensor, the
    input left as it was)."""
    variant = copy.deepcopy(program)
    for index, op in enumerate(variant["ops"]):
        if op["op"] == "inplace" and op["view"] == "none":
            variant["ops"][index] = {"op": "flip", "x": op["x"], "dim": 0}
    return variant


def _split_unevenly(program: Program) -> bool:
    return any(_uneven_dims(program["mesh"], place, shape) for place, shape in _specs_with_shapes(program))


def _specs_with_shapes(program: Program) -> list[tuple[dict[str, Any], list[int]]]:
    """Every object holding a spec, with the shape of what it splits (a mark op's: its value's)."""
    shapes = check_program(program)
    return [
        (place, shapes[place["x"]] if place.get("op") == "mark" else place["shape"]) for place in spec_places(program)
    ]


def _uneven_dims(mesh: dict[str, Any], place: dict[str, Any], shape: list[int]) -> list[int]:
    """The dims a spec splits into tiles of unequal size (the last one padded)."""
    sizes = dict(zip(mesh["axes"], mesh["shape"]))
    uneven = []
    for d, (entry, size) in enumerate(zip(place.get("spec") or [], shape)):
        tiles = 1
        for name in axes_that_split(mesh, [entry]):
            tiles *= sizes[name]
        if size % tiles:
            uneven.append(d)
    return uneven


def _uneven_dims_unsplit(program: Program) -> Program:
    variant = copy.deepcopy(program)
    for place, shape in _specs_with_shapes(variant):
        for d in _uneven_dims(variant["mesh"], place, shape):
            place["spec"][d] = None
    return variant


CLASSES = (
    # Measured on 2.4.0, 2.6.0, 2.8.0 and 2.9.0: wrong numbers only with a permuted device order
    # (the same program on the mesh's own order agrees); see the entry's notes.
    KnownClass(
        "matmul-size1-dim-sharded-weight-wrong-numbers",
        _matmul_weight_over_two_axes,
        _identity_device_order,  # the condition taken away: the mesh's device order put back to 0..n-1
        # A view of a [2] input, then a matmul with w [2, 4] over both axes of a (2, 2) mesh whose
        # device order is [0, 2, 3, 1]: 4 of 4 elements wrong (2.4.0-2.9.0).
        {
            "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 2, 3, 1]},
            "inputs": [{"shape": [2], "seed": 1, "spec": None}],
            "ops": [
                {"op": "reshape", "method": "view", "x": 0, "shape": [1, 2]},
                {"op": "matmul", "x": 1, "w": {"shape": [2, 4], "seed": 976, "spec": ["x", "y"]}},
            ],
            "outputs": [2],
        },
    ),
    # Measured on 2.4.0 and 2.5.1, with and without SPMD: einsum reads the tensor as it was before
    # an in-place op through a narrow or slice of it (matmul and elementwise ops read it right).
    KnownClass(
        "einsum-reads-base-before-inplace-through-view",
        _einsum_after_inplace_through_view,
        _inplace_ops_on_their_base,  # the condition taken away: each in-place op on its tensor itself
        {
            "mesh": {"shape": [4], "axes": ["x"], "devices": [0, 1, 2, 3]},
            "inputs": [{"shape": [4], "seed": 0, "spec": None}],
            "ops": [
                {"op": "inplace", "x": 0, "fn": "add_", "c": 0.5, "view": "narrow", "dim": 0, "start": 0, "length": 2},
                {"op": "einsum", "x": 1, "dim": 0, "w": {"shape": [4, 3], "seed": 1, "spec": None}},
            ],
            "outputs": [2],
        },
    ),
    # Measured on 2.4.0: a gather whose index is shorter than its input along a split dim (not the
    # gathered one) reads the wrong columns, evenly split or not, and a scatter_add whose input or
    # src is split so adds to the wrong rows; 2.5.1 on agrees. The split can reach the op through
    # others (the search drew a gather of tanh(x), x split), so the class takes the whole split
    # away: on 2.4.0 the nightly search passes over wrong numbers of such a gather or scatter_add
    # that go away unsplit (another bug of theirs is hidden there, on 2.4.0 only).
    KnownClass(
        "gather-index-shorter-along-split-dim-wrong-numbers",
        _index_shorter_than_its_input_of_something_split,
        _unsplit,  # the condition taken away: nothing split
        {
            "mesh": {"shape": [4], "axes": ["x"], "devices": [0, 1, 2, 3]},
            "inputs": [{"shape": [2, 8], "seed": 0, "spec": [None, "x"]}],
            "ops": [{"op": "gather", "x": 0, "dim": 0, "index": {"shape": [2, 3], "seed": 0, "high": 2}}],
            "outputs": [1],
        },
    ),
    # Measured on 2.4.0-2.6.0: roll, cat and stack of a tensor split over part of the mesh (its
    # tiles replicated over the other axes) add the replicas up: every value doubled on a (2, 2)
    # mesh; the oracle rerun on 2.6.0 drew a conv1d whose weight was split so (doubled too). The
    # replicas can come from an op before (an index_select of a tensor split over both axes), so
    # the class takes the whole split away: on 2.4.0-2.6.0 the nightly search passes over any
    # wrong numbers of a roll, cat, stack or conv that go away unsplit (another bug of those ops is
    # hidden there, on those releases only).
    KnownClass(
        "roll-cat-partially-replicated-adds-replicas",
        _roll_cat_stack_or_conv_of_something_split,
        _unsplit,  # the condition taken away: nothing split
        {
            "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 1, 2, 3]},
            "inputs": [{"shape": [3, 3], "seed": 0, "spec": ["x", None]}],
            "ops": [{"op": "roll", "x": 0, "dim": 0, "shift": 1}],
            "outputs": [1],
        },
    ),
    # Measured on 2.4.0-2.9.0 (cases/test_oracle_findings.py): with functionalization off, a
    # matmul of [1, 1, 6] or [2, 1, 6] split over dim 0 on 4 devices partitions with an all-reduce
    # more; [4, 1, 6] and [8, 1, 6] (evenly split) and [1, 6] keep the collectives. Every program
    # the nightly search found this way (2.4.0-2.7.0) split a dim unevenly.
    KnownClass(
        "functionalization-off-adds-collectives",
        _split_unevenly,
        _uneven_dims_unsplit,  # the condition taken away: every unevenly split dim left whole
        {
            "mesh": {"shape": [4], "axes": ["x"], "devices": [0, 1, 2, 3]},
            "inputs": [{"shape": [2, 1, 6], "seed": 0, "spec": ["x", None, None]}],
            "ops": [{"op": "matmul", "x": 0, "w": {"shape": [6, 2], "seed": 470, "spec": None}}],
            "outputs": [0, 1],
        },
        failure="^metamorphic: functionalization: collectives differ",
    ),
    # Measured on 2.4.0 and 2.5.1 (cases/test_oracle_findings.py): with functionalization off, a scatter_add
    # into a tensor an in-place op zeroed first, its src split over one axis of a 2-D mesh,
    # partitions with an all-gather of src where functionalization on all-reduces the partial sums;
    # without the in-place op both all-reduce. 2.6.0, 2.8.0 and 2.9.0 all-reduce either way.
    KnownClass(
        "functionalization-off-scatter-add-after-inplace-gathers",
        _scatter_add_into_what_an_inplace_op_changed,
        _inplace_ops_out_of_place,  # the condition taken away: nothing changed in place
        {
            "mesh": {"shape": [2, 2], "axes": ["x", "y"], "devices": [0, 1, 2, 3]},
            "inputs": [{"shape": [7], "seed": 1, "spec": None}],
            "ops": [
                {"op": "inplace", "x": 0, "fn": "zero_", "c": 0.5, "view": "none"},
                {
                    "op": "scatter_add",
                    "x": 0,
                    "dim": 0,
                    "index": {"shape": [6], "seed": 999, "high": 7},
                    "src": {"shape": [6], "seed": 243, "spec": ["y"]},
                },
            ],
            "outputs": [0, 1, 2],
        },
        failure="^metamorphic: functionalization: collectives differ",
    ),
)


def of_entry(entry: str) -> KnownClass:
    """The class of a registry entry; KeyError naming the entries that have one."""
    for known in CLASSES:
        if known.entry == entry:
            return known
    raise KeyError(f"no known class for {entry!r}; classes: {', '.join(k.entry for k in CLASSES)}")


def candidates(program: Program, verdict: dict[str, str], carried: Callable[[str], bool]) -> list[KnownClass]:
    """The classes of entries carried by the build whose kind of failure this is and which the
    failing program looks like."""
    failure = f"{verdict.get('status')}: {verdict.get('detail') or ''}"
    return [
        known
        for known in CLASSES
        if carried(known.entry) and re.search(known.failure, failure) and known.looks_like(program)
    ]
