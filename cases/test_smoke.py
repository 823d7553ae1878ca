"""Smoke case: the whole path (child process, SPMD on CPU, spec and HLO back to the parent) works."""

from __future__ import annotations

import pytest

from harness.hlo import parameter_shardings
from harness.sharding import parse_sharding

pytestmark = pytest.mark.spmd


def body_mark_sharding_4x1(ctx) -> None:
    """Runs in the child: shard a (16, 32) tensor over an (n, 1) mesh along dim 0 (n = 4, or 8 with --spmd-devices=8)."""
    import torch
    import torch_xla.distributed.spmd as xs

    from harness import xla

    n = ctx.record("devices", xla.num_devices())
    mesh = xla.mesh((n, 1), ("fsdp", "model"))
    t = torch.randn(16, 32).to(xla.device())
    xs.mark_sharding(t, mesh, ("fsdp", None))
    ctx.record_sharding("t", xla.spec_of(t))
    ctx.record_hlo("t_times_2", xla.hlo_of([t * 2]))


@pytest.mark.needs(devices=4)
def test_mark_sharding_tiles_dim0_over_4_devices(spmd) -> None:
    result = spmd.run(body_mark_sharding_4x1)
    n = result.values["devices"]
    expected = parse_sharding(f"{{devices=[{n},1]{','.join(map(str, range(n)))}}}")
    assert parse_sharding(result.shardings["t"]) == expected
    params = parameter_shardings(result.hlo["t_times_2"])
    assert expected in params.values(), params
