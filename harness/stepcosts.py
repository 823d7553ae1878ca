"""The cost signature of a training loop, recorded around each step. Used inside children only.

    meter = stepcosts.StepMeter(ctx, parameters=model.parameters(), optimizer=optimizer)
    for step in range(steps):
        with meter.step():
            loss = train_step(...)
            xla.sync()

Each step is measured by deltas of torch_xla's counters around it and runs under a graph name of
its own (`harness_cost_<meter>_step<N>`), which XLA gives the module it compiles, if it compiles
one: the child's set-up (harness.xla.enable_step_dumps) asked XLA to dump exactly those modules.
A step served from the compilation cache compiles nothing, so the dump, the costly part, happens
once per distinct step graph. The meter reads the partitioned module's collectives by role
(harness.costs), deletes the dump, and keeps its text for the parent, which writes it to the
results folder only when the case fails. What the signature holds is described in harness.costs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness import costs, xla
from harness.errors import HarnessUsageError

# XLA's dump file names: module_0003.<module name>.<unique id>.<stage>.txt; stage
# `before_optimizations`, or `after_optimizations` with the backend's prefix (`cpu_`, `tpu_`).
_DUMP_FILE = re.compile(
    r"^module_(?P<number>\d+)\.(?P<name>.+)\.(?P<uid>\d+)\."
    r"(?P<stage>before_optimizations|(?:[a-z]+_)?after_optimizations)\.txt$"
)
MAX_DUMP_BYTES = 64 << 20  # a partitioned module this large is not a training step of a case
_meter_numbers = itertools.count()


class StepMeter:
    def __init__(
        self,
        ctx: Any,
        label: str = costs.DEFAULT_LABEL,
        warmup: int = costs.DEFAULT_WARMUP,
        parameters: Iterable[Any] = (),
        optimizer: Any = None,
    ) -> None:
        """label: the loop's name in the case's signatures; warmup: steps allowed to compile
        (the first step compiles the graph; the second may, once the optimizer state exists)."""
        if not re.fullmatch(r"[A-Za-z0-9_]+", label):
            raise ValueError(f"StepMeter label {label!r}: letters, digits and '_' only (it names XLA modules)")
        if getattr(ctx, "bodies_before", 0):
            # An earlier case's graphs sit in this process's compile cache: step 0 would compile
            # nothing, its collectives could not be read, and the signature would depend on which
            # cases ran before in this child (serial and -n 2 would disagree).
            raise HarnessUsageError(
                f"a cost-measured loop needs a child of its own, and this one ran {ctx.bodies_before} "
                "body(ies) before: pass fresh=True to spmd.run for this body"
            )
        self.ctx = ctx
        self.label = label
        self.parameters = list(parameters)
        self.optimizer = optimizer
        self.dump_dir = os.environ.get(xla.DUMP_DIR_ENV)
        # Unique in this process, so a warm child's next case never reads this one's graphs.
        self.graph_prefix = f"{xla.STEP_GRAPH_PREFIX}{next(_meter_numbers)}_{label}_"
        self.signature: dict[str, Any] = {"warmup": warmup, "steps": [], "graphs": {}, "memory": {}}
        ctx.values.setdefault(costs.SIGNATURES_KEY, {})[label] = self.signature
        self.dumps: dict[str, str] = ctx.values.setdefault(costs.DUMPS_KEY, {})
        self.last_inputs: list[str] | None = None
        self.last_fingerprint: str | None = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        index = len(self.signature["steps"])
        self._clear_dumps()
        before = _counters()
        previous_name = xla.name_graphs(f"{self.graph_prefix}step{index}")
        try:
            yield
        finally:
            if previous_name is not None:
                xla.name_graphs(previous_name)
        after = _counters()
        entry: dict[str, Any] = {name: after[name] - before[name] for name in costs.STEP_FIELDS}
        entry["graphs"] = self._read_graphs(index, entry)
        self.signature["steps"].append(entry)
        self.signature["memory"] = self._memory()

    # ---------------------------------------------------------------- partitioned modules

    def _dump_files(self) -> list[Path]:
        if not self.dump_dir or not os.path.isdir(self.dump_dir):
            return []
        return sorted(Path(self.dump_dir).iterdir())

    def _clear_dumps(self) -> None:
        """Dumps of graphs compiled outside a step (releases that dump every module) are not ours."""
        for path in self._dump_files():
            path.unlink(missing_ok=True)

    def _read_graphs(self, index: int, entry: dict[str, Any]) -> list[str]:
        modules: dict[str, dict[str, Path]] = {}
        for path in self._dump_files():
            match = _DUMP_FILE.match(path.name)
            if match and (not xla.can_name_graphs() or match.group("name").startswith(self.graph_prefix)):
                stage = "before" if match.group("stage") == "before_optimizations" else "after"
                modules.setdefault(match.group("number"), {})[stage] = path
        names = []
        for position, number in enumerate(sorted(modules, key=int)):
            name = f"step{index}" if position == 0 else f"step{index}.{position}"
            self.signature["graphs"][name] = self._read_graph(name, modules[number], entry)
            names.append(name)
        self._clear_dumps()
        if entry["compiles"] > len(names):
            why = self._why_unread()
            for extra in range(len(names), entry["compiles"]):
                name = f"step{index}" if extra == 0 else f"step{index}.{extra}"
                self.signature["graphs"][name] = {"collectives": None, "unread": why}
                names.append(name)
            if index > 0:
                entry.setdefault("differs", []).append(f"no dump of the new graph ({why})")
        return names

    def _read_graph(self, name: str, stages: dict[str, Path], entry: dict[str, Any]) -> dict[str, Any]:
        after = stages.get("after")
        if after is None:
            return {"collectives": None, "unread": "XLA wrote no after_optimizations module"}
        text = _read_text(after)
        where = f"{after.name} (partitioned module of {name})"
        graph: dict[str, Any] = {"collectives": costs.collectives(text, self.ctx.devices or xla.num_devices(), where)}
        self.dumps[f"{self.label}/{name}"] = text
        before = stages.get("before")
        if before is not None:
            module_before = _read_text(before)
            inputs = costs.entry_inputs(module_before, before.name)
            graph["fingerprint"] = costs.fingerprint(module_before)
            if self.last_inputs is not None:
                differs = costs.input_differences(self.last_inputs, inputs) or [
                    f"inputs identical, graph fingerprint {self.last_fingerprint} -> {graph['fingerprint']}"
                ]
                entry.setdefault("differs", []).extend(differs)
            self.last_inputs, self.last_fingerprint = inputs, graph["fingerprint"]
        return graph

    def _why_unread(self) -> str:
        if not self.dump_dir:
            return "XLA dumps are off in this process (XLA_FLAGS has a --xla_dump_to of its own)"
        return "the graph was compiled before this meter ran, or XLA wrote no dump"

    # ---------------------------------------------------------------- memory

    def _memory(self) -> dict[str, int]:
        """Bytes one device holds (the one holding most), from each tensor's shape and sharding."""
        grads = [p.grad for p in self.parameters if getattr(p, "grad", None) is not None]
        state = []
        if self.optimizer is not None:
            for per_param in self.optimizer.state.values():
                state += [v for v in per_param.values() if _is_tensor(v)]
        return {"parameters": _bytes(self.parameters), "gradients": _bytes(grads), "optimizer_state": _bytes(state)}


def _counters() -> dict[str, int]:
    xla.wait_device_ops()  # an execution still queued would be counted in whichever step reads next
    return {
        "compiles": xla.counter("UncachedCompile"),
        "cache_hits": xla.counter("CachedCompile"),
        "executions": xla.counter("ExecuteReplicated") + xla.counter("ExecuteComputation"),
    }


def _read_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise costs.CostReadError(f"{path}: {size} bytes, more than a step graph's dump may be ({MAX_DUMP_BYTES})")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise costs.CostReadError(f"{path}: not UTF-8 text ({exc})") from None


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _is_xla(value: Any) -> bool:
    return _is_tensor(value) and value.device.type == "xla"


def _bytes(tensors: Iterable[Any]) -> int:
    from harness.recording import spec_of_any
    from harness.sharding import ShardingParseError, Tiled, parse_sharding

    total = 0
    for tensor in tensors:
        tiles = None
        if _is_xla(getattr(tensor, "global_tensor", tensor)):
            try:
                sharding = parse_sharding(spec_of_any(tensor))
            except ShardingParseError:
                sharding = None
            if isinstance(sharding, Tiled):
                tiles = list(sharding.data_tile_dims)
        total += costs.tensor_bytes_per_device(list(tensor.shape), tensor.element_size(), tiles)
    return total
