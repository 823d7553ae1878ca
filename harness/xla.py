"""torch_xla helpers for case bodies. Imported only inside child processes, never by pytest.

Version differences between torch_xla releases are absorbed here, so that a case body reads the
same on 2.6 and 2.9.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def enable_spmd() -> None:
    """Child set-up hook: import torch_xla and switch SPMD on before any XLA tensor exists."""
    import torch_xla.runtime as xr

    xr.use_spmd()
    enable_step_dumps()


# Step graphs harness.stepcosts names get this prefix; XLA dumps only modules whose name matches.
STEP_GRAPH_PREFIX = "harness_cost_"
DUMP_DIR_ENV = "HARNESS_XLA_DUMP_DIR"


def enable_step_dumps() -> str | None:
    """Ask XLA to dump the partitioned module of the step graphs harness.stepcosts names.

    XLA reads XLA_FLAGS once per process, at its first compilation, so this runs in the child's
    set-up, before any case compiles (seen on 2.4.0 and 2.9.0: flags set after `import
    torch_xla` and `use_spmd()` still apply). Only modules named `harness_cost_*` are dumped
    (`--xla_dump_hlo_module_re`), so other cases pay nothing. torch_xla before 2.9 cannot name a
    graph (no `_set_current_graph_name`; every module is `SyncTensorsGraph`): there every
    compiled module is dumped and stepcosts keeps those its steps compiled. A user's own
    --xla_dump_to wins: the dumps are then theirs and steps record no collectives.
    """
    import os

    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_dump_to" in flags or os.environ.get(DUMP_DIR_ENV):
        return None
    folder = scratch_folder("spmd-xla-dumps-")
    wanted = f" --xla_dump_to={folder} --xla_dump_hlo_as_text"
    if can_name_graphs():
        wanted += f" --xla_dump_hlo_module_re=^{STEP_GRAPH_PREFIX}"
    os.environ["XLA_FLAGS"] = (flags + wanted).strip()
    os.environ[DUMP_DIR_ENV] = folder
    return folder


def scratch_folder(prefix: str) -> str:
    """A new folder for what XLA writes for this child (its dumps), under the run's dump root,
    which the run removes even when the child is killed; removed at a fresh child's exit too."""
    import atexit
    import os
    import shutil
    import tempfile

    from harness.isolation.wire.protocol import XLA_DUMP_ROOT_ENV

    root = os.environ.get(XLA_DUMP_ROOT_ENV)
    if root:
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)  # an earlier body may have deleted it
        except OSError:
            root = None
    folder = tempfile.mkdtemp(prefix=prefix, dir=root if root and os.path.isdir(root) else None)
    atexit.register(shutil.rmtree, folder, True)  # a fresh child's exit; a forked one's root goes with the run
    return folder


def can_name_graphs() -> bool:
    import torch_xla

    return hasattr(torch_xla._XLAC, "_set_current_graph_name")


def name_graphs(name: str) -> str | None:
    """Name the graphs compiled from now on (XLA's module name); returns the previous name, or
    None where the release cannot name graphs."""
    import torch_xla

    if not can_name_graphs():
        return None
    previous = torch_xla._XLAC._get_current_graph_name()
    torch_xla._XLAC._set_current_graph_name(name)
    return previous


def wait_device_ops() -> None:
    """Block until every execution queued on the devices has finished (torch_xla executes
    asynchronously: its counters move when a graph has run, not when the step returned)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


def counter(name: str) -> int:
    """A torch_xla metrics counter (0 before its first increment, when torch_xla lists none)."""
    import torch_xla.debug.metrics as met

    return int(met.counter_value(name) or 0)


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
