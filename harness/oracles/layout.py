"""Analytic and cross-implementation oracles of where a sharded tensor's pieces live (parent
side, no torch).

A layout case is {"mesh": <as in harness.oracles.program>, "shape": [...], "spec": [...]}. From it
alone, `expected` says which index range of each dim every device holds: a dim split over the
mesh axes (a1, a2, ...) has T = |a1|*|a2|*... tiles of ceil(size/T) elements (the last ones
shorter or empty), the tile a device holds numbered by its coordinates on a1, a2, ... with a1 the
most significant; a dim split over no axis is held whole. Stated padding: every device's shard
is ceil(size/T) long along each split dim, so it holds prod(ceil(size_i/T_i)) elements however
few of them are data.

The child (harness.oracles.shards) reads what torch_xla put on each device; `check` compares it
with `expected`: the index ranges, the bytes, and the data (each shard holds the global tensor's
elements of its ranges, first). jax's NamedSharding on the same mesh and spec
(harness.oracles.shards.body_jax_layouts) must give the same ranges.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

Ranges = list[list[int]]  # [[start, stop] per dim]


def _coordinates(mesh: dict[str, Any]) -> dict[int, dict[str, int]]:
    """Each device's coordinate on each named axis (the devices list is the mesh, row-major)."""
    shape, axes = mesh["shape"], mesh["axes"]
    return {
        device: dict(zip(axes, index, strict=True))
        for device, index in zip(mesh["devices"], itertools.product(*(range(n) for n in shape)), strict=True)
    }


def _names(entry: Any) -> list[str]:
    return [] if entry is None else list(entry) if isinstance(entry, list) else [entry]


def tiles(mesh: dict[str, Any], spec: list[Any] | None, rank: int) -> list[int]:
    sizes = dict(zip(mesh["axes"], mesh["shape"], strict=True))
    return [math.prod(sizes[name] for name in _names(entry)) for entry in spec or [None] * rank]


def expected(case: dict[str, Any]) -> dict[int, Ranges]:
    mesh, shape, spec = case["mesh"], case["shape"], case["spec"] or [None] * len(case["shape"])
    sizes = dict(zip(mesh["axes"], mesh["shape"], strict=True))
    out = {}
    for device, coordinate in _coordinates(mesh).items():
        ranges = []
        for size, entry, count in zip(shape, spec, tiles(mesh, spec, len(shape)), strict=True):
            tile = 0
            for name in _names(entry):
                tile = tile * sizes[name] + coordinate[name]
            length = math.ceil(size / count)
            ranges.append([min(tile * length, size), min((tile + 1) * length, size)])
        out[device] = ranges
    return out


def padded_elements(case: dict[str, Any]) -> int:
    counts = tiles(case["mesh"], case["spec"], len(case["shape"]))
    return math.prod(math.ceil(size / count) for size, count in zip(case["shape"], counts, strict=True))


def check(case: dict[str, Any], held: dict[str, Any], element_bytes: int = 4) -> list[str]:
    """What torch_xla's placement (harness.oracles.shards.read_layout) gets wrong, if anything."""
    if held.get("status") != "ok":
        return [f"{held.get('status')}: {str(held.get('detail'))[:500]}"]
    want = expected(case)
    devices = held["devices"]
    problems = []
    if sorted(map(int, devices)) != sorted(want):
        problems.append(f"shards on devices {sorted(map(int, devices))}, the mesh has {sorted(want)}")
    for device, got in sorted(devices.items(), key=lambda item: int(item[0])):
        where = f"device {device}"
        if int(device) in want and got["ranges"] != want[int(device)]:
            problems.append(f"{where} holds {got['ranges']}, the spec gives it {want[int(device)]}")
        if got["bytes"] != padded_elements(case) * element_bytes:
            problems.append(
                f"{where} holds {got['bytes']} bytes; global {math.prod(case['shape']) * element_bytes} over tiles "
                f"{tiles(case['mesh'], case['spec'], len(case['shape']))} padded to whole tiles is "
                f"{padded_elements(case) * element_bytes}"
            )
        if not got["data_ok"]:
            problems.append(f"{where}: its shard's data are not the global tensor's elements {got['ranges']}")
    return problems


def even(case: dict[str, Any]) -> bool:
    """Every split dim divides into its tiles: the only cases jax's NamedSharding maps (0.7.1
    refuses an uneven one: "should evenly divide the shape"), so the only ones compared with it."""
    counts = tiles(case["mesh"], case["spec"], len(case["shape"]))
    return all(size % count == 0 for size, count in zip(case["shape"], counts, strict=True))


def compare_jax(case: dict[str, Any], jax_ranges: dict[str, Any], held: dict[str, Any]) -> list[str]:
    """jax's NamedSharding ranges against torch_xla's (and so against `expected`)."""
    if held.get("status") != "ok":
        return []  # check() reports it
    problems = []
    for device, got in sorted(held["devices"].items(), key=lambda item: int(item[0])):
        if jax_ranges.get(device) != got["ranges"]:
            problems.append(f"device {device}: torch_xla {got['ranges']}, jax NamedSharding {jax_ranges.get(device)}")
    return problems


def cases_from_programs(programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every input of the programs that carries a spec, as a layout case (duplicates once)."""
    seen, cases = set(), []
    for program in programs:
        for leaf in program["inputs"]:
            case = {"mesh": program["mesh"], "shape": leaf["shape"], "spec": leaf.get("spec")}
            key = repr(case)
            if case["spec"] is not None and key not in seen:
                seen.add(key)
                cases.append(case)
    return cases
