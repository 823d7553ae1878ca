"""Child side: faults put into torch_xla in-process, to show that the differential oracle fails
when a shard's data is wrong. Never used outside a child that runs nothing afterwards (the body
poisons it).

    swap-shards  mark_sharding, then the data of the first shard and of the first shard that
                 holds different data trade places: two devices each hold the other's piece.
    pad-front    mark_sharding, then each padded shard of an unevenly sharded dim has its
                 padding put before its data instead of after it.
    mesh-order   xs.Mesh ignores the device order it is given (uses 0..n-1): a mesh's devices
                 end up on the wrong coordinates (for the metamorphic oracle's transposed mesh).
    drop-marks   every mark_sharding after the process's first does nothing (a resharding asked
                 for on an intermediate never happens, nor its collectives).
    replicated-tiled  mark_sharding with an all-None spec splits dim 0 over the mesh's first
                 axis instead of replicating (for its '' vs {replicated} relation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FAULTS = ("swap-shards", "pad-front", "mesh-order", "replicated-tiled", "drop-marks")


def inject(name: str) -> None:
    import torch_xla.distributed.spmd as xs

    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    if name == "mesh-order":
        return _ignore_device_order(xs)
    if name == "replicated-tiled":
        return _tile_replicated(xs)
    if name == "drop-marks":
        return _drop_later_marks(xs)
    installed = xs.mark_sharding
    damage = _swap_shards if name == "swap-shards" else _pad_front

    def faulty_mark_sharding(t: Any, mesh: Any, partition_spec: Any) -> Any:
        result = installed(t, mesh, partition_spec)
        _rewrite_shards(t, damage)
        return result

    xs.mark_sharding = faulty_mark_sharding


def _rewrite_shards(t: Any, damage: Callable[[list[Any], list[Any]], list[Any]]) -> None:
    """Read t's shards from its devices, damage them, write them back (the checkpoint loader's API)."""
    import torch_xla

    if torch_xla._XLAC._get_xla_sharding_spec(t) in ("", "{replicated}"):
        return  # nothing is split: every device holds the whole tensor (and loading it is refused)
    shards = torch_xla._XLAC._get_local_shards([t])[0]
    indices = [index for _, index in torch_xla._XLAC._get_local_shard_replica_and_indices([t])[0]]
    data = [tensor for tensor, _ in shards]
    devices = [device for _, device in shards]
    torch_xla._XLAC._load_local_shards(t, damage(data, indices), devices)


def _swap_shards(data: list[Any], indices: list[Any]) -> list[Any]:
    for j in range(1, len(data)):
        if data[j].shape == data[0].shape and not bool((data[j] == data[0]).all()):
            data[0], data[j] = data[j], data[0]
            break
    return data


def _pad_front(data: list[Any], indices: list[Any]) -> list[Any]:
    import torch

    out = []
    for tensor, index in zip(data, indices, strict=True):
        for dim, part in enumerate(index if isinstance(index, (list, tuple)) else []):
            held = len(range(*part.indices(10**9))) if isinstance(part, slice) else tensor.shape[dim]
            padding = tensor.shape[dim] - held
            if 0 < padding < tensor.shape[dim]:
                tensor = torch.roll(tensor, padding, dim)
        out.append(tensor)
    return out


def _ignore_device_order(xs: Any) -> None:
    installed = xs.Mesh.__init__

    def faulty_init(self: Any, device_ids: Any, mesh_shape: Any, axis_names: Any = None) -> None:
        import numpy as np

        installed(self, np.sort(np.asarray(device_ids).ravel()), mesh_shape, axis_names)

    xs.Mesh.__init__ = faulty_init


def _tile_replicated(xs: Any) -> None:
    installed = xs.mark_sharding

    def faulty_mark_sharding(t: Any, mesh: Any, partition_spec: Any) -> Any:
        if t.dim() and all(entry is None for entry in partition_spec):
            partition_spec = (0,) + tuple(partition_spec[1:])
        return installed(t, mesh, partition_spec)

    xs.mark_sharding = faulty_mark_sharding


def _drop_later_marks(xs: Any) -> None:
    installed = xs.mark_sharding
    calls = []

    def faulty_mark_sharding(t: Any, mesh: Any, partition_spec: Any) -> Any:
        calls.append(1)
        return installed(t, mesh, partition_spec) if len(calls) == 1 else None

    xs.mark_sharding = faulty_mark_sharding
