"""Read shardings out of HLO text by role, never by SSA name.

The text comes from `torch_xla._XLAC._get_xla_tensors_hlo([...])`, from an XLA dump
(`*before_optimizations.txt`, `*after_optimizations.txt`) or from `XLA_SAVE_TENSORS_FILE` with
`XLA_SAVE_TENSORS_FMT=hlo`. Instruction names such as `%custom-call.6` change with every graph,
so cases ask by role instead:

* `parameter_shardings`: entry-computation parameters by their `parameter(N)` number;
* `sharding_custom_calls`: every `custom_call_target="Sharding"` instruction, annotated or not
  (an unannotated one is bug 2a; `assert_every_sharding_call_annotated` is its detector);
* `output_sharding`: the ROOT of the entry computation;
* `count_collectives`: how many all-reduce / all-gather / ... instructions there are;
* `donated_parameters`: the parameters a module gives up to its outputs (its header's
  `input_output_alias` and `buffer_donor`), the one reader of them: the step's held peak
  (harness.costs) and the donation-lost diagnosis (harness.findings) both count what it returns.

The reader is line based (XLA prints one instruction per line) and tolerant: it understands
enough of an instruction (name, shape, opcode, operands, top-level attributes) to find these
roles, and scans brackets and quoted strings so that `sharding={...}` with nested braces,
tuple shapes and `metadata={op_name="..."}` do not confuse it. Lines it does not understand are
skipped. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.sharding import NoSharding, Sharding, TupleSharding, parse_sharding

__all__ = [
    "COLLECTIVE_OPCODES",
    "HloComputation",
    "HloInstruction",
    "HloModule",
    "HloParseError",
    "assert_every_sharding_call_annotated",
    "count_collectives",
    "donated_parameters",
    "entry_parameter_count",
    "entry_parameters",
    "instructions_naming",
    "output_sharding",
    "parameter_shardings",
    "parse_hlo",
    "root_instruction",
    "sharding_custom_calls",
    "split_hlo_modules",
    "stablehlo_shardings",
]

# Collective opcodes counted by `count_collectives`. Async pairs (`all-gather-start` /
# `all-gather-done`) count once, under the base name.
COLLECTIVE_OPCODES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)

_BRACKET_PAIRS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = set(_BRACKET_PAIRS.values())
_STRUCTURE = re.compile(r'[()\[\]{},"]')  # what _unquoted_chars stops at
_QUOTE_OR_ESCAPE = re.compile(r'\\.|"', re.DOTALL)  # inside a quoted string

# `[ROOT ]%name = ...`; newer XLA may print names without the '%'.
_INSTRUCTION_START = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[^\s=(){}\[\],]+)\s*=\s*")
_OPCODE = re.compile(r"[A-Za-z][\w.\-]*")
_HLO_MODULE_LINE = re.compile(r"^\s*HloModule\b")


class HloParseError(HarnessError, ValueError):
    """HLO text without the structure a question needs (e.g. no ENTRY computation, or two)."""


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HloInstruction:
    """One instruction line, split into the parts the role queries need."""

    name: str  # without the leading '%'; differs between graphs, so never match on it
    shape: str  # e.g. 'f32[4,32]{1,0}' or '(f32[8,16]{1,0}, s32[])'
    opcode: str  # e.g. 'parameter', 'custom-call', 'all-reduce-start'
    operands: str  # raw text between the opcode's parentheses
    attributes: tuple[tuple[str, str], ...]  # (name, raw value) of each top-level `name=value`
    is_root: bool
    line_number: int  # 1-based, in the text that was parsed
    line: str  # the source line without surrounding whitespace

    def attribute(self, name: str) -> str | None:
        """Raw text of attribute `name`, or None when the instruction has none."""
        for key, value in self.attributes:
            if key == name:
                return value
        return None

    @property
    def has_sharding(self) -> bool:
        return self.attribute("sharding") is not None

    @property
    def sharding(self) -> Sharding:
        """The `sharding=` attribute as a value; `NoSharding()` when there is none."""
        text = self.attribute("sharding")
        if text is None:
            return NoSharding()
        return parse_sharding(text, where=f"line {self.line_number} of the HLO")

    @property
    def custom_call_target(self) -> str | None:
        target = self.attribute("custom_call_target")
        return None if target is None else _unquote(target)

    @property
    def parameter_number(self) -> int | None:
        if self.opcode != "parameter":
            return None
        return int(self.operands.strip())

    @property
    def operand_names(self) -> tuple[str, ...]:
        """Names of the operands (the last word of each operand, '%' removed)."""
        names = []
        for operand in _split_top_level(self.operands):
            words = operand.split()
            if words:
                names.append(words[-1].lstrip("%"))
        return tuple(names)


@dataclass(frozen=True)
class HloComputation:
    name: str
    is_entry: bool
    instructions: tuple[HloInstruction, ...]

    @property
    def root(self) -> HloInstruction | None:
        """The ROOT instruction; XLA's rule when none is marked is "the last one"."""
        for instruction in self.instructions:
            if instruction.is_root:
                return instruction
        return self.instructions[-1] if self.instructions else None

    def find(self, name: str) -> HloInstruction | None:
        """The instruction called `name` (used to follow operands, not to pick instructions)."""
        for instruction in self.instructions:
            if instruction.name == name:
                return instruction
        return None


@dataclass(frozen=True)
class HloModule:
    name: str
    computations: tuple[HloComputation, ...]

    @property
    def entry(self) -> HloComputation:
        entries = [c for c in self.computations if c.is_entry]
        if len(entries) != 1:
            found = ", ".join(c.name for c in entries) or "none"
            raise HloParseError(
                f"expected exactly one ENTRY computation, found {len(entries)} ({found}); "
                "text holding several modules must be split with split_hlo_modules() first"
            )
        return entries[0]

    @property
    def instructions(self) -> tuple[HloInstruction, ...]:
        """Every instruction of every computation, in text order."""
        return tuple(i for c in self.computations for i in c.instructions)


# --------------------------------------------------------------------------------------------
# Reading the text
# --------------------------------------------------------------------------------------------


def parse_hlo(text: str) -> HloModule:
    """Split HLO text into computations and instructions.

    Instruction lines outside any computation (a fragment pasted into a test) form one implicit
    entry computation, so the role queries also work on excerpts.
    """
    module_name = ""
    computations: list[HloComputation] = []
    current: _OpenComputation | None = None
    loose: list[HloInstruction] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        stripped = raw_line.strip()
        if _HLO_MODULE_LINE.match(raw_line):
            module_name = module_name or _module_name(stripped)
            continue
        instruction = _parse_instruction(raw_line, number)
        if instruction is not None:
            (current.instructions if current else loose).append(instruction)
        elif stripped.endswith("{"):
            current = _OpenComputation(_computation_name(stripped), stripped.startswith("ENTRY"), [])
        elif stripped == "}" and current is not None:
            computations.append(current.close())
            current = None
    if current is not None:  # text cut off before the closing brace: keep what was read
        computations.append(current.close())
    if loose:
        has_entry = any(c.is_entry for c in computations)
        computations.append(HloComputation("", not has_entry, tuple(loose)))
    return HloModule(module_name, tuple(computations))


def instructions_naming(text: str, words: tuple[str, ...]) -> list[HloInstruction]:
    """The instructions on the lines of `text` that hold one of `words` (opcodes, say): those of
    parse_hlo(text).instructions that a reader after a few opcodes needs, without parsing every
    line of a large module (a ViT step's partitioned module: 90 ms whole, a few ms this way)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if any(word in line for word in words) and not _HLO_MODULE_LINE.match(line):
            instruction = _parse_instruction(line, number)
            if instruction is not None:
                found.append(instruction)
    return found


def split_hlo_modules(text: str) -> list[str]:
    """Cut text holding several modules (XLA_SAVE_TENSORS_FILE appends one per graph) at each
    `HloModule` line. Text without such a line comes back as a single piece."""
    pieces: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _HLO_MODULE_LINE.match(line) and any(piece_line.strip() for piece_line in pieces[-1]):
            pieces.append([])
        pieces[-1].append(line)
    return ["".join(p) for p in pieces if any(piece_line.strip() for piece_line in p)]


@dataclass
class _OpenComputation:
    name: str
    is_entry: bool
    instructions: list[HloInstruction]

    def close(self) -> HloComputation:
        return HloComputation(self.name, self.is_entry, tuple(self.instructions))


def _module_name(stripped: str) -> str:
    words = stripped.split(None, 1)
    return words[1].split(",", 1)[0].strip() if len(words) > 1 else ""


def _computation_name(header: str) -> str:
    # 'ENTRY %SyncTensorsGraph.6 (p0.1: f32[16,32]) -> (f32[8,16]) {' -> 'SyncTensorsGraph.6'
    words = header.removeprefix("ENTRY").split()
    return words[0].lstrip("%").split("(", 1)[0] if words else ""


def _parse_instruction(line: str, line_number: int) -> HloInstruction | None:
    """Split `[ROOT ]%name = shape opcode(operands), attr=value, ...`, or None if it is not one."""
    start = _INSTRUCTION_START.match(line)
    if start is None:
        return None
    position = _skip_spaces(line, start.end())
    shape_end = _shape_end(line, position)
    if shape_end is None:
        return None
    shape = line[position:shape_end]
    position = _skip_spaces(line, shape_end)
    opcode = _OPCODE.match(line, position)
    if opcode is None or not line.startswith("(", opcode.end()):
        return None
    operands_end = _matching_close(line, opcode.end())
    if operands_end is None:
        return None
    return HloInstruction(
        name=start.group("name"),
        shape=shape,
        opcode=opcode.group(),
        operands=line[opcode.end() + 1 : operands_end],
        attributes=_parse_attributes(line[operands_end + 1 :]),
        is_root=start.group("root") is not None,
        line_number=line_number,
        line=line.strip(),
    )


def _shape_end(line: str, position: int) -> int | None:
    """End of a shape: a parenthesised tuple shape, or a word with balanced [] and {} parts."""
    if line.startswith("(", position):
        close = _matching_close(line, position)
        return None if close is None else close + 1
    index = position
    while index < len(line) and not line[index].isspace():
        if line[index] in _BRACKET_PAIRS:
            close = _matching_close(line, index)
            if close is None:
                return None
            index = close
        index += 1
    return index if index > position else None


def _parse_attributes(text: str) -> tuple[tuple[str, str], ...]:
    """`, sharding={...}, metadata={...}` -> (("sharding", "{...}"), ("metadata", "{...}"))."""
    attributes = []
    for part in _split_top_level(text):
        name, equals, value = part.partition("=")
        if equals:
            attributes.append((name.strip(), value.strip()))
    return tuple(attributes)


def _unquoted_chars(text: str, start: int = 0):
    """(index, char, bracket depth after char) for every bracket and comma outside quoted strings.

    Only those characters matter to the callers; a regular expression jumps to the next one
    (metadata strings make instruction lines long, and a step module has thousands of lines).
    """
    depth, index = 0, start
    while (found := _STRUCTURE.search(text, index)) is not None:
        index = found.start()
        char = found.group()
        if char == '"':
            index = _quoted_end(text, index) + 1
            continue
        depth += 1 if char in _BRACKET_PAIRS else -1 if char in _CLOSERS else 0
        yield index, char, depth
        index += 1


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are outside brackets and quoted strings."""
    parts, start = [], 0
    for index, char, depth in _unquoted_chars(text):
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _matching_close(text: str, open_index: int) -> int | None:
    """Index of the bracket closing the one at `open_index`, skipping quoted strings."""
    for index, char, depth in _unquoted_chars(text, open_index):
        if char in _CLOSERS and depth == 0:
            return index
    return None


def _quoted_end(text: str, open_quote: int) -> int:
    """Index of the '"' closing the string that opens at `open_quote` (or the last index)."""
    index = open_quote + 1
    while (found := _QUOTE_OR_ESCAPE.search(text, index)) is not None:
        if found.group() == '"':
            return found.start()
        index = found.end()
    return len(text) - 1


def _skip_spaces(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _module(hlo: str | HloModule) -> HloModule:
    return hlo if isinstance(hlo, HloModule) else parse_hlo(hlo)


# --------------------------------------------------------------------------------------------
# Questions by role
# --------------------------------------------------------------------------------------------


def entry_parameters(hlo: str | HloModule) -> list[HloInstruction]:
    """The entry computation's `parameter(N)` instructions, ordered by N."""
    parameters = [i for i in _module(hlo).entry.instructions if i.opcode == "parameter"]
    return sorted(parameters, key=lambda i: i.parameter_number or 0)


def parameter_shardings(hlo: str | HloModule) -> dict[int, Sharding]:
    """{parameter number: sharding} for the entry computation; `NoSharding()` when unannotated."""
    return {p.parameter_number: p.sharding for p in entry_parameters(hlo)}  # type: ignore[misc]  # not None: all are parameters


def sharding_custom_calls(hlo: str | HloModule) -> list[HloInstruction]:
    """Every `custom_call_target="Sharding"` instruction in any computation, in text order.

    Check `.has_sharding` on each: torch_xla's mark_sharding on a view (bug 2a) emits one without
    a `sharding=` attribute, which XLA then rejects.
    """
    return [i for i in _module(hlo).instructions if i.opcode == "custom-call" and i.custom_call_target == "Sharding"]


def assert_every_sharding_call_annotated(hlo: str | HloModule, min_calls: int = 1) -> None:
    """Raise AssertionError naming each Sharding custom-call that lacks `sharding=`.

    Also fails when fewer than `min_calls` Sharding custom-calls exist, so that a graph in which
    mark_sharding left no trace cannot pass by having nothing to check.
    """
    calls = sharding_custom_calls(hlo)
    if len(calls) < min_calls:
        raise AssertionError(
            f'expected at least {min_calls} custom-call(s) with custom_call_target="Sharding" '
            f"in the HLO, found {len(calls)}"
        )
    missing = [c for c in calls if not c.has_sharding]
    if missing:
        listed = "\n".join(f"  line {c.line_number}: {c.line}" for c in missing)
        raise AssertionError(
            f"Sharding custom-call without a sharding: {len(missing)} of {len(calls)} custom-call(s) "
            f'with custom_call_target="Sharding" have no sharding= attribute (XLA will fail with '
            f"has_sharding()):\n{listed}"
        )


def root_instruction(hlo: str | HloModule) -> HloInstruction:
    """The ROOT instruction of the entry computation."""
    root = _module(hlo).entry.root
    if root is None:
        raise HloParseError("the entry computation has no instructions")
    return root


def output_sharding(hlo: str | HloModule) -> Sharding:
    """The sharding of the entry computation's result.

    The ROOT's own `sharding=` when it has one. torch_xla's pre-execution HLO usually ends in an
    unannotated `ROOT tuple(...)`; then the answer is a TupleSharding of what each tuple operand
    is annotated with (`NoSharding()` is not allowed inside a tuple, so an unannotated operand
    makes the whole answer `NoSharding()`). Any other unannotated ROOT gives `NoSharding()`.
    """
    module = _module(hlo)
    root = root_instruction(module)
    if root.has_sharding or root.opcode != "tuple":
        return root.sharding
    operands = [module.entry.find(name) for name in root.operand_names]
    shardings = [NoSharding() if o is None else o.sharding for o in operands]
    if any(isinstance(s, NoSharding) for s in shardings):
        return NoSharding()
    return TupleSharding(tuple(shardings))


def count_collectives(hlo: str | HloModule) -> dict[str, int]:
    """{collective opcode: how many instructions}, every key of COLLECTIVE_OPCODES present.

    Counts instructions in the text (one inside a loop body counts once), by opcode rather than
    by substring, so `op_name="all-reduce"` in metadata is not counted.
    """
    counts = dict.fromkeys(COLLECTIVE_OPCODES, 0)
    for instruction in _module(hlo).instructions:
        # `-start` counts under the base name; its `-done` partner matches no key.
        base = instruction.opcode.removesuffix("-start")
        if base in counts:
            counts[base] += 1
    return counts


# --------------------------------------------------------------------------------------------
# StableHLO
# --------------------------------------------------------------------------------------------

_MHLO_SHARDING = re.compile(r'mhlo\.sharding\s*=\s*"((?:[^"\\]|\\.)*)"')


def stablehlo_shardings(text: str) -> list[Sharding]:
    """Every `mhlo.sharding = "..."` attribute in StableHLO/MLIR text (`xm.get_stablehlo`), in order.

    An empty string gives `NoSharding()`. Raises ShardingParseError for values that are not HLO
    sharding text (e.g. the serialized-proto form `"\\08\\03..."` older exporters wrote).
    """
    shardings = []
    for match in _MHLO_SHARDING.finditer(text):
        line_number = text.count("\n", 0, match.start()) + 1
        shardings.append(parse_sharding(_unescape_mlir(match.group(1)), where=f"line {line_number} of the StableHLO"))
    return shardings


def _unescape_mlir(value: str) -> str:
    r"""MLIR string escapes: \\ \" \n \t and two hex digits (\22 is '"')."""
    out, index = [], 0
    while index < len(value):
        char = value[index]
        if char != "\\" or index + 1 >= len(value):
            out.append(char)
            index += 1
            continue
        follower = value[index + 1]
        if follower in '\\"':
            out.append(follower)
            index += 2
        elif follower in "nt":
            out.append("\n" if follower == "n" else "\t")
            index += 2
        elif re.fullmatch(r"[0-9A-Fa-f]{2}", value[index + 1 : index + 3]):
            out.append(chr(int(value[index + 1 : index + 3], 16)))
            index += 3
        else:
            out.append(char)
            index += 1
    return "".join(out)


_DONATION_ATTRIBUTES = ("input_output_alias={", "buffer_donor={")
# In either attribute, a parameter is named as `(number, {shape index}`: `{1}: (3, {}, may-alias)`, `(0, {})`.
_DONATED_PARAMETER = re.compile(r"\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")


def shape_index(text: str) -> str:
    """`1, 0` -> `1,0`: a shape index as both XLA's header and its buffer assignment can be matched on."""
    return ",".join(part.strip() for part in text.split(",") if part.strip())


def donated_parameters(hlo: str) -> frozenset[tuple[int, str]]:
    """The (parameter number, shape index) pairs a module gives up to its outputs, from its header's
    `input_output_alias={ {1}: (3, {}, may-alias) }` and `buffer_donor={ (0, {}) }`: the arguments
    whose buffers the step reuses (torch_xla donates parameters and optimizer state; with
    XLA_ENABLE_PARAM_ALIASING=0 the header has neither and every argument stays alive).
    Only the first line is read, so a module's header alone (what a record keeps) answers too."""
    header = hlo[: hlo.find("\n")] if "\n" in hlo else hlo
    if not _HLO_MODULE_LINE.match(header):
        raise HloParseError("its first line is not an 'HloModule' header")
    donated = set()
    for attribute in _DONATION_ATTRIBUTES:
        start = header.find(attribute)
        if start < 0:
            continue
        close = _matching_close(header, start + len(attribute) - 1)
        if close is None:
            raise HloParseError(f"{attribute}...}} is not closed on the module's header line")
        body = header[start + len(attribute) - 1 : close + 1]
        donated |= {(int(n), shape_index(i)) for n, i in _DONATED_PARAMETER.findall(body)}
    return frozenset(donated)


def entry_parameter_count(hlo: str) -> int | None:
    """How many parameters the entry computation takes, from the header's
    `entry_computation_layout={(f32[2]{0}, (f32[], s32[]))->...}` (a tuple parameter counts once);
    None where the header has no such layout (then the count is not known, never guessed)."""
    header = hlo[: hlo.find("\n")] if "\n" in hlo else hlo
    start = header.find("entry_computation_layout={(")
    if start < 0:
        return None
    opening = start + len("entry_computation_layout={")
    close = _matching_close(header, opening)
    if close is None:
        raise HloParseError("entry_computation_layout={(... is not closed on the module's header line")
    return len(_split_top_level(header[opening + 1 : close]))
