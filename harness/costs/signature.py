"""A cost signature's shape and its checking: the fields a child records per step and per graph,
the check of one read back from a child, a results folder or a baseline file (untrusted), and the
parts of it that are compared (comparable) or derived (native growth, SPMD calls per step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.costs.hloread import CostReadError
from harness.errors import HarnessError
from harness.schema import shown

# Where a child leaves its signatures and the partitioned modules they were read from
# (CaseContext values; the parent pops the dumps so they reach the results folder only on failure).
SIGNATURES_VALUE = "harness:costs"

DUMPS_VALUE = "harness:cost-dumps"

# memray's captures of a loop's tracked step (harness.metering.nativestacks), base64, by `<label>_step<N>`:
# the parent keeps them under the run folder's memray/ when the case fails.
CAPTURES_VALUE = "harness:memray-captures"

MAX_CAPTURE_BYTES = 4 << 20  # of one capture kept (an aggregated capture of one step is far smaller)

MAX_CAPTURES = 4  # per case

DEFAULT_LABEL = "train"

DEFAULT_WARMUP = 2

MEMORY_FIELDS = ("parameters", "gradients", "optimizer_state")

STEP_FIELDS = ("compiles", "cache_hits", "executions")
# Steps a meter runs under memray: the one after a large native growth, and the nightly window's
# (harness.costs.steady.STACK_WINDOW_STEPS; not imported here: steady imports this module).
MAX_MEMRAY_STEPS = 1 + 4

# What is alive after a step (harness.stepcosts): XLA tensors the loop holds and their bytes on the
# device holding most, GC-tracked host objects the loop created. Host objects only judge growth
# (steady state): their count depends on what was imported before the loop, so it is not baselined.
# heap_bytes and rss_bytes: what the process holds natively (harness.metering.nativememory), judged by growth only.
# footprint_bytes: every XLA tensor Python holds after the step, the ones made before the loop too
# (parameters, tensors made at wrap or load time), on the device holding most; baselined (the band).
# held_peak_bytes: the step's peak as the device holds it: the step program's arguments, outputs that
# reuse no argument and temp (XLA's buffer assignment), plus the other buffers alive beside its
# arguments; baselined (the band). donated_bytes: the arguments it donates (their outputs reuse their
# buffers), baselined to say why a peak grew. step_peak_bytes: the footprint plus the temp, what
# records before held_peak_bytes carry (read, no longer written: it pointed the wrong way when a build
# stopped donating).
LIVE_FIELDS = (
    "tensors",
    "bytes_per_device",
    "host_objects",
    "heap_bytes",
    "rss_bytes",
    "footprint_bytes",
    "step_peak_bytes",
    "held_peak_bytes",
    "donated_bytes",
)

BASELINED_LIVE_FIELDS = (
    "tensors",
    "bytes_per_device",
    "footprint_bytes",
    "step_peak_bytes",
    "held_peak_bytes",
    "donated_bytes",
)

HELD_PEAK_NAME = "step peak (program's arguments + outputs + temp, and other live buffers)"

NATIVE_FIELDS = ("heap_bytes", "rss_bytes")

# A compiled step graph's memory per device, from XLA's buffer assignment of the partitioned module.
GRAPH_MEMORY_FIELDS = ("arguments", "outputs", "temp", "donated", "peak")

# A compiled step graph's aliasing (module_aliases): kept by records, not by baselines.
GRAPH_ALIAS_FIELDS = ("donated", "parameters")


class CountersReset(HarnessError):
    """torch_xla's counters or metrics went backwards during a measured step (something called
    metrics.clear_counters(), clear_all() or clear_metrics(), in Python or in C++): the step's
    compiles and executions cannot be known, so the case errors instead of reading as clean."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_signature(data: Any, where: str) -> dict[str, Any]:
    """`data` as a signature, each field of the type the meter writes, or CostReadError naming it."""
    if not isinstance(data, dict):
        raise CostReadError(f"{where}: {shown(data)}, not a cost signature (a mapping with steps, graphs, memory)")
    unknown = sorted(set(data) - {"warmup", "steps", "graphs", "memory", "buffers", "native", "spmd_calls"})
    if unknown:
        raise CostReadError(
            f"{where}: unknown key {unknown[0]!r} (known: buffers, graphs, memory, native, spmd_calls, steps, warmup)"
        )
    if "spmd_calls" in data:
        _check_calls(data["spmd_calls"], f"{where}: spmd_calls")
    buffers = data.get("buffers", {})
    if not isinstance(buffers, dict) or not all(
        isinstance(k, str) and len(k) <= 2000 and _is_count(v) for k, v in buffers.items()
    ):
        raise CostReadError(f"{where}: buffers must map a buffer's dtype, shape and sharding to a count")
    if "native" in data:
        _check_counts(data["native"], NATIVE_FIELDS, f"{where}: native")
    steps, graphs, memory = data.get("steps", []), data.get("graphs", {}), data.get("memory", {})
    if "warmup" in data and not _is_count(data["warmup"]):
        raise CostReadError(f"{where}: warmup is {shown(data['warmup'])}, not a whole number of steps")
    if not isinstance(steps, list):
        raise CostReadError(f"{where}: steps is {shown(steps)}, not a list")
    for index, step in enumerate(steps):
        _check_step(step, f"{where}, step{index}")
    tracked = sum(1 for step in steps if step.get("memray"))
    if tracked > MAX_MEMRAY_STEPS:  # the slope leaves them out: a loop marked all over would pass unjudged
        raise CostReadError(
            f"{where}: {tracked} steps say memray tracked them; it tracks {MAX_MEMRAY_STEPS} at most "
            "(one after a large growth, and the stack judge's window)"
        )
    if not isinstance(graphs, dict):
        raise CostReadError(f"{where}: graphs is {shown(graphs)}, not a mapping of graph names")
    for name, graph in graphs.items():
        _check_graph(graph, f"{where}, graph {name!r}")
    if not isinstance(memory, dict) or not all(k in MEMORY_FIELDS and _is_count(v) for k, v in memory.items()):
        raise CostReadError(f"{where}: memory must map {', '.join(MEMORY_FIELDS)} to byte counts; got {shown(memory)}")
    return data


def _check_step(step: Any, where: str) -> None:
    if not isinstance(step, dict):
        raise CostReadError(f"{where}: {shown(step)}, not a step (compiles, cache_hits, executions, graphs)")
    for name in STEP_FIELDS:  # absent in a host-only loop (no torch_xla counters to read)
        if name in step and not _is_count(step.get(name)):
            raise CostReadError(f"{where}: {name} is {shown(step.get(name))}, not a whole number")
    if not isinstance(step.get("graphs", []), list) or not all(isinstance(g, str) for g in step.get("graphs", [])):
        raise CostReadError(f"{where}: graphs must be a list of graph names")
    for lines in ("differs", "kept", "native_stacks", "native_leaks"):
        if not isinstance(step.get(lines, []), list) or not all(isinstance(d, str) for d in step.get(lines, [])):
            raise CostReadError(f"{where}: {lines} must be a list of lines")
    if step.get("memray", True) is not True:
        raise CostReadError(f"{where}: memray is {shown(step['memray'])}, not true (a step memray tracked)")
    if "live" in step:
        _check_counts(step["live"], LIVE_FIELDS, f"{where}: live")
    if "spmd_calls" in step:
        _check_calls(step["spmd_calls"], f"{where}: spmd_calls")
    fields = {
        *STEP_FIELDS,
        "graphs",
        "differs",
        "kept",
        "native_stacks",
        "native_leaks",
        "live",
        "spmd_calls",
        "memray",
    }
    unknown = sorted(set(step) - fields)
    if unknown:
        raise CostReadError(f"{where}: unknown key {unknown[0]!r}")


def _check_counts(value: Any, fields: tuple[str, ...], where: str) -> None:
    if not isinstance(value, dict) or not all(k in fields and _is_count(v) for k, v in value.items()):
        raise CostReadError(f"{where} must map {', '.join(fields)} to whole numbers; got {shown(value)}")


MAX_CALL_NAMES = 16  # SPMD APIs counted per step (harness.metering.spmdcalls names six)


def _check_calls(value: Any, where: str) -> None:
    """SPMD API calls per step: a few API names (identifiers) to counts."""
    if not (
        isinstance(value, dict)
        and len(value) <= MAX_CALL_NAMES
        and all(isinstance(k, str) and k.isidentifier() and len(k) <= 64 and _is_count(v) for k, v in value.items())
    ):
        raise CostReadError(f"{where} must map at most {MAX_CALL_NAMES} API names to call counts; got {shown(value)}")


def _check_graph(graph: Any, where: str) -> None:
    if not isinstance(graph, dict):
        raise CostReadError(f"{where}: {shown(graph)}, not a graph (collectives, fingerprint)")
    if "memory" in graph:
        _check_counts(graph["memory"], GRAPH_MEMORY_FIELDS, f"{where}: memory")
    if "aliases" in graph:
        _check_counts(graph["aliases"], GRAPH_ALIAS_FIELDS, f"{where}: aliases")
        if graph["aliases"].get("donated", 0) > graph["aliases"].get("parameters", 0):
            raise CostReadError(f"{where}: aliases: more parameters donated than the module takes")
    listed = graph.get("collectives")
    if listed is None:  # not read: the reason says why
        if not isinstance(graph.get("unread"), str):
            raise CostReadError(f"{where}: collectives missing without an 'unread' reason")
        return
    if not isinstance(listed, list):
        raise CostReadError(f"{where}: collectives is {shown(listed)}, not a list")
    for entry in listed:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("kind"), str)
            and isinstance(entry.get("replica_groups"), str)
            and _is_count(entry.get("count"))
            and _is_count(entry.get("bytes_per_device"))
        ):
            raise CostReadError(
                f"{where}: collective {shown(entry)} needs kind, replica_groups (text), "
                "count and bytes_per_device (whole numbers)"
            )


def comparable(signature: Mapping[str, Any]) -> dict[str, Any]:
    """What a baseline keeps and compares: counts, collectives, memory. Not the fingerprints
    (any change of any op moves them) nor the steady-state explanations."""
    kept = {
        "steps": [_comparable_step(step) for step in signature.get("steps", [])],
        "graphs": {name: _comparable_graph(g) for name, g in sorted(signature.get("graphs", {}).items())},
        "memory": dict(sorted(signature.get("memory", {}).items())),
    }
    if signature.get("buffers"):  # the device footprint after the last step, buffer by buffer
        kept["buffers"] = dict(sorted(signature["buffers"].items()))
    if "warmup" in signature:  # which steps steady state judges: a longer warm-up judges fewer
        kept = {"warmup": signature["warmup"], **kept}
    return kept


def calls_per_step(signature: Mapping[str, Any]) -> dict[str, int]:
    """The SPMD API calls (harness.metering.spmdcalls) every step after the warm-up made at least: what a
    native leak per call multiplies by."""
    steps = signature.get("steps", [])[max(signature.get("warmup", DEFAULT_WARMUP), 1) :]
    if not steps:
        return {}
    names = set.intersection(*(set(step.get("spmd_calls") or {}) for step in steps))
    return {name: min(step["spmd_calls"][name] for step in steps) for name in sorted(names)}


def new_buffers(before: Mapping[str, int], after: Mapping[str, int], limit: int = 6) -> str:
    """'float32[65536] {replicated} +1, ...': the device buffers there are more of than before."""
    grew = sorted(
        ((n - before.get(k, 0), k) for k, n in after.items() if n > before.get(k, 0)), key=lambda p: (-p[0], p[1])
    )
    listed = ", ".join(f"{name} +{count}" for count, name in grew[:limit])
    return listed + (f" and {len(grew) - limit} more" if len(grew) > limit else "")


def _comparable_step(step: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: step[k] for k in (*STEP_FIELDS, "graphs") if k in step}
    live = {k: step["live"][k] for k in BASELINED_LIVE_FIELDS if k in step.get("live", {})}
    if live:  # a host-only loop (gloo) has nothing baselined alive
        kept["live"] = live
    return kept


def _comparable_graph(graph: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = (
        {"collectives": graph["collectives"]}
        if graph.get("collectives") is not None
        else {"collectives": None, "unread": graph.get("unread", "")}
    )
    if "memory" in graph:
        kept["memory"] = dict(graph["memory"])
    return kept


NATIVE_NAMES = {"heap_bytes": "native heap (malloc in use)", "rss_bytes": "resident set"}
