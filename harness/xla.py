"""torch_xla helpers for case bodies. Imported only inside child processes, never by pytest.

Version differences between torch_xla releases are absorbed here, so that a case body reads the
same on 2.6 and 2.9.
"""

from __future__ import annotations

from typing import Any, Sequence


def enable_spmd() -> None:
    """Child set-up hook: import torch_xla and switch SPMD on before any XLA tensor exists."""
    import torch_xla.runtime as xr

    xr.use_spmd()


def device() -> Any:
    import torch_xla

    # torch_xla.device() appeared in 2.5; xla_model.xla_device() is the older spelling.
    if hasattr(torch_xla, "device"):
        return torch_xla.device()
    import torch_xla.core.xla_model as xm

    return xm.xla_device()


def num_devices() -> int:
    import torch_xla.runtime as xr

    return xr.global_runtime_device_count()


def mesh(shape: Sequence[int], axis_names: Sequence[str]) -> Any:
    """A logical mesh over every device, e.g. mesh((4, 1), ("fsdp", "model"))."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    count = num_devices()
    if int(np.prod(shape)) != count:
        raise ValueError(f"mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices; the runtime has {count}")
    return xs.Mesh(np.arange(count), tuple(shape), tuple(axis_names))


def spec_of(tensor: Any) -> str:
    """The sharding spec torch_xla holds for a tensor: '' (none), '{replicated}', '{devices=[...]...}'."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)


def hlo_of(tensors: Sequence[Any]) -> str:
    """Pre-execution HLO text of the graph that computes `tensors` (call before mark_step)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))


def sync() -> None:
    """Cut the lazy graph and execute it."""
    import torch_xla

    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:
        import torch_xla.core.xla_model as xm

        xm.mark_step()


def is_fsdpv2_unit(module: Any) -> bool:
    """A module FSDPv2 wrapped (the root or an auto-wrapped block): it shards its own output."""
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    return isinstance(module, SpmdFullyShardedDataParallel)


def dtensor() -> Any:
    """The DTensor API module: `Shard`, `Replicate`, `DTensor`, `distribute_tensor`.

    Public as torch.distributed.tensor from torch 2.5; torch 2.4 has that package (for
    `.parallel`) but keeps these names in torch.distributed._tensor.
    """
    import torch.distributed.tensor as public

    if hasattr(public, "distribute_tensor"):
        return public
    import torch.distributed._tensor as private

    return private
