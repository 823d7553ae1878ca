"""Faults at the sites the training job relies on, put back into torch_xla in a child.

Imported only inside processes that import torch_xla: case bodies of the self-tests of
cases/test_training_job.py, and every child and fork server of a run under
scripts/run-with-fault.sh. Each fault replaces one torch_xla (or torch) function in this process
with one that does what a regressed build would; the self-test shows the check that guards the
site goes red naming it. Nothing is patched on disk.

    loader-keeps-batches          xm.send_cpu_data_to_device (what MpDeviceLoader calls per batch)
                                  keeps every batch it sent alive
    transfer-copies-per-device    torch_xla._XLAC._xla_tensors_from_aten (the sharded transfer)
                                  stages a whole copy of each tensor per device on the host
    clip-over-one-shard           clip_grad_norm_ of XLA gradients computes the norm of each
                                  gradient's first shard (device 0's rows), not the whole
    checkpoint-without-remat      torch_xla.utils.checkpoint.checkpoint runs the layer as is:
                                  activations kept, nothing recomputed in the backward
    restore-permutes-shards       XLAShardedTensor.load_local_shards_ gives each device the shard
                                  of the device after it (a restore that mixes up shard order)
    restore-replicates-shards     XLAShardedTensor.load_local_shards_ writes the assembled tensor
                                  back replicated (the numbers kept, the sharding lost)
    restore-keeps-host-copies     XLAShardedTensor.load_local_shards_ keeps the host shards it loaded
    sync-per-fsdp-block           every FSDPv2-wrapped module's forward ends in a sync: the step
                                  graph splits in as many pieces as there are blocks (a regressed
                                  build's kind, for scripts/run-with-fault.sh: what the findings say)
    no-param-aliasing             the compiled step no longer aliases updated parameters onto their
                                  input buffers (XLA_ENABLE_PARAM_ALIASING=0 set as torch_xla is
                                  imported): a device holds old and new parameters during every step
    mark-sharding-leaks-native    every xs.mark_sharding call allocates 256 KiB of native memory it
                                  never frees (the native leak of #49's build B)
    einsum-linear-falls-back-to-matmul
                                  apply_xla_patch_to_nn_linear's layers call F.linear again (a
                                  reshape to 2-D): a sequence split no longer survives them
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

KEPT: list[Any] = []  # what a leaking fault holds on to


def reintroduce(name: str) -> None:
    try:
        fault = FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}") from None
    fault()


def loader_keeps_batches() -> None:
    import torch_xla.core.xla_model as xm

    sent = xm.send_cpu_data_to_device

    def send_and_keep(*args: Any, **kwargs: Any) -> Any:
        result = sent(*args, **kwargs)
        KEPT.append(result)
        return result

    xm.send_cpu_data_to_device = send_and_keep


def transfer_copies_per_device() -> None:
    import torch_xla
    import torch_xla.runtime as xr

    transfer = torch_xla._XLAC._xla_tensors_from_aten

    def copy_per_device(tensors: Any, devices: Any, shardings: Any = None, *rest: Any) -> Any:
        staged = [t.clone() for t in tensors for _ in range(xr.global_runtime_device_count())] if shardings else []
        try:
            return transfer(tensors, devices, shardings, *rest)
        finally:
            del staged

    torch_xla._XLAC._xla_tensors_from_aten = copy_per_device


def clip_over_one_shard() -> None:
    import torch

    from harness import xla

    clip = torch.nn.utils.clip_grad_norm_

    def norm_of_first_shard(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads or grads[0].device.type != "xla":
            return clip(parameters, max_norm, *args, **kwargs)
        devices = xla.num_devices()

        def first_shard(grad: Any) -> Any:
            dim = max(range(grad.dim()), key=lambda d: grad.shape[d])
            return grad.narrow(dim, 0, max(1, grad.shape[dim] // devices))

        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(first_shard(g)) for g in grads]))
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(scale)
        return total

    torch.nn.utils.clip_grad_norm_ = norm_of_first_shard


def checkpoint_without_remat() -> None:
    import torch_xla.utils.checkpoint as checkpointing

    def run_as_is(function: Any, *args: Any, **kwargs: Any) -> Any:
        return function(*args)

    checkpointing.checkpoint = run_as_is


def scan_ignores_partition_fn() -> None:
    """scan_layers' scan partitions the layer's graph with AOTAutograd's default, whatever the
    caller's partition_fn: every activation saved, nothing rematerialized."""

    def patch(module: Any) -> None:
        from functorch.compile import default_partition

        scan = module.scan

        def scan_default_partition(*args: Any, **kwargs: Any) -> Any:
            kwargs["partition_fn"] = default_partition
            return scan(*args, **kwargs)

        module.scan = scan_default_partition

    when_imported("torch_xla.experimental.scan_layers", patch)


def restore_permutes_shards() -> None:
    from torch_xla.distributed.spmd import XLAShardedTensor

    load = XLAShardedTensor.load_local_shards_

    def load_rotated(self: Any, shards: list[Any]) -> None:
        datas = [s.data for s in shards]
        rotated = datas[1:] + datas[:1]
        if all(a.shape == b.shape for a, b in zip(datas, rotated)):
            for shard, data in zip(shards, rotated):
                shard.data = data
        load(self, shards)

    XLAShardedTensor.load_local_shards_ = load_rotated


def restore_replicates_shards() -> None:
    import torch
    import torch_xla
    from torch_xla.distributed.spmd import XLAShardedTensor

    load = XLAShardedTensor.load_local_shards_

    def load_replicated(self: Any, shards: list[Any]) -> None:
        load(self, shards)
        whole = self.global_tensor.cpu()
        torch_xla._XLAC._xla_clear_sharding(self.global_tensor)
        with torch.no_grad():
            self.global_tensor.copy_(whole.to(self.global_tensor.device))
        torch_xla.sync()

    XLAShardedTensor.load_local_shards_ = load_replicated


def restore_keeps_host_copies() -> None:
    from torch_xla.distributed.spmd import XLAShardedTensor

    load = XLAShardedTensor.load_local_shards_

    def load_and_keep(self: Any, shards: list[Any]) -> None:
        load(self, shards)
        KEPT.extend(shards)

    XLAShardedTensor.load_local_shards_ = load_and_keep


def sync_per_fsdp_block() -> None:
    import torch_xla.core.xla_model as xm

    def patch(module: Any) -> None:
        forward = module.SpmdFullyShardedDataParallel.forward

        def forward_then_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = forward(self, *args, **kwargs)
            xm.mark_step()  # torch_xla.sync() where it exists; mark_step on every release
            return output

        module.SpmdFullyShardedDataParallel.forward = forward_then_sync

    # FSDPv2's module reads the environment as it is imported: a fork server must not import it
    # (it refuses to serve), so the fault waits for the case that does.
    when_imported("torch_xla.experimental.spmd_fully_sharded_data_parallel", patch)


def no_param_aliasing() -> None:
    import os

    # Read by torch_xla when it compiles, in this process and in every child a fork server forks
    # (they keep its environment): the build's compile stops donating the parameters.
    os.environ["XLA_ENABLE_PARAM_ALIASING"] = "0"


LEAK_BYTES_PER_MARK = 256 << 10


def mark_sharding_leaks_native() -> None:
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def patch(module: Any) -> None:
        mark_sharding = module.mark_sharding

        def leaking_mark_sharding(*args: Any, **kwargs: Any) -> Any:
            block = libc.malloc(LEAK_BYTES_PER_MARK)  # never freed: C memory no Python object holds
            if block:
                libc.memset(block, 1, LEAK_BYTES_PER_MARK)  # touched, so it is resident
            return mark_sharding(*args, **kwargs)

        module.mark_sharding = leaking_mark_sharding
        package = sys.modules.get("torch_xla.distributed.spmd")
        if package is not None and getattr(package, "mark_sharding", None) is mark_sharding:
            package.mark_sharding = leaking_mark_sharding

    when_imported("torch_xla.distributed.spmd.xla_sharding", patch)


def einsum_linear_falls_back_to_matmul() -> None:
    def patch(module: Any) -> None:
        import torch

        # EinsumLinear.forward calls the module's global by name: F.linear is what nn.Linear runs
        module.xla_patched_nn_linear_forward = lambda layer, x: torch.nn.functional.linear(x, layer.weight, layer.bias)

    when_imported("torch_xla.distributed.spmd.xla_sharding", patch)


def when_imported(name: str, patch: Callable[[Any], None]) -> None:
    """patch(module) once `name` is imported in this process (now, if it is already)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_patch(module: Any) -> None:
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _PatchOnImport())


FAULTS = {
    "loader-keeps-batches": loader_keeps_batches,
    "transfer-copies-per-device": transfer_copies_per_device,
    "clip-over-one-shard": clip_over_one_shard,
    "checkpoint-without-remat": checkpoint_without_remat,
    "scan-ignores-partition-fn": scan_ignores_partition_fn,
    "restore-permutes-shards": restore_permutes_shards,
    "restore-replicates-shards": restore_replicates_shards,
    "restore-keeps-host-copies": restore_keeps_host_copies,
    "sync-per-fsdp-block": sync_per_fsdp_block,
    "no-param-aliasing": no_param_aliasing,
    "mark-sharding-leaks-native": mark_sharding_leaks_native,
    "einsum-linear-falls-back-to-matmul": einsum_linear_falls_back_to_matmul,
}
