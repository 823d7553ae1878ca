"""The job around the step, as torchprime's trainer runs it, for the training-job case bodies.

Imported only inside case bodies (child processes). A `Job` is a cases.decoder.Decoder on a mesh
layout, wrapped with FSDPv2, with AdamW (or Adafactor), a warm-up LR schedule, `clip_grad_norm_` (its norm
returned) and `clip_grad_value_`, each layer under torch_xla's activation checkpointing, the step
under `torch_xla.compile(full_graph=True)`. Each part is used where the release has it; what it
lacks is named in `Job.omitted` (the case reports it) and the job runs without it.

The CPU reference (`reference_run`) is the same model, optimizer, schedule and clipping in eager
torch, unsharded.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cases import decoder

LEARNING_RATE = 3e-3
WARMUP_STEPS = 3  # the factor (step + 1) / WARMUP_STEPS never makes the rate 0 or 1 (XLA constants)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 0.5  # below the decoder's early gradient norms: the clip scales every step
MAX_GRAD_VALUE = 0.02  # below its largest gradient entries: the value clip cuts some
ROWS_PER_DEVICE = 2
ADAFACTOR_EPS = 1.1920928955078125e-07  # float32's machine epsilon, torch.optim.Adafactor's eps1
# The job's mesh layouts: the 1-D FSDPv2 mesh, torchprime's fsdp x tensor (tensor=2), and the
# 2-slice HSDP mesh of the nightly GKE job and torchprime's multi-slice runs (`dcn_mesh.data=2
# ici_mesh.fsdp=n/2`: parameters cut over fsdp within a slice, replicated across the slices),
# torch_xla's own HybridMesh (harness.meshes: on CPU the devices are described as two slices).
LAYOUTS = ("fsdp", "fsdp-tensor", "hybrid-data")


def mesh_of(layout: str, ctx: Any = None) -> Any:
    """The layout's mesh; with ctx, a hybrid mesh's shape and device order are recorded ("mesh")."""
    from harness import meshes, xla

    n = xla.num_devices()
    if layout == "fsdp":
        return xla.mesh((n,), ("fsdp",))
    if layout == "fsdp-tensor":
        if n % 2:
            raise ValueError(f"layout fsdp-tensor needs an even device count, got {n}")
        return xla.mesh((n // 2, 2), ("fsdp", "tensor"))
    if layout == "hybrid-data":
        return meshes.build(layout, ctx)
    raise ValueError(f"unknown job layout {layout!r}; known: {', '.join(LAYOUTS)}")


def fsdpv2_kwargs(layout: str) -> dict[str, Any]:
    """What FSDPv2 gets besides module and mesh: the data axis of a data-parallel layout."""
    from harness import meshes

    return meshes.get(layout).fsdpv2_kwargs() if layout in meshes.LAYOUTS else {}


def batch_spec(layout: str) -> tuple[Any, ...]:
    """A batch of token rows: over every data-like axis, as torchprime's input sharding."""
    from harness import meshes

    return meshes.get(layout).batch_spec(2) if layout in meshes.LAYOUTS else ("fsdp", None)


def warmup_factor(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP_STEPS)


def clip(parameters: list[Any]) -> Any:
    """torchprime's clipping: the norm first (returned, logged), then values."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
    torch.nn.utils.clip_grad_value_(parameters, MAX_GRAD_VALUE)
    return norm


def adamw(parameters: Any) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_factor)


class Adafactor(torch.optim.Optimizer):
    """Adafactor (Shazeer and Stern, 2018), torchprime's other optimizer, as an XLA step runs it: a
    matrix's second moment kept as its row and column means (state of other shapes than the
    parameter's, sharded as XLA propagates it), a relative step size, update clipping and decoupled
    weight decay, every factor a tensor. torch.optim.Adafactor (torch 2.5 on) reads each parameter's
    norm back to the host every step (`.item()`): a device read inside the step, which
    `torch_xla.compile(full_graph=True)` refuses ("Unexpected execution happens inside the compiled
    function", seen on 2.9.0), and a graph break per parameter without it."""

    def __init__(self, params: Any, lr: float, weight_decay: float, decay: float = -0.8) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "decay": decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)

    def _update(self, param: Any, group: dict[str, Any]) -> None:
        state = self.state[param]
        grad = param.grad
        if not state:
            state["step"] = 0  # counted on the host: a step's scalars are graph inputs, never read back
            if param.dim() >= 2:
                state["row_var"] = torch.zeros_like(grad).mean(-1, keepdim=True)
                state["col_var"] = torch.zeros_like(grad).mean(-2, keepdim=True)
            else:
                state["variance"] = torch.zeros_like(grad)
        state["step"] += 1
        step = state["step"]
        weight = step ** group["decay"]  # how much of this step's squared gradient the average takes
        squared = grad.square()
        if param.dim() >= 2:
            state["row_var"].lerp_(squared.mean(-1, keepdim=True), weight)
            state["col_var"].lerp_(squared.mean(-2, keepdim=True), weight)
            row_mean = state["row_var"].mean(-2, keepdim=True).clamp_min(ADAFACTOR_EPS)
            variance = state["row_var"] * state["col_var"] / row_mean
        else:
            state["variance"].lerp_(squared, weight)
            variance = state["variance"]
        # Floored as torch.optim.Adafactor floors it: an embedding row no token of the batch uses has a
        # zero gradient and zero variance, and rsqrt(0) * 0 is NaN. (Adding 1e-30 to the squares is
        # not enough: their products are subnormal, which XLA's CPU backend flushes to zero.)
        update = grad * variance.clamp_min(ADAFACTOR_EPS * ADAFACTOR_EPS).rsqrt()
        update = update / torch.clamp_min(update.norm() / update.numel() ** 0.5, 1.0)  # its RMS at most 1
        scale = torch.clamp_min(param.norm() / param.numel() ** 0.5, 1e-3) * min(group["lr"], step**-0.5)
        param.mul_(1 - group["lr"] * group["weight_decay"])
        param.sub_(scale * update)


def adafactor(parameters: Any) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = Adafactor(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_factor)


OPTIMIZERS: dict[str, Callable[[Any], tuple[torch.optim.Optimizer, Any]]] = {"adamw": adamw, "adafactor": adafactor}


def full_matmul_precision() -> None:
    """f32 matmuls in full precision, as the CPU reference computes them. A TPU's default runs them
    in one bf16 pass, about 1e-3 off: the job's numbers would miss the reference's tolerance for
    that alone. The CPU backend computes in full precision either way."""
    import torch_xla

    native = torch_xla._XLAC
    if hasattr(native, "_xla_set_mat_mul_precision"):  # 2.6 on
        native._xla_set_mat_mul_precision("highest")
    elif hasattr(native, "_xla_set_use_full_mat_mul_precision"):
        native._xla_set_use_full_mat_mul_precision(True)


def missing_parts() -> dict[str, str]:
    """What this release lacks of the job's optional parts, each named with what it is."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    missing = {}
    compile_fn = getattr(torch_xla, "compile", None)
    if compile_fn is None or not {"full_graph", "name"} <= set(inspect.signature(compile_fn).parameters):
        missing["compile"] = "torch_xla.compile(fn, full_graph=..., name=...)"
    try:
        from torch_xla.utils.checkpoint import checkpoint  # noqa: F401
    except ImportError:
        missing["remat"] = "torch_xla.utils.checkpoint.checkpoint"
    if "run_async" not in inspect.signature(xm.add_step_closure).parameters:
        missing["async_closure"] = "xm.add_step_closure(..., run_async=True)"
    try:
        from torch_xla.experimental.scan_layers import scan_layers
    except ImportError:
        missing["scan"] = "torch_xla.experimental.scan_layers (from 2.6.0)"
    else:
        if "is_layer_pure" not in inspect.signature(scan_layers).parameters:
            # without it every call traces the layer again (registry scan-layers-retrace-keeps-fx-sources)
            missing["scan"] = "scan_layers(..., is_layer_pure=True) (from 2.8.0)"
    return missing


@dataclasses.dataclass
class Job:
    """A decoder trained on `layout`'s mesh: model (FSDPv2-wrapped), optimizer, schedule, step."""

    layout: str
    seed: int = 0
    omitted: dict[str, str] = dataclasses.field(default_factory=missing_parts)
    ctx: Any = None  # a case's context: the mesh of a hybrid layout is recorded there
    optimizer_name: str = "adamw"  # a key of OPTIMIZERS; a case asking for one the release lacks skips
    # The loader's input sharding with minibatch=True: each process loads only its own rows (the
    # multi-host input path; with one process, its rows are the global batch).
    minibatch: bool = False
    size: str = "tiny"  # a key of cases.jobsize.SIZES (--spmd-job-size)
    # torchprime's scan: the layers run as one traced layer (scan_layers, is_layer_pure, 2.8 on),
    # rematerialized inside the scan by min_cut_rematerialization_partition, instead of one
    # checkpoint per layer. A release without it has "scan" in `omitted`.
    scan: bool = False
    # The parameters' dtype (and so the gradients' and AdamW's state): torchprime trains bf16 models.
    dtype: str = "float32"

    def __post_init__(self) -> None:
        import torch_xla.distributed.spmd as xs
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        from harness import xla

        full_matmul_precision()
        if not self.scan:
            self.omitted.pop("scan", None)
        elif "scan" not in self.omitted:
            self.omitted.update(scan_needs())
        self.config = decoder.config_of(self.size)
        self.mesh = mesh_of(self.layout, self.ctx)
        self.model = decoder.build_decoder(self.seed, self.config).to(getattr(torch, self.dtype))
        self.reference = copy.deepcopy(self.model)  # the CPU copy, before anything moves or is marked
        if self.layout == "fsdp-tensor":
            # torchprime's fsdp x tensor specs; FSDPv2 leaves a parameter marked already as it is.
            self.model.to(xla.device())
            for name, param in self.model.named_parameters():
                xs.mark_sharding(param, self.mesh, decoder.tensor_parallel_spec(name))
        if self.scan and "scan" not in self.omitted:
            self.model.scan = scan_rematerialized
        elif "remat" not in self.omitted:
            self.model.remat = rematerialize
        self.wrapped = SpmdFullyShardedDataParallel(self.model, mesh=self.mesh, **fsdpv2_kwargs(self.layout))
        self.parameters = list(self.wrapped.parameters())
        self.optimizer, self.scheduler = OPTIMIZERS[self.optimizer_name](self.parameters)
        self.batch_spec = batch_spec(self.layout)

    def step(self, tokens: Any) -> tuple[Any, Any]:
        """One training step: (loss, grad norm) as XLA tensors, executed."""
        if "compile" in self.omitted:
            loss, norm = self.train_step(tokens)
            from harness import xla

            xla.sync()
            return loss, norm
        import torch_xla

        # The meter names each step's graph (the module XLA dumps); compile keeps that name.
        current = getattr(torch_xla._XLAC, "_get_current_graph_name", None)
        name = current() if current is not None else None
        return torch_xla.compile(self.train_step, full_graph=True, name=name)(tokens)

    def train_step(self, tokens: Any) -> tuple[Any, Any]:
        self.optimizer.zero_grad()
        loss = decoder.next_token_loss(self.wrapped, tokens)
        loss.backward()
        norm = clip(self.parameters)
        self.optimizer.step()
        self.scheduler.step()
        return loss, norm

    def loader(self, tokens: torch.Tensor, gate: Gate | None = None, **prefetch: int) -> Any:
        """torchprime's loader: a DataLoader of `tokens` rows through MpDeviceLoader, each batch
        sharded on its way by `input_sharding` (xm.send_cpu_data_to_device underneath). With a
        gate, its thread reads a batch only when the gate lets it."""
        import torch_xla.distributed.parallel_loader as pl
        import torch_xla.distributed.spmd as xs
        from torch.utils.data import DataLoader, TensorDataset

        from harness import xla

        rows = ROWS_PER_DEVICE * xla.num_devices()
        cpu_loader: Any = DataLoader(TensorDataset(tokens), batch_size=rows, shuffle=False)
        if gate is not None:
            cpu_loader = gate.over(cpu_loader)
        spec = xs.ShardingSpec(self.mesh, self.batch_spec, minibatch=self.minibatch)
        return pl.MpDeviceLoader(cpu_loader, xla.device(), input_sharding=spec, **prefetch)

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint holds: the model's and the optimizer's tensors, and the step."""
        optimizer_state = self.optimizer.state_dict()["state"]
        return {
            "model": self.wrapped.state_dict(),
            "optim": {str(index): dict(state) for index, state in optimizer_state.items()},
            "progress": {"step": torch.tensor(step)},
        }

    def resume_schedule(self, step: int) -> None:
        """The schedule as it was after `step` steps (it holds no tensor to checkpoint)."""
        for _ in range(step):
            self.scheduler.step()


class Gate:
    """Lets MpDeviceLoader's thread read one batch per `allow()`. Its thread sends batches ahead
    of the step: a metered step that ends while one is on its way counts it alive or not, by
    timing. Allowed at the start of each step, the batch the step takes is the only one sent."""

    def __init__(self) -> None:
        import threading

        self.permits = threading.Semaphore(0)
        self.opened = False

    def over(self, batches: Any) -> Any:
        gate = self

        class Gated:
            def __len__(self) -> int:
                return len(batches)

            def __iter__(self) -> Iterator[Any]:
                for batch in batches:
                    if not gate.opened:
                        gate.permits.acquire()
                    yield batch

        return Gated()

    def allow(self) -> None:
        self.permits.release()

    def open(self) -> None:
        """No more gating (before the loader is closed: its thread may be waiting)."""
        self.opened = True
        self.permits.release()


def close(loader: Any, gate: Gate | None = None) -> None:
    """Stop MpDeviceLoader's threads (a loader read partly keeps them waiting on its queues)."""
    if gate is not None:
        gate.open()
    parallel = getattr(loader, "_parallel_loader", None)
    if parallel is not None:
        parallel.close()


def rematerialize(layer: Any, x: Any) -> Any:
    """torch_xla's activation checkpointing of one layer, as torchprime applies it."""
    from torch_xla.utils.checkpoint import checkpoint

    # No dropout: the RNG state need not be kept, and keeping it reads the device mid-trace.
    return checkpoint(layer, x, use_reentrant=True, preserve_rng_state=False)


def scan_needs() -> dict[str, str]:
    """What scan's backward lacks here: it lowers xs.shard_as through JAX (2.8 on), which needs
    jax and torch_xla's bundled torchax (2.9.0's imports flax, which nothing installs: it is stood
    in for, as installing flax does; registry scan-backward-bundled-torchax-needs-flax)."""
    from cases import jaxneeds

    if jaxneeds.jax_version() is None:
        return {"scan": "jax (scan's backward lowers xs.shard_as with it: pip install torch_xla[pallas])"}
    jaxneeds.stand_in_for_flax()
    return {}


def scan_rematerialized(layers: Any, x: Any, partition_fn: Any = None) -> Any:
    """All layers as one traced layer, rematerialized inside the scan, as torchprime's
    `add_activation_checkpointing_and_scan` runs them with scan on."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch_xla.experimental.scan_layers import scan_layers

    partition_fn = partition_fn or min_cut_rematerialization_partition
    return scan_layers(layers, x, partition_fn=partition_fn, is_layer_pure=True)


def logged_by_closures(job: Job, loss: Any, norm: Any, losses: list[float], norms: list[float]) -> None:
    """Loss and grad norm read after the step by a step closure (async where the release can)."""
    import torch_xla.core.xla_model as xm

    # The tensors go in a box the closure empties: torch_xla's async event loop keeps the closure it
    # ran (and so its arguments) in a local until it takes the next one, so a step's loss and norm
    # stayed alive into the next step or not, by timing (live tensors 66 or 68 after step 1).
    held = [loss, norm]

    def log(box: list[Any]) -> None:
        values = [tensor.item() for tensor in box]
        box.clear()
        losses.append(values[0])
        norms.append(values[1])

    if "async_closure" in job.omitted:
        xm.add_step_closure(log, (held,))
    else:
        xm.add_step_closure(log, (held,), run_async=True)


def reference_run(
    model: Any, batches: Iterator[torch.Tensor], optimizer_name: str = "adamw"
) -> tuple[list[float], list[float]]:
    """The same training, eager and unsharded on the CPU: losses and grad norms per step."""
    parameters = list(model.parameters())
    optimizer, scheduler = OPTIMIZERS[optimizer_name](parameters)
    losses, norms = [], []
    for tokens in batches:
        optimizer.zero_grad()
        loss = decoder.next_token_loss(model, tokens)
        loss.backward()
        norms.append(float(clip(parameters)))
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, norms


def parameter_drift(job: Job, reference: Any) -> dict[str, float]:
    """Largest absolute difference of each parameter from the reference's."""
    return {
        name: (param.detach().cpu() - cpu_param.detach()).abs().max().item()
        for (name, cpu_param), param in zip(reference.named_parameters(), job.model.parameters())
    }


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:.0f} s")
        time.sleep(0.01)
