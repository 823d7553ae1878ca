"""Analytic and cross-implementation oracles of a sharded tensor's placement (harness.oracles.layout).

For a mesh, a shape and a partition spec, the index ranges every device holds, the bytes it holds
(global bytes over the tiles, padded to whole tiles) and the data in them follow from the spec
alone; torch_xla's shards (read back from the devices) must match, and jax's NamedSharding on a
CPU mesh of as many devices must name the same ranges for every device.

- PR tier: every marked input of the committed programs (cases/oracle_programs.json) of the run's
  device count, plus hand_cases below (uneven dims, several axes on a dim, a split size-1 dim,
  partial replication, a permuted device order): one child for torch_xla, one for jax.
- Nightly tier: meshes, shapes and specs drawn by harness.oracles.generate for the fuzz budget.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest

from cases.test_oracle_differential import load_examples
from harness.oracles import layout, search
from harness.oracles.shards import body_jax_layouts, body_read_layouts

pytestmark = pytest.mark.spmd


def hand_cases(devices: int) -> list[dict[str, Any]]:
    line = {"shape": [devices], "axes": ["x"], "devices": list(range(devices))}
    grid = {"shape": [2, devices // 2], "axes": ["x", "y"], "devices": list(range(devices))[::-1]}
    return [
        {"mesh": line, "shape": [devices + 1, 3], "spec": ["x", None]},
        {"mesh": line, "shape": [3, devices - 1], "spec": [None, "x"]},
        {"mesh": grid, "shape": [5, 3], "spec": [["x", "y"], None]},
        {"mesh": grid, "shape": [1, 6], "spec": ["x", "y"]},
        {"mesh": grid, "shape": [7, 2], "spec": ["y", None]},
        # even ones, for jax too (it maps only even splits): permuted orders, both axes on a dim
        {"mesh": grid, "shape": [2 * devices, 2], "spec": [["y", "x"], None]},
        {"mesh": grid, "shape": [4, devices], "spec": ["x", "y"]},
        {
            "mesh": {**line, "devices": [(3 * i + 1) % devices for i in range(devices)]},
            "shape": [devices],
            "spec": ["x"],
        },
    ]


def pr_cases(devices: int) -> list[dict[str, Any]]:
    programs = [p for p in load_examples() if len(p["mesh"]["devices"]) == devices]
    return layout.cases_from_programs(programs) + hand_cases(devices)


def read(spmd: Any, cases: list[dict[str, Any]], fault: str | None = None) -> list[dict[str, Any]]:
    return spmd.run(body_read_layouts, cases=cases, fault=fault).values["layouts"]


def problems_of(cases: list[dict[str, Any]], layouts: list[dict[str, Any]]) -> list[str]:
    return [f"{case}: {p}" for case, held in zip(cases, layouts, strict=True) for p in layout.check(case, held)]


def test_shards_hold_what_their_spec_implies(spmd) -> None:
    cases = pr_cases(spmd.backend.devices)
    problems = problems_of(cases, read(spmd, cases))
    print(f"layout: {len(cases)} tensors checked")
    assert not problems, "\n".join(problems[:40])


def jax_ranges(spmd: Any, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={spmd.backend.devices}", "JAX_PLATFORMS": "cpu"}
    result = spmd.run(body_jax_layouts, cases=cases, preload=False, env=env)
    if "skip" in result.values:
        pytest.skip(result.values["skip"])
    return result.values["jax"]


def jax_problems(spmd: Any, fault: str | None = None) -> list[str]:
    cases = [case for case in pr_cases(spmd.backend.devices) if layout.even(case)]
    jax = jax_ranges(spmd, cases)
    held = read(spmd, cases, fault)
    return [f"{c}: {p}" for c, j, h in zip(cases, jax, held, strict=True) for p in layout.compare_jax(c, j, h)]


def test_jax_named_sharding_places_alike(spmd) -> None:
    problems = jax_problems(spmd)
    cases = [case for case in pr_cases(spmd.backend.devices) if layout.even(case)]
    print(f"jax NamedSharding: {len(cases)} tensors compared")
    assert not problems, "\n".join(problems[:40])


def test_jax_comparison_fails_when_torch_xla_ignores_device_order(spmd) -> None:
    """The mesh-order fault (harness.oracles.faults) in torch_xla's child only: jax must disagree."""
    problems = jax_problems(spmd, "mesh-order")
    assert problems, "jax and a torch_xla whose Mesh ignores its device order agreed on every tensor"
    print(f"fault mesh-order against jax: {len(problems)} problems; first: {problems[0][:600]}")


@pytest.mark.parametrize("fault", ["swap-shards", "pad-front", "mesh-order"])
def test_layout_oracle_fails_on_injected_fault(spmd, fault) -> None:
    """harness.oracles.faults in the child: two shards trade devices, an uneven shard's padding
    moves to its front, the mesh ignores its device order; the analytic check must say so."""
    cases = pr_cases(spmd.backend.devices)
    problems = problems_of(cases, read(spmd, cases, fault))
    assert problems, f"no tensor showed the fault {fault}: the layout oracle has lost its teeth"
    print(f"fault {fault}: {len(problems)} problems; first: {problems[0][:600]}")


@pytest.mark.nightly
def test_drawn_layouts_hold_what_their_spec_implies(spmd, request) -> None:
    from hypothesis.errors import NonInteractiveExampleWarning

    from harness.oracles import generate

    deadline = time.monotonic() + search.budget(request.config)
    strategy = generate.programs(spmd.backend.devices)
    checked, problems = 0, []
    while time.monotonic() < deadline and not problems:
        with warnings.catch_warnings():  # draws outside @given: each batch is checked whole, not shrunk
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            cases = layout.cases_from_programs([strategy.example() for _ in range(16)])
        held = read(spmd, cases)
        problems = problems_of(cases, held)
        evens = [(case, h) for case, h in zip(cases, held, strict=True) if layout.even(case)]
        if evens:
            ranges = jax_ranges(spmd, [case for case, _ in evens])
            problems += [
                f"{c}: {p}" for (c, h), j in zip(evens, ranges, strict=True) for p in layout.compare_jax(c, j, h)
            ]
        checked += len(cases)
    print(f"layout search: {checked} tensors")
    assert not problems, "\n".join(problems[:40])
