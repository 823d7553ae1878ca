"""Child side of harness.oracles.layout: what torch_xla put on each device for a marked tensor
(read back through the shard APIs the checkpoint code uses), and what jax's NamedSharding says
for the same mesh and spec."""

from __future__ import annotations

import re
from typing import Any


def _ranges(index: Any, shape: list[int]) -> list[list[int]]:
    """torch_xla's index of a shard (a tuple of slices, or Ellipsis for the whole tensor)."""
    parts = list(index) if isinstance(index, (list, tuple)) else []
    parts += [slice(None)] * (len(shape) - len(parts))
    out = []
    for part, size in zip(parts, shape, strict=True):
        start, stop, _ = part.indices(size) if isinstance(part, slice) else (int(part), int(part) + 1, 1)
        out.append([min(start, size), min(max(stop, start), size)])
    return out


def _ordinal(device: Any) -> int:
    found = re.search(r"(\d+)$", str(device))
    if found is None:
        raise ValueError(f"a shard's device {device!r} has no ordinal")
    return int(found.group(1))


def read_layout(case: dict[str, Any]) -> dict[str, Any]:
    """{"status": "ok", "devices": {ordinal: {"ranges", "bytes", "data_ok"}}} or an xla_error."""
    import torch
    import torch_xla

    from harness.oracles.interpret import Place, float_leaf

    whole = float_leaf(case["shape"], 0)
    try:
        tensor = Place(case["mesh"]).leaf(whole, case["spec"])
        shards = torch_xla._XLAC._get_local_shards([tensor])[0]
        indices = torch_xla._XLAC._get_local_shard_replica_and_indices([tensor])[0]
    except Exception as exc:
        return {"status": "xla_error", "detail": f"{type(exc).__name__}: {exc}"[:2000]}
    devices = {}
    for (data, device), (_, index) in zip(shards, indices, strict=True):
        ranges = _ranges(index, case["shape"])
        data = data.cpu()
        held = data[tuple(slice(0, stop - start) for start, stop in ranges)]
        want = whole[tuple(slice(start, stop) for start, stop in ranges)]
        devices[str(_ordinal(device))] = {
            "ranges": ranges,
            "bytes": data.numel() * data.element_size(),
            "data_ok": held.shape == want.shape and bool(torch.equal(held, want)),
        }
    return {"status": "ok", "devices": devices}


def body_read_layouts(ctx: Any, cases: list[dict[str, Any]], fault: str | None = None) -> None:
    from harness.oracles import faults

    if fault:
        ctx.poison(f"fault {fault} injected into torch_xla")
        faults.inject(fault)
    ctx.record("layouts", [read_layout(case) for case in cases])


def body_jax_layouts(ctx: Any, cases: list[dict[str, Any]]) -> None:
    """Each case's device -> ranges through jax.sharding.NamedSharding on jax's CPU devices (the
    child's XLA_FLAGS force as many as the mesh has); "skip" with the reason where jax is absent."""
    try:
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except ImportError as exc:
        ctx.record("skip", f"jax is not importable here: {exc}")
        return
    by_id = {device.id: device for device in jax.devices("cpu")}
    out = []
    for case in cases:
        mesh = case["mesh"]
        devices = np.array([by_id[i] for i in mesh["devices"]]).reshape(mesh["shape"])
        spec = [tuple(e) if isinstance(e, list) else e for e in case["spec"]]
        sharding = NamedSharding(Mesh(devices, tuple(mesh["axes"])), PartitionSpec(*spec))
        index_map = sharding.devices_indices_map(tuple(case["shape"]))
        out.append({str(device.id): _ranges(index, case["shape"]) for device, index in index_map.items()})
    ctx.record("jax", out)
