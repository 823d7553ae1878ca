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

import base64
import collections
import contextlib
import gc
import itertools
import os
import re
import secrets
import statistics
import sys
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness import costs, xla
from harness.errors import HarnessUsageError
from harness.metering import creationsites, nativememory, nativestacks, spmdcalls

# XLA's dump file names: module_0003.<module name>.<unique id>.<stage>.txt; stage
# `before_optimizations`, or `after_optimizations` with the backend's prefix (`cpu_`, `tpu_`),
# and next to it the buffer assignment of the optimized module (`...after_optimizations-buffer-assignment`).
_DUMP_FILE = re.compile(
    r"^module_(?P<number>\d+)\.(?P<name>.+)\.(?P<uid>\d+)\."
    r"(?P<stage>before_optimizations|(?:[a-z]+_)?after_optimizations(?P<buffers>-buffer-assignment)?)\.txt$"
)
_STAGES = {"before_optimizations": "before"}
# The collector's functions and the native reading as they were when the harness loaded: a body
# that replaces gc.get_objects, gc.collect, gc.get_freeze_count or harness.metering.nativememory.now (to
# hide what its loop keeps) does not blind the meter, which calls only these.
_collect, _get_objects, _freeze, _unfreeze, _freeze_count, _is_tracked = (
    gc.collect,
    gc.get_objects,
    gc.freeze,
    gc.unfreeze,
    gc.get_freeze_count,
    gc.is_tracked,
)
_native_now = nativememory.now
MAX_DUMP_BYTES = 64 << 20  # a partitioned module this large is not a training step of a case
_meter_numbers = itertools.count()


def _refuse_unmeasurable(ctx: Any, label: str) -> None:
    """A loop this meter cannot measure truthfully errors at once, saying what to change."""
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
    replaced = [
        f.__name__
        for f in (_collect, _get_objects, _freeze, _unfreeze, _freeze_count, _is_tracked)
        if f.__module__ != "gc"
    ]
    if replaced:
        raise HarnessUsageError(
            f"gc.{', gc.'.join(replaced)} was replaced before harness.stepcosts was imported: the meter "
            "cannot see what the loop keeps; do not replace the collector's functions in a measured body"
        )


class StepMeter:
    def __init__(
        self,
        ctx: Any,
        label: str = costs.DEFAULT_LABEL,
        warmup: int = costs.DEFAULT_WARMUP,
        parameters: Iterable[Any] = (),
        optimizer: Any = None,
        host_only: bool = False,
    ) -> None:
        """label: the loop's name in the case's signatures; warmup: steps allowed to compile
        (the first step compiles the graph; the second may, once the optimizer state exists).
        host_only: a loop without torch_xla (the gloo reference): only what each step leaves
        alive on the host is measured, no counters, graphs or device tensors."""
        _refuse_unmeasurable(ctx, label)
        self.ctx = ctx
        self.host_only = host_only
        self.label = label
        self.parameters = list(parameters)
        self.optimizer = optimizer
        self.dump_dir = os.environ.get(xla.DUMP_DIR_ENV)
        # Unique in this process, so a warm child's next case never reads this one's graphs.
        self.graph_prefix = f"{xla.STEP_GRAPH_PREFIX}{next(_meter_numbers)}_{label}_"
        self.signature: dict[str, Any] = {"warmup": warmup, "steps": [], "graphs": {}, "memory": {}}
        ctx.values.setdefault(costs.SIGNATURES_VALUE, {})[label] = self.signature
        self.dumps: dict[str, str] = ctx.values.setdefault(costs.DUMPS_VALUE, {})
        # The module before optimisation of the graph compiled last, as (text, file name): parsed only
        # when a step after the warm-up compiles another (_graph_differences).
        self.last_module_before: tuple[str, str] | None = None
        self.last_graph_memory: dict[str, int] | None = None
        # The memory of the graph the last step ran (XLA's buffer assignment: arguments, outputs, temp,
        # donated), and the device footprint after the step before: the step's peak as held.
        self.step_memory: dict[str, int] | None = None
        self.last_footprint: int | None = None
        # A counter only this meter knows the name of: a reset of torch_xla's counters drops it.
        self.sentinel = f"HarnessStepMeter_{secrets.token_hex(6)}"
        self._watch_what_steps_keep(host_only)

    def _watch_what_steps_keep(self, host_only: bool) -> None:
        """The state the leak detectors need from the first step on: the loop's XLA tensors,
        the collector's frozen objects, native memory and its stacks."""
        # What is alive after a step is what the loop created and keeps: every object that exists
        # now (modules, the model, its parameters) moves to the collector's permanent generation,
        # so a collection after each step scans only what the loop made (~0.1 ms, not ~250 ms for
        # a full collection of torch's ~470k objects) and gc.get_objects() lists only that.
        # The XLA tensors made before the loop (parameters, tensors made at wrap or load time) are
        # frozen with the rest and so not listed after a step: held here by weak reference, their
        # bytes join the loop's in the step's device footprint.
        self.before_loop = [] if host_only else _device_tensors_now()
        if not host_only:  # a native growth per step is read beside the SPMD calls each step made
            spmdcalls.install()
        self.freezes = _FreezeWatch()
        self.frozen_loop: list[weakref.ReferenceType[Any]] = []  # the loop's XLA tensors a body froze
        self.frozen_listed_at: int | None = None  # the freeze count when they were last listed
        self.alive: _Alive | None = None
        self.suspect_leak = False  # a step after the warm-up kept more XLA tensors than the one before
        self.sites: Any = None  # harness.metering.creationsites' recorder of this step, while steps are traced
        self.made_before: Any = None  # the step before's
        # Once a step after the warm-up grew native memory beyond the threshold, the next one runs
        # under memray (harness.metering.nativestacks) once; its line goes on that step and every later one.
        self.suspect_native = False
        self.native_stacks: list[str] | None = None
        self.native_own: list[Any] = []  # what memray's import and tracker made: not the loop's
        # What memray's import, start, stop and reading left in the heap and the resident set (its
        # library, its tables): taken out of the native figures of the tracked step and every later one.
        self.native_offset: collections.Counter[str] = collections.Counter()
        # The stack judge of a long loop (the nightly tier's): steps WINDOW_FIRST.. under memray, every
        # allocation recorded; the median native growth of the judged steps before it, which each of its
        # steps counts as at most (what memray's own tables add is not the loop's).
        self.window: nativestacks.WindowTrace | None = None
        self.window_reference: dict[str, int] = {}

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        index = len(self.signature["steps"])
        if self.host_only:
            native = self._native_trace(index)
            try:
                yield
            finally:
                if native is not None:
                    self._stop_native(native)
            entry: dict[str, Any] = {"graphs": [], **({"memray": True} if native is not None else {})}
            self._record_alive(index, entry)
            entry["live"] = {k: v for k, v in entry["live"].items() if k not in ("tensors", "bytes_per_device")}
            self._name_native_stacks(native, entry)
            self.signature["steps"].append(entry)
            return
        self._clear_dumps()
        before = _counters()
        calls_before = spmdcalls.now()
        watch = _CounterWatch(self.sentinel)
        previous_name = xla.name_graphs(f"{self.graph_prefix}step{index}")
        # Once a step kept more XLA tensors than the one before, the next ones note where each is
        # made; what a traced step made and the next one left alive is named.
        trace = self.suspect_leak and not creationsites.dynamo_in_use()
        self.made_before, self.sites = self.sites, creationsites.recorder() if trace else None
        native = self._native_trace(index)  # last: what the meter does before the step is not tracked
        self._window_start(index)
        tracked = native is not None or self.window is not None  # memray's tables grow in this step
        try:
            with self.sites if self.sites is not None else contextlib.nullcontext():
                yield
        except BaseException:
            if native is not None:
                native.close_after_error()
            if self.window is not None:
                self.window.close()
            raise
        finally:
            if previous_name is not None:
                xla.name_graphs(previous_name)
        after = _counters()
        if native is not None:  # after the step's device work, whose buffers it allocates and frees
            self._stop_native(native)
        watch.check(f"step{index}")
        entry = {name: after[name] - before[name] for name in costs.STEP_FIELDS}
        if tracked:  # the slow-leak slope leaves it out (costs.slow_leaks)
            entry["memray"] = True
        calls = spmdcalls.since(calls_before)
        if calls:
            entry["spmd_calls"] = calls
        entry["graphs"] = self._read_graphs(index, entry)
        self._record_alive(index, entry)
        self._window_clamp(entry)
        self._name_native_stacks(native, entry)
        self._window_after(index, entry)
        self.signature["steps"].append(entry)
        self.signature["memory"] = self._memory()

    # ---------------------------------------------------------------- native stacks

    def _native_trace(self, index: int) -> nativestacks.StepTrace | None:
        """memray's tracker for this step, started, where the step before grew natively and no
        step was tracked yet; None otherwise (a healthy loop never imports memray)."""
        if not self.suspect_native or self.native_stacks is not None or self.window is not None:
            return None
        if index == nativestacks.WINDOW_FIRST and not self.host_only:
            return None  # the window's step: it tracks every allocation of this step and the next three
        trace = nativestacks.StepTrace(index)
        with self._not_the_loops():
            why_not = trace.start()
        self.native_own += [trace, *trace.made]
        if why_not is not None:
            self.native_stacks = [f"native stacks not named: {why_not}"]
            return None
        return trace

    def _window_start(self, index: int) -> None:
        """At step WINDOW_FIRST of a loop that reaches it: memray's tracker over the next WINDOW_STEPS."""
        tracking_one_step = bool(self.native_own) and self.native_stacks is None  # memray tracks this step already
        if index != nativestacks.WINDOW_FIRST or tracking_one_step:
            return
        self.window_reference = self._median_growth()
        window = nativestacks.WindowTrace(index)
        with self._not_the_loops():
            why_not = window.start()
        self.native_own += [window, *window.made]
        if why_not is None:
            self.window = window
            weakref.finalize(self, window.close)  # a loop that ends inside the window: tracking stops
        else:
            self.signature["steps"][-1].setdefault("native_leaks", []).append(f"native stacks not judged: {why_not}")

    def _median_growth(self) -> dict[str, int]:
        """Each native figure's median growth per step over the judged steps so far. The median, not
        the last step's growth: each of the window's four steps may grow as much, and one noisy step
        before it (+30 KiB) let memray's tables pass as the loop's (a 2.7.0 ViT loop read as a slow leak)."""
        steps = self.signature["steps"]
        lives = [step.get("live", {}) for step in steps[max(self.signature["warmup"], 1) - 1 :]]
        return {
            field: int(statistics.median(b[field] - a[field] for a, b in zip(lives, lives[1:])))
            for field in costs.NATIVE_FIELDS
            if len(lives) >= 2 and all(field in live for live in lives)
        }

    def _window_clamp(self, entry: dict[str, Any]) -> None:
        """A step of the window counts as growing natively by at most the judged steps' median growth:
        memray's tables, grown while it records every allocation, are not the loop's (its stacks judge
        the window's steps)."""
        if self.window is None:
            return
        self._clamp_growth(self.signature["steps"][-1].get("live", {}), entry["live"], self.window_reference)

    def _clamp_growth(self, last: dict[str, int], now: dict[str, int], reference: dict[str, int]) -> None:
        """A memray-tracked step's native figures, `now`, grow from `last` by at most `reference`
        (the judged steps' median growth per figure); the excess is memray's, taken out of this
        step's figures and every later step's (native_offset)."""
        for field, most in reference.items():
            if field in now and field in last:
                excess = (now[field] - last[field]) - max(most, 0)
                if excess > 0:
                    now[field] -= excess
                    self.native_offset[field] += excess

    def _window_after(self, index: int, entry: dict[str, Any]) -> None:
        """A step of the window ended: a boundary noted, and after the last the stacks judged."""
        window = self.window
        if window is None:
            return
        with self._not_the_loops():
            window.mark()
            if index < window.first + nativestacks.WINDOW_STEPS - 1:
                return
            self.window = None
            entry["native_leaks"] = window.read()

    def _name_native_stacks(self, native: nativestacks.StepTrace | None, entry: dict[str, Any]) -> None:
        steps = self.signature["steps"]
        last, now = (steps[-1].get("live", {}) if steps else {}), entry["live"]
        if native is not None and len(steps) >= 2:
            # memray's own tables (its native trace cache, the unwinding info it paged in) stay in the
            # process: the tracked step counts as growing by at most the judged steps' median growth
            # (in a 5-step loop: what the step before grew), and what it measured above that is taken
            # out of its figures and every later step's. Not the step before's alone: that step grew
            # past the threshold (why memray tracks this one), and a one-off there read twice.
            self._clamp_growth(last, now, self._median_growth())
        grown = {
            field: now[field] - last[field]
            for field in costs.NATIVE_FIELDS
            if field in now and field in last and now[field] - last[field] >= costs.NATIVE_GROWTH_PER_STEP[field]
        }
        if native is not None:
            growth = ", ".join(f"{costs.NATIVE_NAMES[f]} +{costs.kib(n)}" for f, n in grown.items())
            with self._not_the_loops():
                self.native_stacks = [
                    native.read(
                        f"the step grew {growth}" if growth else "the step grew less", grown.get("heap_bytes", 0)
                    )
                ]
                self._keep_capture(native)
        elif grown and len(steps) >= self.signature["warmup"]:
            self.suspect_native = True
        if self.native_stacks is not None:
            entry["native_stacks"] = list(self.native_stacks)

    def _keep_capture(self, native: nativestacks.StepTrace) -> None:
        """memray's capture of the tracked step, for the parent to keep in the results folder (memray/)
        if the case fails: `memray stats` or `memray flamegraph` on it shows what memray saw."""
        if native.capture is None or self.native_stacks is None:
            return
        captures = self.ctx.values.setdefault(costs.CAPTURES_VALUE, {})
        if len(captures) < costs.MAX_CAPTURES:
            name = f"{self.label}_step{native.step}"
            captures[name] = base64.b64encode(native.capture).decode("ascii")
            self.native_stacks[-1] += f"; memray's capture: the run folder's memray/*__{name}.memray, if the case fails"

    def _stop_native(self, native: nativestacks.StepTrace) -> None:
        gc.collect()  # the step's garbage goes first: what it frees is the loop's, not memray's
        with self._not_the_loops():
            native.stop()

    @contextlib.contextmanager
    def _not_the_loops(self) -> Iterator[None]:
        """What the native figures move by in this block is memray's doing, not the loop's."""
        before = _native_now()
        try:
            yield
        finally:
            after = _native_now()
            for field in before.keys() & after.keys():
                self.native_offset[field] += after[field] - before[field]

    # ---------------------------------------------------------------- what a step leaves alive

    def _record_alive(self, index: int, entry: dict[str, Any]) -> None:
        own = (
            (self.signature, self.dumps, self.last_module_before, self.alive, entry, self.freezes.sentinel, _TILES)
            + (self.native_stacks, self.native_own, self.native_offset)
            + tuple(x for r in (self.sites, self.made_before) if r is not None for x in (r, r.__dict__))
        )
        alive, tensors = _Alive.now(exclude=own)
        # A body that calls gc.freeze() itself hides what it keeps from gc.get_objects(): what the
        # permanent generation gained since the meter's own freeze counts as kept by the loop.
        frozen = self.freezes.frozen_since_start()
        if frozen:  # net of the objects frozen before the meter that died since: can be below 0, grows all the same
            alive.types["objects frozen by the loop (gc.freeze)"] += frozen
        held = [tensor for tensor in (ref() for ref in self.before_loop) if tensor is not None]
        if self.freezes.seen_freeze and not self.host_only:  # (its count can be net negative: older frozen objects die)
            # ... and the XLA tensors among them are still the loop's: counted, and in the footprint.
            hidden = self._frozen_loop_tensors(known=tensors + held, own=(*own, alive))
            alive.add_tensors(hidden)
            tensors += hidden
        # What the collector cannot see: C++ allocations, untracked objects held by older containers.
        entry["live"] = alive.totals() | {k: v - self.native_offset[k] for k, v in _native_now().items()}
        if not self.host_only:
            footprint = _Footprint(tensors + held)
            entry["live"]["footprint_bytes"] = footprint.bytes_per_device
            self._record_held_peak(entry["live"], held)
            self.last_footprint = footprint.bytes_per_device
            previous = self.signature.get("buffers")
            self.signature["buffers"] = footprint.buffers
        if self.alive is not None and index >= self.signature["warmup"]:
            kept = alive.kept_since(self.alive)
            if not self.host_only and previous is not None and self._footprint_outgrew_the_loop(entry):
                # the footprint grew by more than the loop's own tensors: name the buffers that are new
                new = costs.new_buffers(previous, self.signature["buffers"])
                if new:
                    kept.append(f"device buffers new since step{index - 1}: {new}")
            made = self._creation_sites(tensors, alive)
            if made:
                kept.append(f"XLA tensors made in step{index - 1} and still alive: {made}")
            if kept:
                entry["kept"] = kept
            self.suspect_leak = self.suspect_leak or any(n > self.alive.shapes[k] for k, n in alive.shapes.items())
        self.alive = alive

    def _record_held_peak(self, live: dict[str, int], held: list[Any]) -> None:
        """The step's peak as the device holds it, `held_peak_bytes`: what the step's program holds as
        XLA's buffer assignment places it (costs.program_bytes: its arguments, the outputs that reuse
        none, its temp), plus the other buffers alive beside its arguments, read as the footprint after
        the step before (step 0: the tensors made before the loop) less the program's arguments. The
        graph is the one this step compiled, or the last one compiled, which a cached step runs."""
        if self.step_memory is None:
            return
        before = self.last_footprint if self.last_footprint is not None else _Footprint(held).bytes_per_device
        arguments = self.step_memory.get("arguments", 0)
        live["held_peak_bytes"] = costs.program_bytes(self.step_memory) + max(0, before - arguments)
        live["donated_bytes"] = self.step_memory.get("donated", 0)

    def _frozen_loop_tensors(self, known: list[Any], own: tuple[Any, ...]) -> list[Any]:
        """The loop's XLA tensors that a body's gc.freeze() hid from gc.get_objects(). Each time the
        frozen objects changed, the permanent generation is listed (unfreeze, list, freeze again:
        ~100 ms, only in a loop whose body froze the collector) and the loop's tensors in it are
        held by weak reference. That freezes what the loop holds then too, which the freeze watch
        counts among the objects the loop froze; the meter's own records it froze are not counted."""
        if _freeze_count() != self.frozen_listed_at:
            before_loop = {id(t) for t in (ref() for ref in self.before_loop) if t is not None}
            everything = _all_objects()
            self.frozen_loop = [weakref.ref(t) for t in _device_tensors_among(everything) if id(t) not in before_loop]
            own_ids = _ids_within(own)
            self.freezes.meter_frozen = sum(1 for obj in everything if id(obj) in own_ids)
            del everything
            self.frozen_listed_at = _freeze_count()
        listed = {id(t) for t in known}
        return [t for t in (ref() for ref in self.frozen_loop) if t is not None and id(t) not in listed]

    def _creation_sites(self, tensors: list[Any], alive: _Alive) -> str:
        """'float32[] at test_loop.py:87': tensors the step before made (traced) that this step left
        alive, of the shapes there are more of."""
        made_before, self.made_before = self.made_before, None
        if made_before is None or self.alive is None:
            return ""
        grown = {k for k, n in alive.shapes.items() if n > self.alive.shapes[k]}
        found: collections.Counter[str] = collections.Counter()
        for tensor in tensors:
            where = made_before.site_of(tensor)
            if where is not None and _shape_text(tensor) in grown:
                found[f"{_shape_text(tensor)} at {where}"] += 1
        return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(found.items())[:6])

    def _footprint_outgrew_the_loop(self, entry: dict[str, Any]) -> bool:
        steps = self.signature["steps"]
        last = steps[-1].get("live", {}) if steps else {}
        now = entry["live"]
        if "footprint_bytes" not in last:
            return False
        grew = now["footprint_bytes"] - last["footprint_bytes"]
        return grew > 0 and grew > now.get("bytes_per_device", 0) - last.get("bytes_per_device", 0)

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
                stage = "buffers" if match.group("buffers") else _STAGES.get(match.group("stage"), "after")
                modules.setdefault(match.group("number"), {})[stage] = path
        names = []
        memories = []
        for position, number in enumerate(sorted(modules, key=int)):
            name = f"step{index}" if position == 0 else f"step{index}.{position}"
            judged = index >= self.signature["warmup"]
            graph = self.signature["graphs"][name] = self._read_graph(name, modules[number], entry, judged)
            names.append(name)
            if "memory" in graph:
                memories.append(graph["memory"])
        if memories:  # graphs of one step run one after the other: the one holding most is the step's
            self.step_memory = max(memories, key=costs.program_bytes)
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

    def _read_graph(self, name: str, stages: dict[str, Path], entry: dict[str, Any], judged: bool) -> dict[str, Any]:
        """What a step graph's dumps say; `judged`: the step is past the warm-up, so a graph it
        compiles is a problem, and what it differs in from the graph compiled before it is said."""
        after = stages.get("after")
        if after is None:
            return {"collectives": None, "unread": "XLA wrote no after_optimizations module"}
        text = _read_text(after)
        where = f"{after.name} (partitioned module of {name})"
        graph: dict[str, Any] = {"collectives": costs.collectives(text, self.ctx.devices or xla.num_devices(), where)}
        self.dumps[f"{self.label}/{name}"] = text
        donated = costs.module_donations(text, where)
        aliases = costs.module_aliases(text, donated, where)
        if aliases is not None:  # kept by the record, for the donation-lost diagnosis against a base run
            graph["aliases"] = aliases
        buffers = stages.get("buffers")
        if buffers is not None:
            graph["memory"] = costs.buffer_memory(
                _read_text(buffers), f"{buffers.name} (buffer assignment of {name})", donated=donated
            )
        before = stages.get("before")
        if before is not None:
            module_before = (_read_text(before), before.name)
            if self.last_module_before is not None and judged:
                entry.setdefault("differs", []).extend(_graph_differences(self.last_module_before, module_before))
            self.last_module_before = module_before
        if self.last_graph_memory is not None and "memory" in graph:
            # A recompiled step whose memory moved says so next to what its inputs differ in.
            moved = costs.compare(
                {"graphs": {name: {"collectives": None, "memory": self.last_graph_memory}}},
                {"graphs": {name: {"collectives": None, "memory": graph["memory"]}}},
            )
            entry.setdefault("differs", []).extend(f"graph memory {c.detail}" for c in moved)
        self.last_graph_memory = graph.get("memory", self.last_graph_memory)
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


class _CounterWatch:
    """Sees torch_xla's counters and metrics go backwards across a step: a reset, by the body
    (metrics.clear_counters(), clear_all(), clear_metrics()) or inside torch_xla, in C++ too.
    Observed, not intercepted: every counter and metric that exists before the step must not be
    lower after it, and the meter's own counter, bumped before the step, must still be there."""

    def __init__(self, sentinel: str) -> None:
        import torch_xla
        import torch_xla.debug.metrics as met

        self.sentinel = sentinel
        if hasattr(torch_xla._XLAC, "_xla_increment_counter"):  # 2.9; older releases: observation only
            torch_xla._XLAC._xla_increment_counter(sentinel, 1)
        self.counters = {name: int(met.counter_value(name) or 0) for name in met.counter_names()}
        self.metrics = {name: _samples(name) for name in met.metric_names()}

    def check(self, step: str) -> None:
        import torch_xla.debug.metrics as met

        back = [
            f"counter {name} {value} -> {int(met.counter_value(name) or 0)}"
            for name, value in self.counters.items()
            if int(met.counter_value(name) or 0) < value
        ] + [
            f"metric {name} {value} -> {_samples(name)} samples"
            for name, value in self.metrics.items()
            if _samples(name) < value
        ]
        if back:
            shown = ", ".join(line.replace(self.sentinel, "(the meter's own)") for line in back[:4])
            raise costs.CountersReset(
                f"{step}: torch_xla's counters or metrics were reset during the measured step ({shown}"
                f"{', ...' if len(back) > 4 else ''}): something called metrics.clear_counters(), clear_all() or "
                "clear_metrics(), so this step's compilations and executions cannot be counted. Remove the "
                "reset from the measured loop (reset before the meter's first step, if at all)."
            )


def _samples(name: str) -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return int(data[0]) if data else 0


# The collector stops tracking a tuple or a dict whose items are all untracked when it next meets
# it, one level of nesting per collection, so their counts drop while nothing is freed (seen: a
# module imported during step 0 read as 4 tuples fewer at step 2). Such containers are not
# counted; one holding a tracked object (a leaked per-parameter placements tuple) is.
_UNTRACKED_LATER = (tuple, dict)


def _stays_tracked(value: Any, depth: int = 0) -> bool:
    if type(value) not in _UNTRACKED_LATER:
        return _is_tracked(value)
    if depth > 8:  # deeper than any spec or cache a step builds: count it
        return True
    items = value.items() if isinstance(value, dict) else ((item, None) for item in value)
    return any(_stays_tracked(k, depth + 1) or _stays_tracked(v, depth + 1) for k, v in items)


class _Alive:
    """The objects the loop created and still holds after a step (everything older is frozen):
    by type on the host, and the XLA tensors among them by shape, with their bytes per device."""

    def __init__(self, types: collections.Counter[str], shapes: collections.Counter[str], device_bytes: int) -> None:
        self.types, self.shapes, self.device_bytes = types, shapes, device_bytes

    @classmethod
    def now(cls, exclude: Iterable[Any]) -> tuple[_Alive, list[Any]]:
        """What is alive, and the loop's XLA tensors themselves (for the footprint: not kept, so
        the meter holds none of them past the step)."""
        _collect()
        own = _ids_within(exclude)  # the meter's own records are not the loop's
        types: collections.Counter[str] = collections.Counter()
        tensors = []
        for obj in _get_objects():
            if id(obj) in own:
                continue
            kind = type(obj)
            if kind in _UNTRACKED_LATER and not _stays_tracked(obj):
                continue
            types[kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"] += 1
            if _is_device_tensor(obj):
                tensors.append(obj)
        shapes = collections.Counter(_shape_text(t) for t in tensors)
        return cls(types, shapes, _bytes(tensors)), tensors

    def add_tensors(self, tensors: list[Any]) -> None:
        """XLA tensors the listing could not see (frozen by the body), counted with the loop's."""
        self.shapes.update(_shape_text(t) for t in tensors)
        self.device_bytes += _bytes(tensors)

    def totals(self) -> dict[str, int]:
        return {
            "tensors": sum(self.shapes.values()),
            "bytes_per_device": self.device_bytes,
            "host_objects": max(0, sum(self.types.values())),
        }

    def kept_since(self, before: _Alive) -> list[str]:
        """What there is more of than after the step before: 'XLA tensors kept: float32[16,8] x1'."""
        lines = []
        for what, now, then in (
            ("XLA tensors kept", self.shapes, before.shapes),
            ("host objects kept", self.types, before.types),
        ):
            grew = sorted(((n - then[k], k) for k, n in now.items() if n > then[k]), key=lambda p: (-p[0], p[1]))
            if grew:
                listed = ", ".join(f"{name} +{count}" for count, name in grew[:6])
                lines.append(f"{what}: {listed}" + (f" and {len(grew) - 6} more type(s)" if len(grew) > 6 else ""))
        return lines


class _FreezeWatch:
    """Freezes the collector's generations now, and tells how many objects later freezes moved.

    gc.get_freeze_count() walks the whole permanent generation (a linked list: 35-70 ms for the
    ~450k objects a forked child inherits frozen from the fork server), which once per metered
    loop was 1% of a PR run's CPU and after every step 5%. A sentinel made after this freeze is
    listed by gc.get_objects() until a later gc.freeze() moves it: while it is listed nothing was
    frozen since (only a freeze adds to the permanent generation). The count is read first when
    the sentinel is gone, and what later steps froze is counted from there: the leak judge compares
    steps, so the steps after that one see what each freeze hid, as before; the step of the first
    freeze counts none of it (its objects leave gc.get_objects() that step, so the growth the judge
    sees there is low, never high: a loop that keeps hiding grows in every later step).
    """

    def __init__(self) -> None:
        _freeze()
        self.first_seen: int | None = None  # the permanent generation's size when a later freeze was first seen
        self.meter_frozen = 0  # the meter's own records frozen since (StepMeter._frozen_loop_tensors)
        self.sentinel: list[Any] = []  # a list is always tracked by the collector

    @property
    def seen_freeze(self) -> bool:
        return self.first_seen is not None

    def frozen_since_start(self) -> int:
        if self.first_seen is None:
            if any(obj is self.sentinel for obj in _get_objects()):
                return 0
            self.first_seen = _freeze_count()
        return _freeze_count() - self.first_seen - self.meter_frozen


def _device_tensors_now() -> list[weakref.ReferenceType[Any]]:
    """Weak references to every XLA tensor Python holds now (one pass over the collector's objects,
    once per meter, before it freezes them)."""
    return [weakref.ref(obj) for obj in _device_tensors_among(_get_objects())]


def _device_tensors_among(objects: list[Any]) -> list[Any]:
    """The XLA tensors among `objects`. A child holds ~430k objects: a Python-level test of each
    took ~230 ms, so the tensors are picked by their exact types in C (map, compress), ~100 ms with
    the listing itself, and no object's __class__ is asked (a lazy module's would warn)."""
    import torch

    tensor_types, todo = set(), [torch.Tensor]
    while todo:  # torch.Tensor and every subclass defined so far (nn.Parameter, wrappers)
        kind = todo.pop()
        if kind not in tensor_types:
            tensor_types.add(kind)
            todo += type.__subclasses__(kind)
    candidates = itertools.compress(objects, map(tensor_types.__contains__, map(type, objects)))
    return [obj for obj in candidates if _is_device_tensor(obj)]


def _all_objects() -> list[Any]:
    """Every object the collector tracks, those in its permanent generation too, which
    gc.get_objects() does not list: unfreeze, list, freeze again (all of them are frozen then)."""
    _unfreeze()
    try:
        return _get_objects()
    finally:
        _freeze()


class _Footprint:
    """Every XLA tensor Python holds, on the device holding most: its bytes, and its buffers by
    dtype, shape and sharding (`float32[65536] {replicated}: 1`), what a footprint change names."""

    def __init__(self, tensors: Iterable[Any]) -> None:
        from harness.recording import spec_of_any

        self.bytes_per_device = 0
        buffers: collections.Counter[str] = collections.Counter()
        for tensor in tensors:
            try:
                spec = spec_of_any(tensor)
            except Exception:  # noqa: BLE001 - a tensor whose sharding cannot be read is listed without one
                spec = ""
            self.bytes_per_device += _bytes([tensor], spec)
            buffers[f"{_shape_text(tensor)} {spec or 'unsharded'}"] += 1
        self.buffers = dict(sorted(buffers.items()))


def _shape_text(tensor: Any) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}[{','.join(map(str, tensor.shape))}]"


def _ids_within(roots: Iterable[Any]) -> set[int]:
    """ids of the containers in JSON-like trees (dicts, lists, tuples, sets, _Alive)."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        if isinstance(value, _Alive):
            seen.add(id(value))
            todo += [value.__dict__, value.types, value.shapes]
        elif isinstance(value, dict):
            seen.add(id(value))
            todo += list(value.keys()) + list(value.values())
        elif isinstance(value, (list, tuple, set)):
            seen.add(id(value))
            todo += list(value)
        else:  # a leaf the meter made (a creation-site recorder, its weak references)
            seen.add(id(value))
    return seen


def _is_device_tensor(obj: Any) -> bool:
    """An XLA tensor that holds data itself (a DTensor or an XLAShardedTensor wraps one, counted once)."""
    if "torch_xla" not in sys.modules:  # no XLA tensor can exist (the gloo reference loops); nor import torch here
        return False
    import torch

    if not issubclass(type(obj), torch.Tensor) or hasattr(obj, "_local_tensor") or hasattr(obj, "global_tensor"):
        return False
    if _is_tracing_tensor(obj):
        return False
    try:
        return bool(obj.device.type == "xla")
    except Exception:  # noqa: BLE001 - a tensor subclass without a device is no XLA buffer
        return False


def _is_tracing_tensor(obj: Any) -> bool:
    """A FakeTensor or FunctionalTensor, torch's tracing stand-ins: Dynamo, scan and scan_layers
    trace through them and leave some alive on device xla (seen on 2.8.0 and 2.9.0). They hold no
    XLA data, and reading their sharding raises "Expected XLA tensor" ("Check failed: xtensor")."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(obj, (FakeTensor, FunctionalTensor))


def _graph_differences(last: tuple[str, str], new: tuple[str, str]) -> list[str]:
    """What a graph compiled after the warm-up differs in from the graph compiled before it: its
    inputs (`parameter(4): f32[16,16] {replicated} -> ...`), or where they are the same, its
    structure's fingerprint. Each is (module text before optimisation, file name), parsed here
    only: the warm-up's compiles are expected, and parsing a ViT step's module takes ~25 ms."""
    (last_text, last_name), (text, name) = last, new
    last_module, module = costs.read_module(last_text, last_name), costs.read_module(text, name)
    differs = costs.input_differences(costs.entry_inputs(last_module, last_name), costs.entry_inputs(module, name))
    return differs or [
        f"inputs identical, graph fingerprint {costs.fingerprint(last_module)} -> {costs.fingerprint(module)}"
    ]


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


def _bytes(tensors: Iterable[Any], spec: str | None = None) -> int:
    """Bytes on the device holding most; `spec`: the sharding of the one tensor given, read already."""
    from harness.recording import spec_of_any

    total = 0
    for tensor in tensors:
        tiles = None
        if _is_xla(getattr(tensor, "global_tensor", tensor)):
            tiles = _tiles_of(spec if spec is not None else spec_of_any(tensor))
        total += costs.tensor_bytes_per_device(list(tensor.shape), tensor.element_size(), tiles)
    return total


# A sharding spec's data tile dims, by spec: every XLA tensor's bytes are read after each step, and a
# loop has a few distinct specs (parsing each again was a fifth of the meter's time). Strings to
# tuples of ints, which the collector stops tracking, so the step that adds one keeps no object the
# leak judge lists; the meter's own records all the same (StepMeter._record_alive). Cleared when full.
_TILES: dict[str, tuple[int, ...] | None] = {}
_MAX_TILES = 4096


def _tiles_of(spec: str) -> list[int] | None:
    from harness.sharding import ShardingParseError, Tiled, parse_sharding

    if spec not in _TILES:
        try:
            sharding = parse_sharding(spec)
        except ShardingParseError:
            sharding = None
        if len(_TILES) >= _MAX_TILES:
            _TILES.clear()
        _TILES[spec] = tuple(sharding.data_tile_dims) if isinstance(sharding, Tiled) else None
    tiles = _TILES[spec]
    return None if tiles is None else list(tiles)
