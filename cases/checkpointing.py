"""A sharded checkpoint as torchprime's trainer takes it, for the training-job case bodies.

Imported only inside case bodies (child processes). `torch.distributed.checkpoint` with torch_xla's
`SPMDSavePlanner` / `SPMDLoadPlanner` in one process (`no_dist=True`: no process group), or
torch_xla's `CheckpointManager` (which needs one: a gloo group of one process is made for it).
Each process writes the shards it holds and reads back the ones its tensors' shardings ask for,
so a checkpoint saved on one mesh can be restored onto another.
"""

from __future__ import annotations

import inspect
from typing import Any

NO_PLANNERS = "torch_xla.experimental.distributed_checkpoint's SPMDSavePlanner/SPMDLoadPlanner"
NO_MANAGER = "torch_xla.experimental.distributed_checkpoint.CheckpointManager"


def missing() -> str | None:
    """What this release lacks to checkpoint a sharded state, or None."""
    try:
        from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner  # noqa: F401
    except ImportError:
        return NO_PLANNERS
    return None


# FileSystemWriter's default (one thread) is what a job runs, and on torch_xla 2.8 it fails every
# save (registry dcp-filesystem-writer-picks-torchax-device-module). A case that judges something
# else of the save (a planner bug with an entry of its own: one case, one entry per release) takes
# the threaded writer, which 2.8 runs.
DEFAULT_WRITER_THREADS = 1
OTHER_WRITER_THREADS = 2


def save(state: dict[str, Any], folder: str, writer_threads: int = DEFAULT_WRITER_THREADS) -> None:
    import torch.distributed.checkpoint as dist_cp
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    writer = dist_cp.FileSystemWriter(folder, thread_count=writer_threads)
    # torch 2.5 on: save(..., no_dist=); before, only the older save_state_dict takes it.
    if "no_dist" in inspect.signature(dist_cp.save).parameters:
        dist_cp.save(state, storage_writer=writer, planner=SPMDSavePlanner(), no_dist=True)
    else:
        dist_cp.save_state_dict(state, storage_writer=writer, planner=SPMDSavePlanner(), no_dist=True)


def load(state: dict[str, Any], folder: str) -> None:
    """Read the checkpoint into `state`'s tensors in place, each as its sharding asks."""
    import torch.distributed.checkpoint as dist_cp
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

    reader = dist_cp.FileSystemReader(folder)
    if "no_dist" in inspect.signature(dist_cp.load).parameters:
        dist_cp.load(state, storage_reader=reader, planner=SPMDLoadPlanner(), no_dist=True)
    else:
        dist_cp.load_state_dict(state, storage_reader=reader, planner=SPMDLoadPlanner(), no_dist=True)


def unsaved(state: dict[str, Any], folder: str) -> list[str]:
    """The tensors of `state` the checkpoint in `folder` holds no entry for, each with its sharding:
    a save that returned without writing them (the restore then fails on the missing key)."""
    import torch
    import torch.distributed.checkpoint as dist_cp
    from torch_xla.experimental.distributed_checkpoint._helpers import flatten_state_dict

    from harness import xla

    saved = dist_cp.FileSystemReader(folder).read_metadata().state_dict_metadata
    flat, _ = flatten_state_dict(state)
    return [
        f"{name} ({xla.spec_of(value) if value.device.type == 'xla' else 'on the CPU'})"
        for name, value in flat.items()
        if isinstance(value, torch.Tensor) and name not in saved
    ]


class ManagedCheckpoints:
    """torch_xla's CheckpointManager over `folder`, saving every `interval` steps, in a gloo
    process group of this one process (the manager coordinates its writes through one)."""

    def __init__(self, folder: str, interval: int) -> None:
        import torch.distributed as dist
        from torch_xla.experimental.distributed_checkpoint import CheckpointManager

        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        # No preemption watch: it asks the runtime for the coordinator's address, which a CPU
        # backend cannot discover (and a one-process job has no one to be preempted with).
        options = {"chkpt_on_preemption": False}
        if "chkpt_on_preemption" not in inspect.signature(CheckpointManager).parameters:
            options = {}
        self.manager = CheckpointManager(folder, save_interval=interval, **options)

    def save(self, step: int, state: dict[str, Any]) -> bool:
        return bool(self.manager.save(step, state))

    def load(self, state: dict[str, Any]) -> int:
        """Restore the latest step saved into `state`; returns that step."""
        steps = self.manager.all_steps()
        if not steps:
            raise AssertionError(f"CheckpointManager lists no saved step in {self.manager.base_path}")
        self.manager.restore(max(steps), state)
        return max(steps)


def prime(optimizer: Any) -> None:
    """Make the optimizer's state exist, so a restore can load into it in place: torch_xla's
    prime_optimizer where the release has it, else the same dummy step with zero gradients."""
    try:
        from torch_xla.experimental.distributed_checkpoint import prime_optimizer
    except ImportError:
        prime_optimizer = None
    if prime_optimizer is not None:
        prime_optimizer(optimizer)
        return
    import torch
    import torch_xla

    from harness import xla

    xla.sync()
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
            sharding = torch_xla._XLAC._get_xla_op_sharding(param)
            if sharding:
                torch_xla._XLAC._xla_mark_sharding(param.grad, sharding)
    optimizer.step()
    xla.sync()
