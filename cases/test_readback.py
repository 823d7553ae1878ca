"""Reading a sharded tensor back: the computation torch_xla compiles for it (pytorch/xla#9733).

`tensor.cpu()` of a sharded tensor makes torch_xla compile a small computation of its own,
`ReplicateShardedData` (its parameter carries the tensor's sharding, its root is replicated), and
run it to gather the shards. Tenstorrent's tt-xla fork reported (#9733, closed upstream) that an
output sharded `(None, "model")` over a 2x4 `("batch", "model")` mesh was gathered by a
computation compiled on a 4x2 mesh: the mesh was rebuilt from the sharding's tile assignment, and
the devices of each gather group no longer were the mesh's.

The guard, on any build: the `ReplicateShardedData` module XLA compiled (read from XLA's own dump
of it) takes the tensor's sharding as its parameter's, and its collectives gather over the mesh's
groups (the devices along the `model` axis, one group per `batch` index), computed here from the
mesh (harness.tiles) without torch_xla's code. Measured on CPU: every release 2.4.0-2.9.0 keeps
both, so the registry entry (`replicate-sharded-data-distorted-mesh`) is "reported, not
reproduced": the distortion came from the Shardy conversion of the fork's build, which none of
these releases' `_XLAC` holds, nor can any of them be switched to it (no `CONVERT_SHLO_TO_SHARDY`
or Shardy flag in their `_XLAC`; 2.5.1-2.8.0 hold XLA's `use_shardy_partitioner` option, which
torch_xla never sets); the releases win. The self-test reads back a tensor that has the
distorted sharding (the mesh rebuilt from the tile assignment) while expecting the mesh's: the
case fails with the entry's signature.
"""

from __future__ import annotations

import pytest

# Slow: each body is a child of its own that sets XLA_FLAGS before torch_xla starts (8-9 s on 2 cores).
pytestmark = [pytest.mark.spmd, pytest.mark.slow, pytest.mark.needs(devices=4)]

MODULE = "ReplicateShardedData"
DISTORTED = "the ReplicateShardedData computation compiled to read back a sharded tensor"


def _dump_flags() -> str:
    """Ask XLA to dump the read-back computation, before torch_xla compiles anything: XLA reads
    XLA_FLAGS once per process (the harness's own step dumps are off then: a body's own
    --xla_dump_to wins, harness.xla.enable_step_dumps)."""
    import os

    from harness import xla

    folder = xla.scratch_folder("spmd-readback-dumps-")  # under the run's dump root: swept if this child is killed
    wanted = f"--xla_dump_to={folder} --xla_dump_hlo_as_text --xla_dump_hlo_module_re={MODULE}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {wanted}".strip()
    return folder


def _read_back_modules(folder: str) -> dict[str, str]:
    """The newest ReplicateShardedData module XLA dumped: {'before': text, 'after': text}."""
    import os
    import re

    found: dict[str, dict[str, str]] = {}
    for name in sorted(os.listdir(folder)):
        # module_0001.ReplicateShardedData.6.before_optimizations.txt, ...cpu_after_optimizations.txt
        match = re.match(
            r"module_(\d+)\.ReplicateShardedData[.\w]*?\.(?:\w+_)?(before|after)_optimizations\.txt$", name
        )
        if match:
            with open(os.path.join(folder, name), errors="replace") as fh:
                found.setdefault(match.group(1), {})[match.group(2)] = fh.read()
    if not found:
        raise AssertionError(f"XLA dumped no {MODULE} module in {folder} (files: {sorted(os.listdir(folder))[:8]})")
    return found[max(found, key=int)]


def expected_groups(mesh_shape, spec) -> list[list[int]]:
    """The devices a read-back gathers over: one group per replica of a tile, the devices that
    hold the tiles' copies at that position (harness.tiles' oracle of the mesh)."""
    from harness.tiles import holders_from_mesh

    devices = list(range(mesh_shape[0] * mesh_shape[1]))
    holders = holders_from_mesh(mesh_shape, devices, ("batch", "model"), spec)
    copies = len(next(iter(holders.values())))
    return sorted(sorted(h[r] for h in holders.values()) for r in range(copies))


def body_read_back_sharded_output(ctx, distort: bool = False) -> None:
    """A (None, 'model')-sharded output of a (2, n/2) ('batch', 'model') mesh read back with
    .cpu(); the dumped ReplicateShardedData module is held to the tensor's sharding and the
    mesh's groups. distort: read back the same values sharded over the mesh rebuilt from the tile
    assignment (what #9733's build compiled), the expectations unchanged."""
    import numpy as np

    folder = _dump_flags()
    import torch
    import torch_xla.distributed.spmd as xs

    from harness import costs, hlo, xla
    from harness.sharding import canonical_text

    xla.enable_spmd()
    n = xla.num_devices()
    mesh_shape, spec = (2, n // 2), (None, "model")
    mesh = xs.Mesh(np.arange(n), mesh_shape, ("batch", "model"))
    x_cpu = torch.randn(8, 4 * n)
    x = x_cpu.to(xla.device())
    xs.mark_sharding(x, mesh, spec)
    output = x * 2
    xs.mark_sharding(output, mesh, spec)
    xla.sync()
    expected_spec = ctx.record_sharding("output", xla.spec_of(output))
    read = output
    if distort:
        # The mesh rebuilt from the tile assignment: its dims (n/2 tiles, 2 copies) as a mesh of its
        # own over the devices in order, the sharded dim cut over its first axis.
        rebuilt = xs.Mesh(np.arange(n), (n // 2, 2), ("model", "batch"))
        read = (x * 2).to(xla.device())
        xs.mark_sharding(read, rebuilt, spec)
        xla.sync()
        ctx.record("distorted_spec", xla.spec_of(read))
    values = read.cpu()
    if not torch.allclose(values, x_cpu * 2):
        raise AssertionError("the read-back values differ from the tensor's")

    modules = _read_back_modules(folder)
    problems = []
    parameter = hlo.parameter_shardings(modules["before"]).get(0)
    compiled_spec = canonical_text(str(parameter)) if parameter is not None else "none"
    compiled_spec = ctx.record("compiled_parameter_sharding", compiled_spec)
    if compiled_spec != canonical_text(expected_spec):
        problems.append(
            f"takes its parameter sharded {compiled_spec}, the tensor is sharded {canonical_text(expected_spec)}"
        )
    wanted = expected_groups(mesh_shape, spec)
    gathers = costs.collectives(modules["after"], n, f"{MODULE} after optimizations")
    ctx.record("collectives", gathers)
    for gather in gathers:
        groups = sorted(sorted(g) for g in costs.replica_groups(gather["replica_groups"], n))
        if groups != wanted:
            mesh_groups = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in wanted) + "}"
            problems.append(f"{gather['kind']} over {gather['replica_groups']}, the mesh's groups are {mesh_groups}")
    if not gathers:
        problems.append("has no collective: nothing gathered the shards")
    if problems:
        raise AssertionError(
            f"{DISTORTED} on a ({mesh_shape[0]}, {mesh_shape[1]}) ('batch', 'model') mesh " + "; ".join(problems)
        )


@pytest.mark.known_bug("replicate-sharded-data-distorted-mesh")
def test_read_back_is_compiled_for_the_tensors_sharding_and_mesh(spmd) -> None:
    result = spmd.run(body_read_back_sharded_output, preload=False)
    assert result.values["collectives"]


@pytest.mark.no_sharding_baseline("records the tensor's sharding only to compare it with the distorted one")
def test_a_read_back_on_a_rebuilt_mesh_fails_with_the_entry_signature(spmd) -> None:
    """Self-test: the same read-back of a tensor sharded over the mesh rebuilt from its tile
    assignment (what #9733's build compiled) fails the checks with the entry's signature."""
    from harness.registry import get_entry

    result = spmd.run(body_read_back_sharded_output, distort=True, preload=False, check=False)
    assert result.outcome == "error", f"the distorted read-back passed the checks: {result.values}"
    entry = get_entry("replicate-sharded-data-distorted-mesh")
    assert entry.matching_signature(result.error.evidence), result.error.evidence
    assert "the mesh's groups are" in result.error.evidence, result.error.evidence
