"""Metamorphic oracle, parent side (no torch): pairs of programs that must behave the same.

A relation turns a program into a (reference, variant) pair whose shardings are equivalent by
definition, so the two must compute equal numbers AND compile as many graphs with the same
collectives (kind, replica groups, count, bytes) in their partitioned modules:

    replicated         input 0 marked with an all-None spec ({replicated}) vs left unmarked ('')
                       (pytorch/xla#9755's kind: the two are the same placement)
    unit-axis          the mesh vs the same mesh with a size-1 axis appended (an (n,1) mesh vs a
                       1-D one); specs unchanged, so nothing is split along the new axis
    by-index           specs by axis name vs the same specs by axis index
    transposed-mesh    the mesh vs its transpose: axes reversed and the device order permuted so
                       that each device keeps its coordinate on each named axis; every named spec
                       then gives every device the same tile
    functionalization  the same program with XLA_DISABLE_FUNCTIONALIZATION=0 vs =1 (a child each);
                       not for programs of views only (an alias without it, a copy with it); for
                       a program with an in-place op through a view, numbers only (`costs_compared`)

Each side runs in a child of its own (harness.oracles.body.body_measure_program): a child starts
with an empty compilation cache, so compile counts compare.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from typing import Any

from harness.oracles.program import ATOL, RTOL, VIEW_OPS, spec_places

Program = dict[str, Any]
Pair = tuple[Program, Program]
UNIT_AXIS = "unit"


def replicated(program: Program) -> Pair | None:
    ref, var = copy.deepcopy(program), copy.deepcopy(program)
    rank = len(program["inputs"][0]["shape"])
    ref["inputs"][0]["spec"] = [None] * rank
    var["inputs"][0]["spec"] = None
    return ref, var


def unit_axis(program: Program) -> Pair | None:
    mesh = program["mesh"]
    if UNIT_AXIS in mesh["axes"] or len(mesh["shape"]) >= 4:
        return None
    var = copy.deepcopy(program)
    var["mesh"] = {**mesh, "shape": [*mesh["shape"], 1], "axes": [*mesh["axes"], UNIT_AXIS]}
    return copy.deepcopy(program), var


def by_index(program: Program) -> Pair | None:
    if not any(any(e is not None for e in place["spec"] or []) for place in spec_places(program)):
        return None  # nothing names an axis
    var = copy.deepcopy(program)
    var["mesh"]["spec_by"] = "index"
    return copy.deepcopy(program), var


def transposed_mesh(program: Program) -> Pair | None:
    mesh = program["mesh"]
    shape = mesh["shape"]
    if len(shape) < 2:
        return None
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    devices = [
        mesh["devices"][sum(i * s for i, s in zip(reversed(new_index), strides, strict=True))]
        for new_index in itertools.product(*(range(n) for n in reversed(shape)))
    ]
    var = copy.deepcopy(program)
    var["mesh"] = {**mesh, "shape": shape[::-1], "axes": mesh["axes"][::-1], "devices": devices}
    return copy.deepcopy(program), var


def functionalization(program: Program) -> Pair | None:
    """The variant's child runs with functionalization off. Not for a program whose ops are views
    only: without functionalization a view aliases its input and nothing compiles, with it the view
    is a copy in a graph of its own (compiles 1 vs 0: a design difference, not a sharding one; the
    nightly search drew an identity transpose of an input on 2.9.0)."""
    if all(op["op"] in VIEW_OPS for op in program["ops"]):
        return None
    return copy.deepcopy(program), copy.deepcopy(program)


RELATIONS: dict[str, Callable[[Program], Pair | None]] = {
    "replicated": replicated,
    "unit-axis": unit_axis,
    "by-index": by_index,
    "transposed-mesh": transposed_mesh,
    "functionalization": functionalization,
}


def _flat(value: Any) -> list[float]:
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [float(value)]


def _outputs_differ(ref: list[Any], var: list[Any]) -> str | None:
    for slot, (a, b) in enumerate(zip(ref, var, strict=True)):
        flat_a, flat_b = _flat(a), _flat(b)
        if len(flat_a) != len(flat_b):
            return f"output {slot}: {len(flat_a)} elements vs {len(flat_b)}"
        scale = max([1.0, *map(abs, flat_a)])
        for i, (x, y) in enumerate(zip(flat_a, flat_b, strict=True)):
            if not abs(x - y) <= RTOL * abs(x) + ATOL * scale:
                return f"output {slot}: element {i} (flat) is {x!r} in the reference, {y!r} in the variant"
    return None


def _collective_key(entry: dict[str, Any]) -> tuple[str, str, int, int]:
    """Replica groups in any order (the order XLA lists groups in is not the placement; the order
    within a group is: an all-gather concatenates in it)."""
    groups = str(entry.get("replica_groups"))
    if not groups.startswith("pairs"):
        groups = str(sorted([int(x) for x in g.split(",") if x] for g in groups.strip("{}").split("},{")))
    return (str(entry.get("kind")), groups, int(entry.get("count", 0)), int(entry.get("bytes_per_device", 0)))


def costs_compared(relation: str, program: Program) -> bool:
    """Whether the relation holds the pair to equal compiles and collectives, not only numbers.
    Functionalization exists to trace in-place ops through views: without it torch_xla updates the
    view's base by other graphs, and what XLA can fold differs (the nightly search on 2.9.0: x
    zeroed through x.transpose(1, 1), then a log_softmax along its split dim: no collective with
    functionalization, the softmax's two all-reduces without). Their numbers must still agree, and a
    crash on one side only is still reported."""
    return not (
        relation == "functionalization" and any(op["op"] == "inplace" and op["view"] != "none" for op in program["ops"])
    )


def differences(ref: dict[str, Any], var: dict[str, Any], costs: bool = True) -> list[str]:
    """What differs between two measurements (harness.oracles.measure) of equivalent programs;
    costs=False: numbers and outcomes only."""
    if ref.get("status") != "ok" or var.get("status") != "ok":
        if ref.get("status") == var.get("status"):
            return []  # both refused or crashed alike: the differential oracle reports that, not this one
        return [
            f"reference {ref.get('status')}: {ref.get('detail', '')[:300]}; variant {var.get('status')}: "
            f"{var.get('detail', '')[:300]}"
        ]
    found = []
    numbers = _outputs_differ(ref["outputs"], var["outputs"])
    if numbers:
        found.append(f"numbers differ: {numbers}")
    if not costs:
        return found
    if ref["compiles"] != var["compiles"]:
        found.append(f"compiles: {ref['compiles']} in the reference, {var['compiles']} in the variant")
    if ref["collectives"] is not None and var["collectives"] is not None:
        a = sorted(map(_collective_key, ref["collectives"]))
        b = sorted(map(_collective_key, var["collectives"]))
        if a != b:
            found.append(f"collectives differ: reference {a}, variant {b}")
    return found
