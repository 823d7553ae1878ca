"""Wrong numbers a registry entry already names, recognised in a drawn program by taking its
condition away.

A crash or an error is recognised by its text (the entry's signatures). A mismatch is not: the
numbers differ with every program. An entry whose bug needs a condition the program can be run
without has a class here: a program that looks like the class (`looks_like`) and agrees with
the CPU once the condition is taken away (`without_condition`, run in a new child) is that bug,
found again. A program that still disagrees without it is a finding, whatever it looks like:
another bug there is not hidden by this one.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from harness.oracles.program import axes_that_split

Program = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class KnownClass:
    entry: str  # the registry entry (harness/known_bugs.toml) whose bug this is
    looks_like: Callable[[Program], bool]
    without_condition: Callable[[Program], Program]
    example: Program  # a smallest program of the class, as narrowed (its case runs it)


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
)


def of_entry(entry: str) -> KnownClass:
    """The class of a registry entry; KeyError naming the entries that have one."""
    for known in CLASSES:
        if known.entry == entry:
            return known
    raise KeyError(f"no known class for {entry!r}; classes: {', '.join(k.entry for k in CLASSES)}")


def candidates(program: Program, verdict: dict[str, str], carried: Callable[[str], bool]) -> list[KnownClass]:
    """The classes of entries carried by the build that a mismatching program looks like."""
    if verdict.get("status") != "mismatch":
        return []
    return [known for known in CLASSES if carried(known.entry) and known.looks_like(program)]
