"""Cost signatures of training steps: what a step compiles, executes and communicates.

The SPMD regressions users report most change neither an outcome nor a sharding: a spec that
flips between '' and '{replicated}' makes every step compile a new graph (pytorch/xla#9755),
memory grows 2.5x between nightlies (#8423). On CPU XLA their causes are deterministic and cheap
to read, so a case's training loop records them (harness.stepcosts, in the child) as a
*signature*, a JSON value:

    {"warmup": 2,
     "steps":  [{"compiles": 1, "cache_hits": 0, "executions": 1, "graphs": ["step0"]}, ...],
     "graphs": {"step0": {"collectives": [{"kind": "all-gather", "replica_groups": "{{0,1,2,3}}",
                                           "count": 3, "bytes_per_device": 3072}, ...],
                          "fingerprint": "3f2a..."}},
     "memory": {"parameters": 51200, "gradients": 51200, "optimizer_state": 0}}

* per step (deltas of torch_xla's metrics around it): graphs compiled new (`UncachedCompile`),
  graphs served from the compilation cache (`CachedCompile`), executions (`ExecuteReplicated`);
* per distinct compiled step graph (named after the step that compiled it), the collectives of
  XLA's partitioned, optimized module (`*after_optimizations.txt`), read by opcode, never by
  SSA name, grouped by kind and replica groups, with the bytes each device moves;
* the bytes of parameters, gradients and optimizer state one device holds, from each tensor's
  shape and sharding (the device holding the most, where tiles are uneven).

This module is the pure part (standard library only, so the parent pytest process imports it):
reading collectives out of HLO text, checking a signature read back from a child or a file,
the steady-state rule, and the per-item comparison the cost baseline (harness.costbaseline),
the release matrix and the GKE aggregation share.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from harness.errors import HarnessError
from harness.hlo import (
    COLLECTIVE_OPCODES,
    HloModule,
    HloParseError,
    donated_parameters,
    entry_parameter_count,
    entry_parameters,
    instructions_naming,
    parse_hlo,
    shape_index,
)
from harness.schema import shown
from harness.sharding import ShardingParseError, format_sharding, iota_device_ids

# Where a child leaves its signatures and the partitioned modules they were read from
# (CaseContext values; the parent pops the dumps so they reach the results folder only on failure).
SIGNATURES_VALUE = "harness:costs"
DUMPS_VALUE = "harness:cost-dumps"
# memray's captures of a loop's tracked step (harness.nativestacks), base64, by `<label>_step<N>`:
# the parent keeps them under the run folder's memray/ when the case fails.
CAPTURES_VALUE = "harness:memray-captures"
MAX_CAPTURE_BYTES = 4 << 20  # of one capture kept (an aggregated capture of one step is far smaller)
MAX_CAPTURES = 4  # per case
DEFAULT_LABEL = "train"
DEFAULT_WARMUP = 2

# Bytes of one element per HLO element type. Sub-byte types count a byte: an upper bound.
ELEMENT_BYTES = {
    "pred": 1,
    "s2": 1,
    "u2": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f4e2m1fn": 1,
    "f8e5m2": 1,
    "f8e4m3fn": 1,
    "f8e4m3b11fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e4m3": 1,
    "f8e3m4": 1,
    "f8e8m0fnu": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
MEMORY_FIELDS = ("parameters", "gradients", "optimizer_state")
STEP_FIELDS = ("compiles", "cache_hits", "executions")
# What is alive after a step (harness.stepcosts): XLA tensors the loop holds and their bytes on the
# device holding most, GC-tracked host objects the loop created. Host objects only judge growth
# (steady state): their count depends on what was imported before the loop, so it is not baselined.
# heap_bytes and rss_bytes: what the process holds natively (harness.nativememory), judged by growth only.
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

_ARRAY_SHAPE = re.compile(r"(?P<type>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")


class CostReadError(HarnessError, ValueError):
    """HLO text or a signature that cannot be read as one: the message names where and what."""


class CountersReset(HarnessError):
    """torch_xla's counters or metrics went backwards during a measured step (something called
    metrics.clear_counters(), clear_all() or clear_metrics(), in Python or in C++): the step's
    compiles and executions cannot be known, so the case errors instead of reading as clean."""


# --------------------------------------------------------------------------------------------
# Reading a partitioned module
# --------------------------------------------------------------------------------------------


def shape_bytes(shape: str, where: str = "") -> int:
    """Bytes of an HLO shape: `f32[16,32]{1,0}` -> 2048; a tuple shape is the sum of its arrays.

    Dynamic dimensions (`<=8`) count at their bound."""
    total = 0
    for match in _ARRAY_SHAPE.finditer(shape):
        element = match.group("type")
        if element not in ELEMENT_BYTES:
            raise CostReadError(f"{where}: element type {element!r} of shape {shape!r} is not an HLO element type")
        count = 1
        for dim in filter(None, (d.strip() for d in match.group("dims").split(","))):
            try:
                count *= int(dim.lstrip("<="))
            except ValueError:
                raise CostReadError(f"{where}: dimension {dim!r} of shape {shape!r} is not a number") from None
        total += count * ELEMENT_BYTES[element]
    return total


def _tuple_elements(shape: str) -> list[str]:
    return [m.group(0) for m in _ARRAY_SHAPE.finditer(shape)]


def replica_groups(text: str | None, devices: int, where: str = "") -> tuple[tuple[int, ...], ...]:
    """`{{0,1},{2,3}}` or the iota form `[2,2]<=[4]` / `[2,2]<=[2,2]T(1,0)` as explicit groups;
    none or `{}` is one group of every device (XLA's meaning)."""
    text = (text or "").strip()
    if text in ("", "{}"):
        return (tuple(range(devices)),)
    iota = re.fullmatch(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text.replace(" ", ""))
    if iota:
        groups, size = int(iota.group(1)), int(iota.group(2))
        reshape = tuple(int(x) for x in iota.group(3).split(","))
        perm = tuple(int(x) for x in iota.group(4).split(",")) if iota.group(4) else None
        try:
            ids = iota_device_ids(reshape, perm)
        except (ShardingParseError, ValueError) as exc:
            raise CostReadError(f"{where}: replica_groups={text}: {exc}") from None
        if len(ids) != groups * size:
            raise CostReadError(f"{where}: replica_groups={text} names {len(ids)} devices, not {groups}x{size}")
        return tuple(tuple(ids[g * size : (g + 1) * size]) for g in range(groups))
    if not re.fullmatch(r"\{\s*(\{[\d,\s]*\}\s*,?\s*)*\}", text):
        raise CostReadError(f"{where}: replica_groups={text} is neither {{{{0,1,...}},...}} nor an iota form")
    return tuple(
        tuple(int(x) for x in group.split(",") if x.strip()) for group in re.findall(r"\{([\d,\s]*)\}", text[1:-1])
    )


def _groups_text(groups: tuple[tuple[int, ...], ...]) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def _moved_bytes(kind: str, result_bytes: int, group_size: int) -> int:
    """Bytes one device sends under the ring algorithm: a model, deterministic and comparable
    between graphs, not a measurement. All-gather receives the other g-1 shards of its result;
    reduce-scatter sends g-1 results; all-reduce is a reduce-scatter plus an all-gather."""
    g = max(group_size, 1)
    if kind == "all-gather":
        return result_bytes * (g - 1) // g
    if kind == "reduce-scatter":
        return result_bytes * (g - 1)
    if kind == "all-reduce":
        return 2 * result_bytes * (g - 1) // g
    if kind in ("all-to-all", "ragged-all-to-all"):
        return result_bytes * (g - 1) // g
    return result_bytes  # collective-permute, collective-broadcast: the whole buffer once


def collectives(hlo: str | HloModule, devices: int, where: str = "the partitioned module") -> list[dict[str, Any]]:
    """The collectives of a partitioned module by role: one entry per (kind, replica groups),
    with how many instructions and the bytes one device moves for them, sorted by kind.

    Async pairs count once (the `-start`); an instruction in a loop body counts once (text, not
    trip count). Collective-permute is grouped by its source-target pairs.
    """
    try:
        # Only lines that name a collective can hold one: the rest of a large module is not parsed.
        instructions = hlo.instructions if isinstance(hlo, HloModule) else instructions_naming(hlo, COLLECTIVE_OPCODES)
    except HloParseError as exc:
        raise CostReadError(f"{where}: {exc}") from None
    grouped: dict[tuple[str, str], list[int]] = {}
    for instruction in instructions:
        kind = instruction.opcode.removesuffix("-start")
        if kind not in COLLECTIVE_OPCODES:
            continue
        at = f"{where}, line {instruction.line_number}"
        shape = instruction.shape
        if instruction.opcode.endswith("-start") and kind != "all-reduce":
            elements = _tuple_elements(shape)  # (operand, result[, context...]): the result moves
            shape = elements[1] if len(elements) > 1 else shape
        if kind in ("collective-permute", "collective-broadcast"):
            pairs = instruction.attribute("source_target_pairs") or instruction.attribute("replica_groups") or "{}"
            key, size = "pairs " + pairs.replace(" ", ""), 2
        else:
            groups = replica_groups(instruction.attribute("replica_groups"), devices, at)
            key, size = _groups_text(groups), max((len(g) for g in groups), default=1)
        entry = grouped.setdefault((kind, key), [0, 0])
        entry[0] += 1
        entry[1] += _moved_bytes(kind, shape_bytes(shape, at), size)
    return [
        {"kind": kind, "replica_groups": groups, "count": count, "bytes_per_device": moved}
        for (kind, groups), (count, moved) in sorted(grouped.items())
    ]


_ALLOCATION = re.compile(r"^allocation \d+: size (?P<size>\d+)(?P<kinds>[^\n]*?):?$", re.MULTILINE)
_PEAK_SECTION = re.compile(r"^\s*Live ranges at \d+ \(peak\):\n(?P<body>(?:[ \t]+\S[^\n]*\n?)*)", re.MULTILINE)
# One buffer live at the peak: `copy.9{}: 2048 bytes (cumulative: 4096 bytes)` (XLA of torch_xla
# 2.9), `copy.9: 2048 bytes` (2.4-2.8 print no running total). Its own size is the first number.
_PEAK_BUFFER = re.compile(r"^[ \t]+\S+: (\d+) bytes(?: \(cumulative: \d+ bytes\))?$", re.MULTILINE)


_TOTAL_BYTES = re.compile(r"^Total bytes used: (\d+)", re.MULTILINE)
# A parameter allocation: `allocation 1: size 512, parameter 3, shape |f32[8,16]| at ShapeIndex {}`.
_PARAMETER_ALLOCATION = re.compile(
    r", parameter (?P<number>\d+), shape \|[^|]*\| at ShapeIndex \{(?P<index>[\d,\s]*)\}"
)


def buffer_memory(
    text: str, where: str = "the buffer assignment", donated: frozenset[tuple[int, str]] = frozenset()
) -> dict[str, int]:
    """A partitioned module's memory on one device, from XLA's `*-buffer-assignment.txt`:
    arguments (entry parameters), outputs (buffers that may live out, and the output tuple, but
    those that reuse a parameter's buffer), temp (everything else XLA allocates: preallocated
    temp, scratch; not constants or thread-local scalars), donated (the arguments in `donated`,
    (parameter number, shape index) pairs the module aliases to its outputs or takes as donors:
    module_donations) and, where XLA printed its live ranges, peak (bytes live at once).

    Checked against XLA's own figure: the allocations read must add up to the file's
    `Total bytes used`, or the file was misread and CostReadError says so."""
    totals = dict.fromkeys(("arguments", "outputs", "temp", "donated"), 0)
    found = everything = 0
    for match in _ALLOCATION.finditer(text):
        found += 1
        size, kinds = int(match.group("size")), match.group("kinds")
        everything += size
        parameter = _PARAMETER_ALLOCATION.search(kinds)
        if parameter:
            totals["arguments"] += size
            if (int(parameter.group("number")), shape_index(parameter.group("index"))) in donated:
                totals["donated"] += size
        elif "maybe-live-out" in kinds or "output shape is" in kinds:
            totals["outputs"] += size
        elif "constant" not in kinds and "thread-local" not in kinds:
            totals["temp"] += size
    if not found:
        raise CostReadError(f"{where}: no 'allocation N: size S' line; not an XLA buffer assignment")
    total = _TOTAL_BYTES.search(text)
    if total and int(total.group(1)) != everything:
        raise CostReadError(
            f"{where}: its allocations add up to {everything} bytes, XLA's own 'Total bytes used' says "
            f"{total.group(1)}: the file was misread (a format this harness does not know)"
        )
    peak = _PEAK_SECTION.search(text)
    live_at_peak = _PEAK_BUFFER.findall(peak.group("body")) if peak else []
    if live_at_peak:
        # The sum of the buffers listed, which is the last running total where XLA prints one.
        totals["peak"] = sum(int(size) for size in live_at_peak)
    return totals


def program_bytes(memory: Mapping[str, int]) -> int:
    """What a step program holds on one device while it runs, as XLA's buffer assignment places it:
    its arguments (the donated ones share their buffer with the output that reuses it), the
    outputs that reuse no argument, and its temp. A build that stops donating keeps the arguments
    and adds their outputs' buffers: this grows by what was donated (jax's memory_analysis():
    argument + output - alias + temp)."""
    return memory.get("arguments", 0) + memory.get("outputs", 0) + memory.get("temp", 0)


def module_donations(hlo: str, where: str = "the partitioned module") -> frozenset[tuple[int, str]]:
    """harness.hlo.donated_parameters (the one reader of a module's `input_output_alias` and
    `buffer_donor`), its error a CostReadError naming `where`."""
    try:
        return donated_parameters(hlo)
    except HloParseError as exc:
        raise CostReadError(f"{where}: {exc}") from None


def module_aliases(hlo: str, donated: frozenset[tuple[int, str]], where: str) -> dict[str, int] | None:
    """{"donated": parameters the module gives up to its outputs, "parameters": its entry parameters}:
    what a record keeps of a step module's aliasing (two counts, not the module), so a later run
    can say "the build's step module aliases 0 of 12 parameters (base: 12)". None where the header
    does not say how many parameters there are."""
    try:
        count = entry_parameter_count(hlo)
    except HloParseError as exc:
        raise CostReadError(f"{where}: {exc}") from None
    if count is None:
        return None
    return {"donated": len({number for number, _ in donated}), "parameters": count}


def read_module(text: str, where: str) -> HloModule:
    """A module's text parsed once, for the readers here that take an HloModule (a step graph's
    module before optimisation is read twice: its inputs and its fingerprint)."""
    try:
        return parse_hlo(text)
    except HloParseError as exc:
        raise CostReadError(f"{where}: {exc}") from None


def entry_inputs(hlo: str | HloModule, where: str = "the step graph") -> list[str]:
    """Each entry parameter of a graph as `shape sharding` (`f32[8,16] {devices=[4,1]0,1,2,3}`),
    in parameter order: what a new compilation's inputs differ in (layouts dropped)."""
    try:
        module = hlo if isinstance(hlo, HloModule) else parse_hlo(hlo)
        return [
            f"{re.sub(r'{[^}]*}$', '', p.shape)} {format_sharding(p.sharding) or chr(39) * 2}"
            for p in entry_parameters(module)
        ]
    except (HloParseError, ShardingParseError) as exc:
        raise CostReadError(f"{where}: {exc}") from None


def fingerprint(hlo: str | HloModule) -> str:
    """A hash of a graph's structure (opcodes, shapes, shardings, operand positions), blind to
    instruction names, module names and metadata, which change from graph to graph."""
    module = hlo if isinstance(hlo, HloModule) else parse_hlo(hlo)
    digest = hashlib.sha256()
    for computation in module.computations:
        positions = {i.name: n for n, i in enumerate(computation.instructions)}
        for instruction in computation.instructions:
            operands = ",".join(str(positions.get(name, "?")) for name in instruction.operand_names)
            attributes = ",".join(
                f"{k}={v}"
                for k, v in instruction.attributes
                if k not in ("metadata", "calls", "to_apply", "channel_id", "backend_config")
            )
            digest.update(f"{instruction.opcode}|{instruction.shape}|{operands}|{attributes}\n".encode())
    return digest.hexdigest()[:16]


def input_differences(before: list[str], after: list[str]) -> list[str]:
    """What a new graph's inputs differ in from the graph the step before ran. Where their number
    differs, the inputs one graph has more of than the other (positions shift, so parameter(12)
    against parameter(12) would compare unrelated inputs): '17 -> 25 parameters (new: f32[32,16] x2)'."""
    if len(before) == len(after):
        return [f"parameter({n}): {a} -> {b}" for n, (a, b) in enumerate(zip(before, after)) if a != b]
    more, fewer = (
        collections.Counter(after) - collections.Counter(before),
        collections.Counter(before) - collections.Counter(after),
    )
    listed = [
        f"{what}: " + ", ".join(f"{shape} x{n}" if n > 1 else shape for shape, n in sorted(counts.items())[:6])
        for what, counts in (("new", more), ("gone", fewer))
        if counts
    ]
    return [f"{len(before)} -> {len(after)} parameters" + (f" ({'; '.join(listed)})" if listed else "")]


def tensor_bytes_per_device(shape: list[int], element_bytes: int, tiles: list[int] | None) -> int:
    """Bytes of a tensor on the device holding its largest shard: dim d cut into tiles[d] pieces
    (ceil), None for a tensor not tiled (replicated or unannotated: every device holds it all)."""
    count = 1
    for index, size in enumerate(shape):
        pieces = tiles[index] if tiles and index < len(tiles) else 1
        count *= -(-size // max(pieces, 1))
    return count * element_bytes


# --------------------------------------------------------------------------------------------
# Checking a signature (from a child, a results folder or a baseline file: untrusted)
# --------------------------------------------------------------------------------------------


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
    if "live" in step:
        _check_counts(step["live"], LIVE_FIELDS, f"{where}: live")
    if "spmd_calls" in step:
        _check_calls(step["spmd_calls"], f"{where}: spmd_calls")
    fields = {*STEP_FIELDS, "graphs", "differs", "kept", "native_stacks", "native_leaks", "live", "spmd_calls"}
    unknown = sorted(set(step) - fields)
    if unknown:
        raise CostReadError(f"{where}: unknown key {unknown[0]!r}")


def _check_counts(value: Any, fields: tuple[str, ...], where: str) -> None:
    if not isinstance(value, dict) or not all(k in fields and _is_count(v) for k, v in value.items()):
        raise CostReadError(f"{where} must map {', '.join(fields)} to whole numbers; got {shown(value)}")


MAX_CALL_NAMES = 16  # SPMD APIs counted per step (harness.spmdcalls names six)


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


def with_native(signature: Mapping[str, Any]) -> dict[str, Any]:
    """comparable(), plus the native growth per step (native_growth): what a record keeps, so a
    later run compared with this one (--spmd-compare) can judge its own growth against it. Not in
    a baseline: native memory depends on the process's history."""
    kept = comparable(signature)
    for name, graph in kept["graphs"].items():  # the donation-lost diagnosis reads them against a base run
        aliases = signature.get("graphs", {}).get(name, {}).get("aliases")
        if aliases is not None:
            graph["aliases"] = dict(aliases)
    growth = native_growth(signature)
    if growth:
        kept["native"] = growth
    calls = calls_per_step(signature)
    if calls:
        kept["spmd_calls"] = calls
    return kept


def calls_per_step(signature: Mapping[str, Any]) -> dict[str, int]:
    """The SPMD API calls (harness.spmdcalls) every step after the warm-up made at least: what a
    native leak per call multiplies by."""
    steps = signature.get("steps", [])[max(signature.get("warmup", DEFAULT_WARMUP), 1) :]
    if not steps:
        return {}
    names = set.intersection(*(set(step.get("spmd_calls") or {}) for step in steps))
    return {name: min(step["spmd_calls"][name] for step in steps) for name in sorted(names)}


def native_growth(signature: Mapping[str, Any]) -> dict[str, int]:
    """Per native figure, the growth every judged step reached at least (0 where one shrank): what
    a leak adds each step, which a one-off allocation or a window does not. Two judged steps needed.
    Where the loop has LEAK_STEPS two-step spans after the warm-up, half the least growth over
    each two steps if that is more (a leak every other step, steady_state_problems' second rule)."""
    steps = signature.get("steps", [])
    start = max(signature.get("warmup", DEFAULT_WARMUP), 1)
    judged = list(range(start, len(steps)))[-LEAK_STEPS:]
    if len(judged) < 2:
        return {}
    paired = list(range(start + 1, len(steps)))[-LEAK_STEPS:]
    spans = [(i - 1, i, 1) for i in judged] + ([(i - 2, i, 2) for i in paired] if len(paired) == LEAK_STEPS else [])
    lives = {i: steps[i].get("live") or {} for a, b, _ in spans for i in (a, b)}
    growth = {}
    for field in NATIVE_FIELDS:
        if all(field in live for live in lives.values()):
            rates = [
                min((lives[b][field] - lives[a][field]) // gap for a, b, g in spans if g == gap)
                for gap in sorted({g for _, _, g in spans})
            ]
            growth[field] = max(0, *rates)
    return growth


def native_against_base(base: Mapping[str, Any], observed: Mapping[str, Any], label: str = DEFAULT_LABEL) -> list[str]:
    """'native heap (malloc in use) +96 KiB per step, base +3 KiB per step (...)' for each figure that
    grows more per step than in the base run's record; nothing where the base recorded none."""
    before, after = base.get("native") or {}, observed.get("native") or native_growth(observed)
    lines = []
    for field in NATIVE_FIELDS:
        if field in before and field in after and after[field] - before[field] > NATIVE_MARGIN_OVER_BASE[field]:
            lines.append(
                f"{_prefix(label)}native: {NATIVE_NAMES[field]} {_signed(after[field])} per step, base run "
                f"{_signed(before[field]) if before[field] else '+0 B'} per step (more than "
                f"+{kib(NATIVE_MARGIN_OVER_BASE[field])} over the base on each judged step)"
            )
    return lines


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


# --------------------------------------------------------------------------------------------
# Steady state and comparison
# --------------------------------------------------------------------------------------------


# A leak grows on every step; a bounded window (deque(maxlen=k), a list trimmed to k) grows until
# it is full, then stays flat. So a figure leaks when it grew on each of the last LEAK_STEPS steps
# after the warm-up (fewer where the loop ran fewer: then a window still filling reads as a leak;
# native memory needs two).
# docs/costs.md#leaks-and-windows: a loop needs warm-up + 3 steps, and k+1 for a window of k.
LEAK_STEPS = 3
METERED_STEPS = DEFAULT_WARMUP + LEAK_STEPS  # what the library's own metered loops run in the PR tier
# The nightly tier's metered loops (docs/tiers.md): long enough for a slope over the judged steps to
# tell a slow leak, or one every k-th step (k up to a third of the judged steps), from a one-off.
NIGHTLY_METERED_STEPS = 20
# A slope is judged over this many steps after the warm-up at least (a 20-step loop has 18).
SLOPE_MIN_STEPS = 12
# Native growth per step, over the judged steps and in each third of them, that a healthy loop stays
# under: healthy 20-step loops on torch_xla 2.9.0 drift by +3.6 KiB heap and +5 KiB resident set per
# step (docs/costs.md#slow-leaks); a numpy copy of a small model's weights kept per step reads +15 KiB.
NATIVE_SLOPE_PER_STEP = {"heap_bytes": 8 << 10, "rss_bytes": 64 << 10}


def metered_steps(tier: str) -> int:
    """How many steps a metered loop runs in `tier` (spmd.tier): 5 on a PR, 20 nightly."""
    return NIGHTLY_METERED_STEPS if tier == "nightly" else METERED_STEPS


# Native growth a healthy loop never reaches per step after the warm-up: measured on torch_xla
# 2.4.0, 2.6.0 and 2.9.0 (the FSDPv2 and ViT loops: heap -10 to +27 KiB, resident set +0 to +252 KiB
# per step; 20-step loops: heap at most +17.8 KiB a step). 64 KiB was tried (#50) and refused: the
# training job's loops (cases/test_training_job.py: loader, AdamW, remat) grow +67 and +81 KiB a step
# on 2.6.0, every run, and pass on 2.4.0 and 2.9.0. A C++ leak of 128 KiB or more per step, or MiBs
# of untracked objects, is above. (Slower leaks: the nightly tier's slope, slow_leaks.)
NATIVE_GROWTH_PER_STEP = {"heap_bytes": 128 << 10, "rss_bytes": 1 << 20}
NATIVE_NAMES = {"heap_bytes": "native heap (malloc in use)", "rss_bytes": "resident set"}
# More native growth per step than the base run: a finding when this build's growth on every judged
# step exceeds the base's by more than half the absolute threshold (64 KiB heap, 512 KiB resident set),
# above the least growth of a healthy loop's judged steps (heap +0 to +10 KiB, resident set +0 to +252 KiB).
NATIVE_MARGIN_OVER_BASE = {field: floor // 2 for field, floor in NATIVE_GROWTH_PER_STEP.items()}


def steady_state_problems(signature: Mapping[str, Any], label: str = DEFAULT_LABEL) -> list[str]:
    """One line per step after the warm-up that compiled a new graph, saying what differs, and
    one for what grew on each of the last steps judged (XLA tensors, their bytes, host objects,
    native memory beyond NATIVE_GROWTH_PER_STEP), saying what stayed alive."""
    warmup = signature.get("warmup", DEFAULT_WARMUP)
    steps = signature.get("steps", [])
    problems = []
    compiled = [index for index, step in enumerate(steps) if index >= warmup and step.get("compiles")]
    for index in compiled:
        why = "; ".join(steps[index].get("differs") or ["what differs is unknown (no dump of the new graph)"])
        problems.append(
            f"{_prefix(label)}step{index} compiled {steps[index]['compiles']} new graph(s) after the "
            f"{warmup}-step warm-up: {why}"
        )
    if len(compiled) == 1 and compiled[0] < len(steps) - 1:
        problems[-1] += (
            f" (once: the steps after it compiled nothing. If the loop's first steps differ by design, such as "
            f"gradient accumulation over k steps whose optimizer makes its state on step k-1, give the meter a "
            f"warm-up that covers them, StepMeter(ctx, warmup=...), and LEAK_STEPS={LEAK_STEPS} steps after it)"
        )
    # The nightly tier's stack judge (harness.nativestacks.WindowTrace): a stack that held more blocks
    # after each step it watched, named with its bytes per step.
    problems += [
        f"{_prefix(label)}{line}"
        for step in steps
        for line in step.get("native_leaks", [])
        if line.startswith("native stack holding more blocks")
    ]
    judged = list(range(max(warmup, 1), len(steps)))[-LEAK_STEPS:]
    leak = _leak(steps, judged) if judged else None
    if leak:
        first, last = judged[0], judged[-1]
        where = (
            f"step{first} left more alive than step{first - 1}"
            if first == last
            else f"step{first}..step{last} each left more alive than the step before"
        )
        problems.append(f"{_prefix(label)}{where}: {leak}")
        return problems
    # A leak on every other step (the optimizer step of a 2-step gradient accumulation) grows on no
    # two consecutive steps; it grows over each two. Judged where LEAK_STEPS such spans follow the
    # warm-up (6 steps with the 2-step warm-up): a one-off, or a window that fills, grows over at
    # most two of them.
    paired = list(range(max(warmup, 1) + 1, len(steps)))[-LEAK_STEPS:]
    leak = _leak(steps, paired, gap=2) if len(paired) == LEAK_STEPS else None
    if leak:
        problems.append(
            f"{_prefix(label)}step{paired[0]}..step{paired[-1]} each left more alive than two steps before "
            f"(a leak every other step): {leak}"
        )
        return problems
    slow = slow_leaks(steps, warmup)
    if slow:
        first = max(warmup, 1)
        problems.append(f"{_prefix(label)}step{first}..step{len(steps) - 1} (a slow leak): {'; '.join(slow)}")
    return problems


def slow_leaks(steps: list[Mapping[str, Any]], warmup: int) -> list[str]:
    """Native growth too slow for the per-step rule, seen over a long loop (SLOPE_MIN_STEPS judged
    steps, the nightly tier's): a figure whose least-squares slope over the judged steps, and whose
    growth over each third of them, reach NATIVE_SLOPE_PER_STEP. A one-off grows one third; a leak
    every k-th step (k up to a third of the judged steps) grows all three."""
    first = max(warmup, 1)
    lives = [step.get("live") or {} for step in steps[first - 1 :]]
    if len(lives) - 1 < SLOPE_MIN_STEPS:
        return []
    found = []
    for field, floor in NATIVE_SLOPE_PER_STEP.items():
        if not all(field in live for live in lives):
            continue
        values = [live[field] for live in lives]
        n = len(values)
        cuts = [0, (n - 1) // 3, 2 * (n - 1) // 3, n - 1]
        thirds = [values[b] - values[a] for a, b in zip(cuts, cuts[1:])]
        mean_x, mean_y = (n - 1) / 2, sum(values) / n
        slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / sum(
            (x - mean_x) ** 2 for x in range(n)
        )
        if slope >= floor and all(grew >= floor * (b - a) for grew, a, b in zip(thirds, cuts, cuts[1:])):
            found.append(
                f"{NATIVE_NAMES[field]} {_signed(int(slope))} per step over {n - 1} steps (least-squares slope; "
                f"{', '.join(_signed(t) for t in thirds)} over each third of them; {kib(values[0])} -> "
                f"{kib(values[-1])}; a healthy loop stays under +{kib(floor)} per step)"
            )
    if found:
        tracked = next((s.get("native_stacks") for s in reversed(steps) if s.get("native_stacks")), None)
        found += list(tracked or [])
    return found


def _leak(steps: list[Mapping[str, Any]], judged: list[int], gap: int = 1) -> str | None:
    """What grew over each judged step (from `gap` steps before it), and what stayed alive after
    the last; None where nothing did."""
    indexes = sorted({i - gap for i in judged} | set(judged))
    lives = {i: steps[i].get("live") for i in indexes}
    found: dict[int, Mapping[str, int]] = {i: live for i, live in lives.items() if live}
    if len(found) < len(lives):
        return None
    pairs: list[tuple[Mapping[str, int], Mapping[str, int]]] = [(found[i - gap], found[i]) for i in judged]

    def grew_each(field: str, by: int = 1) -> bool:
        if not all(field in a and field in b for a, b in pairs):
            return False
        if not all(b[field] - a[field] >= by for a, b in pairs):
            return False
        # over two-step spans: growth on every other step and none between (a window that fills, or
        # a one-off next to a leak's step, grows on two steps in a row)
        grew = [found[i][field] - found[i - 1][field] >= by for i in range(judged[0] - gap + 1, judged[-1] + 1)]
        return gap == 1 or all(a != b for a, b in zip(grew, grew[1:]))

    before, after = found[judged[0] - gap], found[judged[-1]]
    parts = []
    if grew_each("tensors") or grew_each("bytes_per_device"):
        moved = after.get("bytes_per_device", 0) - before.get("bytes_per_device", 0)
        parts.append(
            f"XLA tensors {before.get('tensors', 0)} -> {after.get('tensors', 0)}"
            + (f" ({_signed(moved)} per device)" if moved else "")
        )
    held_before = grew_each("footprint_bytes") and not (grew_each("tensors") or grew_each("bytes_per_device"))
    if held_before:
        parts.append(
            f"device footprint {kib(before['footprint_bytes'])} -> {kib(after['footprint_bytes'])} per device "
            "(tensors made before the loop included)"
        )
    if grew_each("host_objects"):
        parts.append(f"host objects {before.get('host_objects', 0)} -> {after['host_objects']}")
    # One step's native growth can be a one-off (a new graph's compilation, an arena malloc keeps):
    # native memory is judged over two steps after the warm-up at least.
    # Its threshold is a rate: over `gap` steps, `gap` times the growth a healthy loop stays under per step.
    native = [
        field for field, floor in NATIVE_GROWTH_PER_STEP.items() if len(judged) >= 2 and grew_each(field, floor * gap)
    ]
    for field in native:
        per_step = (after[field] - before[field]) // (judged[-1] - judged[0] + gap)
        parts.append(
            f"{NATIVE_NAMES[field]} {_signed(per_step)} per step ({kib(before[field])} -> {kib(after[field])}; "
            f"a healthy loop stays under +{kib(NATIVE_GROWTH_PER_STEP[field])} per step)"
        )
    if not parts:
        return None
    # what the latest judged step that kept anything kept (a leak every other step keeps on every other),
    # but the step memray tracked, whose objects memray's own import and tracker left (harness.nativestacks)
    tracked = next((i for i, step in enumerate(steps) if step.get("native_stacks")), None)
    kept = next((list(steps[i]["kept"]) for i in reversed(judged) if steps[i].get("kept") and i != tracked), [])
    if held_before and not kept:
        kept = ["the loop made nothing that stayed alive: tensors made before the loop hold more"]
    if native and not kept:
        kept = [
            "nothing the collector tracks grew: C++ allocations (torch_xla, XLA), or objects it does not track "
            "(bytes, ints, floats, numpy arrays) kept by a container made before the meter"
        ]
    if native:  # where the native memory of a traced step was allocated (harness.nativestacks)
        kept += steps[judged[-1]].get("native_stacks") or []
    return ", ".join(parts) + "; " + "; ".join(kept or ["what stayed alive is unknown"])


# Bytes are judged with a band, counts exactly (docs/costs.md#bands). XLA's buffer assignment moves
# from release to release by a few bytes to a few percent (a padded scalar, a fused copy: 177.3 KiB
# +16 B, 1.4 -> 1.5 KiB on a tiny graph, 90 -> 95.1 KiB temp from 2.7 to 2.8) while every count
# stays the same; what users report is memory that doubles (#8423: 2.5x). A byte figure fails when
# it grows by more than 5% of what it was and by more than 1 KiB; a smaller growth is listed
# ("within the band"), a decrease is listed as an improvement. A count (compilations, executions,
# collectives and their replica groups, live tensors) fails on any change.
BYTES_BAND_RELATIVE = 0.05
BYTES_BAND_FLOOR = 1024
FAILS, WITHIN_BAND, IMPROVEMENT = "fails", "within the band", "improvement"


def bytes_judgement(before: int, after: int) -> str:
    """FAILS when `after` exceeds `before` by more than the band, IMPROVEMENT when it is lower,
    else WITHIN_BAND (equal figures are not a change at all: callers skip them)."""
    if after < before:
        return IMPROVEMENT
    grew = after - before
    return FAILS if grew > BYTES_BAND_FLOOR and grew > before * BYTES_BAND_RELATIVE else WITHIN_BAND


def band_text() -> str:
    return f"+{BYTES_BAND_RELATIVE:.0%} and +{kib(BYTES_BAND_FLOOR)}"


@dataclasses.dataclass(frozen=True)
class CostChange:
    item: str  # "step0", "memory", "step3" (a step's counts), prefixed with the meter's label
    detail: str  # "all-gather 3 -> 5 (+96 KiB per device)"
    judgement: str = FAILS  # WITHIN_BAND or IMPROVEMENT: a byte move that is listed, not failed

    @property
    def fails(self) -> bool:
        return self.judgement == FAILS

    def __str__(self) -> str:
        listed = "" if self.fails else f" [{self.judgement}, listed]"
        return f"{self.item}: {self.detail}{listed}"


def failing(changes: list[CostChange]) -> list[CostChange]:
    return [c for c in changes if c.fails]


def listed(changes: list[CostChange]) -> list[CostChange]:
    """Byte moves within the band and improvements: shown, never failed."""
    return [c for c in changes if not c.fails]


class _Parts:
    """The parts of one item's change, grouped by judgement: one CostChange per judgement."""

    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {}
        self.explained = False  # a footprint change here names its new buffers

    def add(self, text: str, judgement: str = FAILS) -> None:
        self.parts.setdefault(judgement, []).append(text)

    def add_bytes(self, text: str, before: int, after: int) -> None:
        self.add(text, bytes_judgement(before, after))

    def extend(self, other: _Parts) -> None:
        for judgement, texts in other.parts.items():
            self.parts.setdefault(judgement, []).extend(texts)

    def changes(self, item: str) -> list[CostChange]:
        return [
            CostChange(item, ", ".join(self.parts[j]), j) for j in (FAILS, WITHIN_BAND, IMPROVEMENT) if j in self.parts
        ]


def kib(count: int) -> str:
    """1536 -> '1.5 KiB', 100 -> '100 B': sizes a reader compares at a glance."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= size:
            return f"{count / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} B"


def _signed(count: int) -> str:
    return ("+" if count > 0 else "-") + kib(abs(count))


def compare_loops(
    expected: Mapping[str, Mapping[str, Any]], observed: Mapping[str, Mapping[str, Any]], reference: str = "baseline"
) -> list[CostChange]:
    """Every training loop of a case, by label: compare() where both measured it, else a line
    saying which side lacks it (`reference` names where `expected` was read from)."""
    changes = []
    for label in sorted(set(expected) | set(observed)):
        if label not in observed:
            changes.append(CostChange(label, "training loop no longer measured"))
        elif label not in expected:
            changes.append(CostChange(label, f"training loop not in the {reference}"))
        else:
            changes += compare(expected[label], comparable(observed[label]), label)
    return changes


def compare(expected: Mapping[str, Any], observed: Mapping[str, Any], label: str = DEFAULT_LABEL) -> list[CostChange]:
    """Per-item changes between two signatures: a step's counts, a graph's collectives, memory.
    Counts fail on any change; bytes fail beyond the band and are listed otherwise (CostChange.judgement)."""
    changes: list[CostChange] = []
    prefix = _prefix(label)
    warmup_a, warmup_b = expected.get("warmup"), observed.get("warmup")
    if warmup_a is not None and warmup_b is not None and warmup_a != warmup_b:
        # A longer warm-up hides a leak or a compilation in the steps it no longer judges (a 5-step
        # loop with a 4-step warm-up judges one step, and native growth needs two): a count, exact.
        changes.append(
            CostChange(f"{prefix}warm-up", f"{warmup_a} -> {warmup_b} steps (steady state judges the steps after it)")
        )
    before_steps, after_steps = expected.get("steps", []), observed.get("steps", [])
    # A footprint that grew beyond the band is named by its new buffers (dtype, shape, sharding),
    # once, on the first step it fails on; where either side has no listing, the bytes alone.
    buffers_a, buffers_b = expected.get("buffers"), observed.get("buffers")
    explain = new_buffers(buffers_a, buffers_b) if buffers_a is not None and buffers_b is not None else ""
    # A loop longer than the baseline's (the nightly tier's 20 steps against a baseline of the PR
    # tier's 5) compares each step after the baseline's last with that last step: steps after the
    # warm-up run the same cached graph and leave the same alive, so each must read as it did.
    longer = len(after_steps) > len(before_steps) > (warmup_a if warmup_a is not None else DEFAULT_WARMUP)
    for index in range(max(len(before_steps), len(after_steps))):
        if index >= len(after_steps) or (index >= len(before_steps) and not longer):
            changes.append(
                CostChange(
                    f"{prefix}step{index}", "not run in the baseline" if index >= len(before_steps) else "no longer run"
                )
            )
            continue
        a, b = before_steps[min(index, len(before_steps) - 1)], after_steps[index]
        parts = _Parts()
        for k in STEP_FIELDS:
            if k != "cache_hits" and a.get(k) != b.get(k):
                parts.add(f"{k} {a.get(k)} -> {b.get(k)}")
        live = _live_change(a.get("live"), b.get("live"), explain)
        if live.explained:
            explain = ""
        parts.extend(live)
        changes += parts.changes(f"{prefix}step{index}")
    graphs_a, graphs_b = expected.get("graphs", {}), observed.get("graphs", {})
    for name in sorted(set(graphs_a) | set(graphs_b)):
        changes += _graph_change(graphs_a.get(name), graphs_b.get(name)).changes(f"{prefix}{name}")
    mem_a, mem_b = expected.get("memory", {}), observed.get("memory", {})
    parts = _Parts()
    for k in MEMORY_FIELDS:
        if mem_a.get(k) != mem_b.get(k) and (k in mem_a or k in mem_b):
            before, after = mem_a.get(k, 0), mem_b.get(k, 0)
            parts.add_bytes(f"{k.replace('_', ' ')} {_moved(before, after)}", before, after)
    changes += parts.changes(f"{prefix}memory per device")
    return _merge_listed_steps(changes, prefix)


def _merge_listed_steps(changes: list[CostChange], prefix: str) -> list[CostChange]:
    """One line for a byte move that every step of a run of steps shows alike ("step0..step4: step
    peak 177.3 KiB -> 177.3 KiB (+16 B) per device [within the band, listed]"): between two
    releases a padded buffer moves every step's peak by the same bytes. Failing changes stay one
    per step, as the baseline's lines name them."""
    merged: list[CostChange] = []
    run: list[tuple[int, CostChange]] = []

    def flush() -> None:
        if run:
            first, last = run[0][0], run[-1][0]
            item = f"{prefix}step{first}" + (f"..step{last}" if last > first else "")
            merged.append(dataclasses.replace(run[0][1], item=item))
            run.clear()

    for change in changes:
        index = _step_index(change.item, prefix)
        if index is None or change.fails:
            flush()
            merged.append(change)
            continue
        if run and (
            index != run[-1][0] + 1 or (change.detail, change.judgement) != (run[-1][1].detail, run[-1][1].judgement)
        ):
            flush()
        run.append((index, change))
    flush()
    return merged


def _step_index(item: str, prefix: str) -> int | None:
    """3 for f"{prefix}step3", else None (a graph, the memory line)."""
    rest = item.removeprefix(prefix)
    return int(rest[4:]) if item.startswith(prefix) and rest.startswith("step") and rest[4:].isdigit() else None


def _live_change(before: Mapping[str, int] | None, after: Mapping[str, int] | None, explain: str = "") -> _Parts:
    """'live after step: 10 -> 14 tensors (+32 KiB per device)' (a count: fails), or
    'live after step: 10 tensors, 1.2 KiB -> 1.3 KiB per device' (bytes alone: the band). A
    baseline taken before live tensors were measured has none: nothing to compare; a signature
    that lost them says so."""
    parts = _Parts()
    if before is None:
        return parts
    if after is None:
        parts.add("live after step: not measured")
        return parts
    count_a, count_b = before.get("tensors"), after.get("tensors")
    bytes_a, bytes_b = before.get("bytes_per_device", 0), after.get("bytes_per_device", 0)
    moved = bytes_b - bytes_a
    if count_a != count_b:
        parts.add(
            f"live after step: {count_a} -> {count_b} tensors" + (f" ({_signed(moved)} per device)" if moved else "")
        )
    elif moved:
        parts.add_bytes(f"live after step: {count_b} tensors, {_moved(bytes_a, bytes_b)} per device", bytes_a, bytes_b)
    for field, name in (
        ("footprint_bytes", "device footprint"),
        ("step_peak_bytes", "step peak (footprint + temp)"),
        ("held_peak_bytes", HELD_PEAK_NAME),
    ):
        held_a, held_b = before.get(field), after.get(field)
        if held_a is None or held_b is None or held_a == held_b:  # a baseline without it: not compared
            continue
        text = f"{name} {_moved(held_a, held_b)} per device"
        donated_a, donated_b = before.get("donated_bytes", 0), after.get("donated_bytes", 0)
        if field == "held_peak_bytes" and donated_b < donated_a:
            text += (
                f" (donated {_moved(donated_a, donated_b)}: {kib(donated_a - donated_b)} of arguments no longer "
                "aliased to outputs, so the step holds them and their outputs at once)"
            )
        if explain and bytes_judgement(held_a, held_b) == FAILS:
            text += f" (device buffers new: {explain})"
            parts.explained, explain = True, ""
        parts.add_bytes(text, held_a, held_b)
    return parts


def _memory_change(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> _Parts:
    """'temp 1.2 MiB -> 2.5 MiB per device', one part per field that moved, each judged by the band."""
    parts = _Parts()
    if before is None:
        return parts
    if after is None:
        parts.add("memory not read")
        return parts
    for k in GRAPH_MEMORY_FIELDS:
        if k in before and k in after and before[k] != after[k]:
            if k == "donated":  # fewer arguments donated: every step holds them and their outputs at once
                parts.add_bytes(
                    f"donated (arguments whose buffers the outputs reuse) {_moved(before[k], after[k])} per device",
                    after[k],
                    before[k],
                )
                continue
            parts.add_bytes(f"{k} {_moved(before[k], after[k])} per device", before[k], after[k])
    return parts


def _moved(before: int, after: int) -> str:
    """'1.2 MiB -> 2.5 MiB'; where both round alike, the bytes moved too: '177.3 KiB -> 177.3 KiB (+16 B)'."""
    shown = f"{kib(before)} -> {kib(after)}"
    return shown if kib(before) != kib(after) else f"{shown} ({_signed(after - before)})"


def _graph_change(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> _Parts:
    parts = _Parts()
    if before is None:
        parts.add("new graph, " + _listing(after.get("collectives") if after else None) + " (not in the baseline)")
    elif after is None:
        parts.add("no longer compiled")
    else:
        parts.extend(_collectives_change(before, after))
        parts.extend(_memory_change(before.get("memory"), after.get("memory")))
    return parts


def _collectives_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> _Parts:
    parts = _Parts()
    listed_a, listed_b = before.get("collectives"), after.get("collectives")
    if listed_a is None or listed_b is None:
        if listed_a is not None or listed_b is not None:
            parts.add(
                f"collectives no longer read ({after.get('unread', '')})"
                if listed_b is None
                else f"collectives read now: {_listing(listed_b)}"
            )
        return parts
    for kind in sorted({c["kind"] for c in listed_a} | {c["kind"] for c in listed_b}):
        a = [c for c in listed_a if c["kind"] == kind]
        b = [c for c in listed_b if c["kind"] == kind]
        count_a, count_b = sum(c["count"] for c in a), sum(c["count"] for c in b)
        bytes_a, bytes_b = sum(c["bytes_per_device"] for c in a), sum(c["bytes_per_device"] for c in b)
        moved = f" ({_signed(bytes_b - bytes_a)} per device)" if bytes_a != bytes_b else ""
        if count_a != count_b:
            parts.add(f"{kind} {count_a} -> {count_b}{moved}")
        elif _groups(a) != _groups(b):
            parts.add(f"{kind} over {_groups(a)} -> {_groups(b)}{moved}")
        elif moved:  # the same collectives moving other bytes: a byte figure, judged by the band
            parts.add_bytes(f"{kind} {count_a}{moved}", bytes_a, bytes_b)
    return parts


def _groups(entries: list[Mapping[str, Any]]) -> str:
    return " + ".join(
        f"{e['replica_groups']} x{e['count']}" for e in sorted(entries, key=lambda e: e["replica_groups"])
    )


def _listing(listed: list[Mapping[str, Any]] | None) -> str:
    if listed is None:
        return "collectives not read"
    totals: dict[str, int] = {}
    for entry in listed:
        totals[entry["kind"]] = totals.get(entry["kind"], 0) + entry["count"]
    return ", ".join(f"{kind} {count}" for kind, count in sorted(totals.items())) or "no collectives"


def summary(signature: Mapping[str, Any]) -> str:
    """One line for a whole signature: '3 steps, 1 compilation(s); step0: all-gather 3, temp 7 KiB;
    per device parameters 1 KiB, ...; live after step2: 6 tensors (1.5 KiB per device)'."""
    graphs = signature.get("graphs", {})
    listed = "; ".join(
        f"{name}: {_listing(g.get('collectives'))}"
        + "".join(f", {k} {kib(g['memory'][k])}" for k in ("temp", "peak") if k in g.get("memory", {}))
        for name, g in sorted(graphs.items())
    )
    memory = ", ".join(f"{k.replace('_', ' ')} {kib(v)}" for k, v in sorted(signature.get("memory", {}).items()))
    steps = signature.get("steps", [])
    last = steps[-1].get("live") if steps else None
    live = (
        f"; live after step{len(steps) - 1}: {last.get('tensors', 0)} tensors "
        f"({kib(last.get('bytes_per_device', 0))} per device)"
        if last
        else ""
    )
    return (
        f"{len(steps)} steps, {sum(s.get('compiles', 0) for s in steps)} "
        f"compilation(s); {listed or 'no graph read'}; per device {memory or 'memory not measured'}{live}"
    )


def held_cell(signature: Mapping[str, Any]) -> list[str]:
    """The release matrix's footprint and native figures of a record's signature (with_native):
    ['footprint 3.6 KiB, step peak 9.6 KiB', 'native heap +2 KiB, resident set +0 B per step']."""
    steps = signature.get("steps", [])
    live = (steps[-1].get("live") if steps else None) or {}
    parts = []
    held = [
        f"{name} {kib(live[field])}"
        for field, name in (
            ("footprint_bytes", "footprint"),
            # a record made before held_peak_bytes: its footprint + temp
            ("held_peak_bytes" if "held_peak_bytes" in live else "step_peak_bytes", "step peak"),
        )
        if field in live
    ]
    if held:
        parts.append(", ".join(held))
    native = signature.get("native") or {}
    if native:
        shown = ", ".join(f"{NATIVE_NAMES[f].split(' (')[0]} +{kib(native[f])}" for f in NATIVE_FIELDS if f in native)
        parts.append(f"{shown} per step")
    return parts


def _prefix(label: str) -> str:
    return "" if label == DEFAULT_LABEL else f"{label}/"
