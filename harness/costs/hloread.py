"""Reading a partitioned module: collectives by opcode and replica groups, buffer memory, donations
and aliases, entry inputs and a fingerprint, from XLA's HLO text (never by SSA name).
"""

from __future__ import annotations

import collections
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
from harness.sharding import ShardingParseError, format_sharding, iota_device_ids

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

_ARRAY_SHAPE = re.compile(r"(?P<type>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")


class CostReadError(HarnessError, ValueError):
    """HLO text or a signature that cannot be read as one: the message names where and what."""


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


# The step meter's readers use patterns compiled at import only: one that re compiled during a step
# (the first iota replica groups, the first graph inputs read) stays alive in re's cache, and the leak
# judge would count it as an object the step kept.
_IOTA_GROUPS = re.compile(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_LISTED_GROUPS = re.compile(r"\{\s*(\{[\d,\s]*\}\s*,?\s*)*\}")
_ONE_GROUP = re.compile(r"\{([\d,\s]*)\}")
_LAYOUT = re.compile(r"{[^}]*}$")


def replica_groups(text: str | None, devices: int, where: str = "") -> tuple[tuple[int, ...], ...]:
    """`{{0,1},{2,3}}` or the iota form `[2,2]<=[4]` / `[2,2]<=[2,2]T(1,0)` as explicit groups;
    none or `{}` is one group of every device (XLA's meaning)."""
    text = (text or "").strip()
    if text in ("", "{}"):
        return (tuple(range(devices)),)
    iota = _IOTA_GROUPS.fullmatch(text.replace(" ", ""))
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
    if not _LISTED_GROUPS.fullmatch(text):
        raise CostReadError(f"{where}: replica_groups={text} is neither {{{{0,1,...}},...}} nor an iota form")
    return tuple(tuple(int(x) for x in group.split(",") if x.strip()) for group in _ONE_GROUP.findall(text[1:-1]))


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
            f"{_LAYOUT.sub('', p.shape)} {format_sharding(p.sharding) or chr(39) * 2}" for p in entry_parameters(module)
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
