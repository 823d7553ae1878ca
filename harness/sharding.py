"""HLO sharding values: parse XLA's sharding text, format it back, compare it.

Regression cases read shardings as text, from two places:

* torch_xla's `torch_xla._XLAC._get_xla_sharding_spec(t)`, which returns `''` (no sharding
  annotation at all), `'{replicated}'`, `'{devices=[4,1]0,1,2,3}'` and so on;
* the `sharding={...}` attribute of HLO instructions (see `harness.hlo`).

Comparing those strings directly is fragile: XLA prints the same tile assignment either as an
explicit device list (`{devices=[4,1]0,1,2,3}`) or in its compact "iota" form
(`{devices=[4,1]<=[4]}`), and it may append `metadata={...}`. This module turns the text into
immutable values so that equal shardings compare equal, and keeps partitioner-specific syntax
inside one module.

Grammar accepted (whitespace is tolerated between tokens)::

    spec     := ''                                   -> NoSharding()
              | '{' '}'                              -> TupleSharding(())
              | '{' single (',' single)* '}'         -> TupleSharding(...)   when single starts with '{'
              | single
    single   := '{' body option* '}'
    body     := 'replicated' | 'manual' | 'unknown' | 'maximal device=' INT
              | 'devices=[' INTS ']' (INTS | '<=[' INTS ']' ('T(' INTS ')')?)
    option   := 'last_tile_dim_replicate' | 'last_tile_dims={' TYPE (',' TYPE)* '}'
              | 'metadata={' ... '}' | 'shard_as' INT | 'shard_like' INT

Metadata and sharding groups (`shard_as`/`shard_like`) are accepted and dropped: they say where a
sharding came from, not how the data is laid out. Shardy's named form (`{mesh[...], [...]}`) is not
HLO sharding syntax and is rejected with a message saying so.

Only the standard library is used, so the parent pytest process can import this without torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from harness.errors import HarnessError

__all__ = [
    "MAX_DEVICES",
    "SUBGROUP_TYPES",
    "Manual",
    "Maximal",
    "NoSharding",
    "Replicated",
    "Sharding",
    "ShardingParseError",
    "Tiled",
    "TupleSharding",
    "Unknown",
    "as_sharding",
    "assert_sharding_equal",
    "assert_tiled_along",
    "canonical_text",
    "format_sharding",
    "iota_device_ids",
    "is_replicated",
    "is_tiled_along",
    "num_shards",
    "parse_sharding",
    "tiled_dims",
]

# Far above any real mesh; stops a typo like `<=[99999999]` from expanding a huge device list.
MAX_DEVICES = 1 << 20

# The kinds a trailing "subgroup" dimension of a tile assignment may have (`last_tile_dims={...}`).
SUBGROUP_TYPES = ("replicated", "manual", "unreduced", "maximal")


class ShardingParseError(HarnessError, ValueError):
    """Sharding text that is not valid HLO sharding syntax.

    `text` is the whole input, `position` the 0-based offset where parsing stopped (None when the
    syntax was fine but the values are inconsistent), `expected` what would have been valid there.
    """

    def __init__(self, text: str, expected: str, position: int | None = None, where: str = "") -> None:
        self.text = text
        self.expected = expected
        self.position = position
        self.where = where
        prefix = f"{where}: " if where else ""
        if position is None:
            message = f"{prefix}invalid HLO sharding {text!r}: {expected}"
        else:
            found = text[position : position + 12] or "end of text"
            message = (
                f"{prefix}invalid HLO sharding {text!r}: expected {expected} at position {position}, found {found!r}"
            )
        super().__init__(message)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoSharding:
    """No sharding annotation at all: torch_xla's spec `''`.

    Kept distinct from `Replicated` on purpose: bug 2b is precisely a parameter whose spec turns
    from `''` into `'{replicated}'`, which makes FSDPv2 skip it.
    """

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class Replicated:
    """`{replicated}`: every device holds the whole tensor."""

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class Manual:
    """`{manual}`: the user partitioned the data by hand; XLA does not know the layout."""

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class Unknown:
    """`{unknown}`: a placeholder newer XLA versions use before sharding propagation decides."""

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class Maximal:
    """`{maximal device=N}`: the whole tensor lives on one device."""

    device: int

    def __post_init__(self) -> None:
        if self.device < 0:
            raise ValueError(f"maximal sharding needs a device id >= 0, got {self.device}")

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class Tiled:
    """`{devices=[...]...}`: the tensor is cut into tiles laid out on a device grid.

    `tile_dims` is the full shape of the tile assignment, including the trailing subgroup
    dimensions; `devices` is that assignment flattened in row-major order (iota forms are
    expanded, so an iota sharding equals its explicit spelling); `subgroup_types` names the kind
    of each trailing subgroup dimension. `last_tile_dim_replicate` is stored as
    `subgroup_types=("replicated",)`, which is also how XLA itself canonicalises it.
    """

    tile_dims: tuple[int, ...]
    devices: tuple[int, ...]
    subgroup_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = _tiled_problem(self.tile_dims, self.devices, self.subgroup_types)
        if problem:
            raise ValueError(problem)

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        """How many pieces each dimension of the tensor itself is cut into."""
        return self.tile_dims[: len(self.tile_dims) - len(self.subgroup_types)]

    @property
    def subgroup_dims(self) -> tuple[int, ...]:
        """Sizes of the trailing subgroup dimensions, aligned with `subgroup_types`."""
        return self.tile_dims[len(self.data_tile_dims) :]

    def __str__(self) -> str:
        return format_sharding(self)


@dataclass(frozen=True)
class TupleSharding:
    """`{{...}, {...}}`: one sharding per element of a tuple-shaped value."""

    elements: tuple[Sharding, ...]

    def __post_init__(self) -> None:
        for element in self.elements:
            if isinstance(element, NoSharding):
                # '' has no spelling inside a tuple; XLA always gives every element a sharding.
                raise ValueError("a tuple sharding element cannot be NoSharding")

    def __str__(self) -> str:
        return format_sharding(self)


Sharding = NoSharding | Replicated | Manual | Unknown | Maximal | Tiled | TupleSharding

_SINGLE_TYPES = (NoSharding, Replicated, Manual, Unknown, Maximal, Tiled)


def _tiled_problem(tile_dims: tuple[int, ...], devices: tuple[int, ...], subgroup_types: tuple[str, ...]) -> str:
    """Why these fields make no valid tiled sharding, or '' when they do."""
    if not tile_dims:
        return "a tiled sharding needs at least one tile dimension"
    if any(d < 1 for d in tile_dims):
        return f"tile dimensions must be >= 1, got {_brackets(tile_dims)}"
    if math.prod(tile_dims) != len(devices):
        return (
            f"tile assignment {_brackets(tile_dims)} has {math.prod(tile_dims)} tiles "
            f"but {len(devices)} device ids were given"
        )
    if any(d < 0 for d in devices):
        return f"device ids must be >= 0, got {_commas(devices)}"
    if len(set(devices)) != len(devices):
        return f"device ids must be distinct, got {_commas(devices)}"
    if len(subgroup_types) > len(tile_dims):
        return f"{len(subgroup_types)} subgroup types for only {len(tile_dims)} tile dimensions"
    unknown = [t for t in subgroup_types if t not in SUBGROUP_TYPES]
    if unknown:
        return f"unknown subgroup type {unknown[0]!r} (known: {', '.join(SUBGROUP_TYPES)})"
    if len(set(subgroup_types)) != len(subgroup_types):
        # XLA merges subgroup dimensions of one kind, so a repeated kind never reaches text.
        return f"subgroup types must be distinct, got {', '.join(subgroup_types)}"
    return ""


def iota_device_ids(reshape_dims: tuple[int, ...], transpose_perm: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The device list an iota tile assignment `<=[reshape_dims]T(transpose_perm)` stands for.

    Meaning: `range(prod(reshape_dims))`, reshaped to `reshape_dims`, transposed by the
    permutation, flattened row-major. Raises ValueError when the permutation is not one.
    """
    perm = tuple(range(len(reshape_dims))) if transpose_perm is None else tuple(transpose_perm)
    if sorted(perm) != list(range(len(reshape_dims))):
        raise ValueError(
            f"transpose T({_commas(perm)}) is not a permutation of the {len(reshape_dims)} "
            f"dimensions of <={_brackets(reshape_dims)}"
        )
    strides = _row_major_strides(reshape_dims)
    transposed_dims = [reshape_dims[axis] for axis in perm]
    # Walk the transposed array in row-major order; position i of the walk is axis perm[i] of the source.
    return tuple(
        sum(index * strides[perm[i]] for i, index in enumerate(indices))
        for indices in itertools.product(*(range(d) for d in transposed_dims))
    )


def _row_major_strides(dims: tuple[int, ...]) -> list[int]:
    strides = [1] * len(dims)
    for axis in range(len(dims) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * dims[axis + 1]
    return strides


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def format_sharding(value: Sharding) -> str:
    """HLO text for a sharding value, with explicit device lists (what torch_xla prints)."""
    if isinstance(value, NoSharding):
        return ""
    if isinstance(value, TupleSharding):
        return "{" + ", ".join(format_sharding(e) for e in value.elements) + "}"
    return "{" + _format_single_body(value) + "}"


def _format_single_body(value: Sharding) -> str:
    if isinstance(value, Replicated):
        return "replicated"
    if isinstance(value, Manual):
        return "manual"
    if isinstance(value, Unknown):
        return "unknown"
    if isinstance(value, Maximal):
        return f"maximal device={value.device}"
    if isinstance(value, Tiled):
        return f"devices={_brackets(value.tile_dims)}{_commas(value.devices)}{_format_subgroups(value)}"
    raise TypeError(f"not a sharding value: {value!r}")


def _format_subgroups(value: Tiled) -> str:
    if not value.subgroup_types:
        return ""
    if value.subgroup_types == ("replicated",):
        return " last_tile_dim_replicate"
    return " last_tile_dims={" + ", ".join(value.subgroup_types) + "}"


def _brackets(numbers: tuple[int, ...] | list[int]) -> str:
    return "[" + _commas(numbers) + "]"


def _commas(numbers: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(n) for n in numbers)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_sharding(text: str, *, where: str = "") -> Sharding:
    """Parse a torch_xla sharding spec or an HLO `sharding=` value into a sharding value.

    `''` gives `NoSharding()`. A leading `sharding=` is accepted, so an attribute can be passed
    as it appears in HLO. `where` (e.g. "line 7 of the HLO") prefixes error messages.
    Raises ShardingParseError for anything else that is not a valid sharding.
    """
    return _Parser(text, where).parse()


def as_sharding(value: str | Sharding) -> Sharding:
    """Accept either spelling: text is parsed, a sharding value is returned unchanged."""
    if isinstance(value, str):
        return parse_sharding(value)
    if isinstance(value, (*_SINGLE_TYPES, TupleSharding)):
        return value
    raise TypeError(f"expected sharding text or a sharding value, got {type(value).__name__}: {value!r}")


def canonical_text(text: str) -> str:
    """The one spelling of a sharding text, for comparing recorded shardings as text: what the
    sharding baseline keeps, and what hosts and release columns are compared by.

    Sharding text is parsed and formatted again, so an iota form equals its explicit device list
    and metadata, sharding groups and spaces between tokens fall away; a different device
    assignment stays different. Other text (a DTensor's placements such as `[Shard(dim=0)]`, a
    syntax this parser does not know) is kept, with its runs of white space folded to one space.
    """
    try:
        return format_sharding(parse_sharding(text))
    except ShardingParseError:
        return " ".join(text.split())


class _Parser:
    """Recursive descent over the text; `pos` only moves forward."""

    def __init__(self, text: str, where: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"sharding text must be a str, got {type(text).__name__}: {text!r}")
        self.text = text
        self.where = where
        self.pos = 0

    # -- entry point ------------------------------------------------------------------------

    def parse(self) -> Sharding:
        self._skip_space()
        self._accept("sharding=")
        self._skip_space()
        if self._at_end():
            return NoSharding()
        value = self._parse_sharding()
        self._skip_space()
        if not self._at_end():
            self._fail("end of text after the closing '}'")
        return value

    def _parse_sharding(self) -> Sharding:
        start = self.pos
        self._expect("{", "'{' opening the sharding")
        self._skip_space()
        if self._peek() in ("{", "}"):
            return self._parse_tuple_rest()
        self.pos = start
        return self._parse_single()

    def _parse_tuple_rest(self) -> TupleSharding:
        """After the tuple's '{': elements separated by ',', then '}'."""
        elements: list[Sharding] = []
        if self._accept("}"):
            return TupleSharding(())
        while True:
            self._skip_space()
            if self._peek() != "{":
                self._fail("'{' opening a tuple element")
            elements.append(self._parse_sharding())
            self._skip_space()
            if self._accept("}"):
                return TupleSharding(tuple(elements))
            self._expect(",", "',' or '}' after a tuple element")

    # -- one non-tuple sharding ---------------------------------------------------------------

    def _parse_single(self) -> Sharding:
        self._expect("{", "'{'")
        self._skip_space()
        value = self._parse_body()
        subgroup_types = self._parse_options(allow_subgroups=isinstance(value, Tiled))
        if subgroup_types and isinstance(value, Tiled):  # only a tiled body is allowed them
            value = self._build_tiled(value.tile_dims, value.devices, subgroup_types)
        return value

    def _parse_body(self) -> Sharding:
        for keyword, kind in (("replicated", Replicated), ("manual", Manual), ("unknown", Unknown)):
            if self._accept_word(keyword):
                return kind()
        if self._accept_word("maximal"):
            self._skip_space()
            self._expect("device=", "'device=' after 'maximal'")
            return Maximal(self._parse_int())
        if self._accept("devices="):
            return self._parse_tiled_body()
        if self._accept_word("mesh"):
            self._fail_semantic("named (Shardy) shardings such as {mesh[...], [...]} are not HLO sharding syntax")
        self._fail(
            "one of 'replicated', 'manual', 'unknown', 'maximal device=N', 'devices=[...]' or a tuple '{{...}, ...}'"
        )
        raise AssertionError("unreachable")

    def _parse_tiled_body(self) -> Tiled:
        tile_dims = self._parse_int_list("[", "]", "'[' opening the tile assignment dimensions")
        self._skip_space()
        if self._accept("<="):
            devices = self._parse_iota(tile_dims)
        else:
            devices = self._parse_device_list()
        return self._build_tiled(tile_dims, devices, ())

    def _parse_iota(self, tile_dims: tuple[int, ...]) -> tuple[int, ...]:
        reshape_dims = self._parse_int_list("[", "]", "'[' opening the iota reshape dimensions after '<='")
        if math.prod(tile_dims) > MAX_DEVICES:
            self._fail_semantic(
                f"tile assignment {_brackets(tile_dims)} has more devices than the limit of {MAX_DEVICES}"
            )
        perm = None
        self._skip_space()
        if self._accept("T"):
            perm = self._parse_int_list("(", ")", "'(' opening the transpose permutation after 'T'")
        if math.prod(reshape_dims) != math.prod(tile_dims):
            self._fail_semantic(
                f"iota <={_brackets(reshape_dims)} has {math.prod(reshape_dims)} devices but tile "
                f"assignment {_brackets(tile_dims)} needs {math.prod(tile_dims)}"
            )
        try:
            return iota_device_ids(reshape_dims, perm)
        except ValueError as error:
            self._fail_semantic(str(error))
            raise AssertionError("unreachable") from error

    def _parse_device_list(self) -> tuple[int, ...]:
        devices = [self._parse_int("a device id or '<=' (iota form) after the tile dimensions")]
        while self._accept_after_space(","):
            self._skip_space()
            devices.append(self._parse_int())
        return tuple(devices)

    def _parse_options(self, allow_subgroups: bool) -> tuple[str, ...]:
        """Trailing options up to and including the closing '}'; returns the subgroup types."""
        subgroup_types: tuple[str, ...] = ()
        while True:
            self._skip_space()
            if self._accept("}"):
                return subgroup_types
            if allow_subgroups and not subgroup_types and self._accept_word("last_tile_dim_replicate"):
                subgroup_types = ("replicated",)
            elif allow_subgroups and not subgroup_types and self._accept("last_tile_dims="):
                subgroup_types = self._parse_subgroup_types()
            elif self._accept("metadata="):
                self._skip_balanced_braces()
            elif self._accept_word("shard_as") or self._accept_word("shard_like"):
                self._skip_space()
                self._parse_int()
            else:
                expected = "'last_tile_dim_replicate', 'last_tile_dims={...}', " if allow_subgroups else ""
                self._fail(f"{expected}'metadata={{...}}' or '}}' closing the sharding")

    def _parse_subgroup_types(self) -> tuple[str, ...]:
        self._expect("{", "'{' opening the subgroup types")
        types = []
        while True:
            self._skip_space()
            start = self.pos
            while not self._at_end() and (self.text[self.pos].isalpha() or self.text[self.pos] == "_"):
                self.pos += 1
            word = self.text[start : self.pos]
            if word not in SUBGROUP_TYPES:
                self.pos = start
                self._fail("a subgroup type (" + ", ".join(SUBGROUP_TYPES) + ")")
            types.append(word)
            self._skip_space()
            if self._accept("}"):
                return tuple(types)
            self._expect(",", "',' or '}' in last_tile_dims")

    def _build_tiled(
        self, tile_dims: tuple[int, ...], devices: tuple[int, ...], subgroup_types: tuple[str, ...]
    ) -> Tiled:
        problem = _tiled_problem(tile_dims, devices, subgroup_types)
        if problem:
            self._fail_semantic(problem)
        return Tiled(tile_dims, devices, subgroup_types)

    # -- lexical helpers ------------------------------------------------------------------------

    def _parse_int_list(self, opening: str, closing: str, what: str) -> tuple[int, ...]:
        self._skip_space()
        self._expect(opening, what)
        numbers = [self._parse_int()]
        while self._accept_after_space(","):
            numbers.append(self._parse_int())
        self._skip_space()
        self._expect(closing, f"',' or '{closing}' in the list")
        return tuple(numbers)

    def _parse_int(self, expected: str = "a non-negative integer") -> int:
        self._skip_space()
        start = self.pos
        while not self._at_end() and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            self._fail(expected)
        return int(self.text[start : self.pos])

    def _skip_balanced_braces(self) -> None:
        """Skip a '{...}' block whose quoted strings may themselves contain braces."""
        self._expect("{", "'{' opening metadata")
        depth = 1
        while depth:
            if self._at_end():
                self._fail("'}' closing metadata")
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                self._skip_quoted_rest()
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1

    def _skip_quoted_rest(self) -> None:
        while not self._at_end():
            char = self.text[self.pos]
            self.pos += 2 if char == "\\" else 1
            if char == '"':
                return
        self._fail("'\"' closing a quoted string")

    def _peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def _at_end(self) -> bool:
        return self.pos >= len(self.text)

    def _skip_space(self) -> None:
        while not self._at_end() and self.text[self.pos].isspace():
            self.pos += 1

    def _accept(self, token: str) -> bool:
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def _accept_after_space(self, token: str) -> bool:
        start = self.pos
        self._skip_space()
        if self._accept(token):
            return True
        self.pos = start
        return False

    def _accept_word(self, word: str) -> bool:
        """Like `_accept`, but 'manualx' must not match 'manual'."""
        end = self.pos + len(word)
        if self.text.startswith(word, self.pos) and not (
            end < len(self.text) and (self.text[end].isalnum() or self.text[end] == "_")
        ):
            self.pos = end
            return True
        return False

    def _expect(self, token: str, expected: str) -> None:
        if not self._accept(token):
            self._fail(expected)

    def _fail(self, expected: str) -> None:
        raise ShardingParseError(self.text, expected, self.pos, self.where)

    def _fail_semantic(self, problem: str) -> None:
        raise ShardingParseError(self.text, problem, None, self.where)


# --------------------------------------------------------------------------------------------
# Questions a regression case asks
# --------------------------------------------------------------------------------------------


def is_replicated(value: str | Sharding) -> bool:
    """Does every device hold the whole tensor?

    True for `{replicated}` and for a tiled sharding whose data dimensions are all uncut and whose
    subgroups are all replicated (e.g. `{devices=[1,1,4]0,1,2,3 last_tile_dim_replicate}`).
    False for `''` (no annotation is not the same as replicated; see `NoSharding`), maximal,
    manual and unknown. A tuple is replicated when every element is.
    """
    value = as_sharding(value)
    if isinstance(value, TupleSharding):
        return all(is_replicated(e) for e in value.elements)
    if isinstance(value, Replicated):
        return True
    if isinstance(value, Tiled):
        return all(d == 1 for d in value.data_tile_dims) and all(t == "replicated" for t in value.subgroup_types)
    return False


def tiled_dims(value: str | Sharding) -> dict[int, int]:
    """{tensor dimension: number of pieces} for every dimension cut into more than one piece.

    `{devices=[4,1]...}` -> {0: 4}; `{devices=[2,2]...}` -> {0: 2, 1: 2}; replicated -> {}.
    """
    value = _single(as_sharding(value), "tiled_dims")
    if not isinstance(value, Tiled):
        return {}
    return {dim: pieces for dim, pieces in enumerate(value.data_tile_dims) if pieces > 1}


def is_tiled_along(value: str | Sharding, dim: int, num_devices: int) -> bool:
    """Is tensor dimension `dim` cut into `num_devices` pieces? (Other dimensions are not checked.)

    `dim` may be negative, counted from the tensor's last dimension. A `dim` outside the tensor's
    rank, or a sharding that is not tiled, gives False.
    """
    value = _single(as_sharding(value), "is_tiled_along")
    if not isinstance(value, Tiled):
        return False
    data_dims = value.data_tile_dims
    if not -len(data_dims) <= dim < len(data_dims):
        return False
    return data_dims[dim] == num_devices


def num_shards(value: str | Sharding) -> int:
    """Into how many distinct pieces is the tensor's data cut? 1 for replicated, maximal and ''.

    Raises ValueError for manual and unknown shardings, whose layout XLA does not know.
    """
    value = _single(as_sharding(value), "num_shards")
    if isinstance(value, Tiled):
        return math.prod(value.data_tile_dims)
    if isinstance(value, (Manual, Unknown)):
        raise ValueError(f"{format_sharding(value)} does not say how the data is cut; num_shards has no answer")
    return 1


def _single(value: Sharding, helper: str) -> Sharding:
    if isinstance(value, TupleSharding):
        raise TypeError(
            f"{helper} needs the sharding of one tensor, got the tuple sharding {format_sharding(value)}; "
            "pick one with .elements[i]"
        )
    return value


def assert_sharding_equal(actual: str | Sharding, expected: str | Sharding, context: str = "") -> None:
    """Raise AssertionError, showing both in HLO syntax, unless the shardings are equal.

    Either side may be text or a value; iota and explicit device lists compare equal.
    `context` names what was checked, e.g. "fc.weight".
    """
    __tracebackhide__ = True  # the case's assertion line leads, not this helper's source
    actual_value, expected_value = as_sharding(actual), as_sharding(expected)
    if actual_value != expected_value:
        subject = f" for {context}" if context else ""
        raise AssertionError(
            f"sharding mismatch{subject}\n  expected: {_show(expected_value)}\n  actual:   {_show(actual_value)}"
        )


def assert_tiled_along(actual: str | Sharding, dim: int, num_devices: int, context: str = "") -> None:
    """Raise AssertionError unless tensor dimension `dim` is cut into `num_devices` pieces."""
    __tracebackhide__ = True  # the case's assertion line leads, not this helper's source
    value = as_sharding(actual)
    if not isinstance(value, TupleSharding) and is_tiled_along(value, dim, num_devices):
        return
    subject = f"{context} " if context else "the tensor "
    cut = "" if isinstance(value, TupleSharding) else f" (dimensions cut: {_describe_cuts(value)})"
    raise AssertionError(
        f"expected {subject}to be tiled along dim {dim} over {num_devices} devices, got {_show(value)}{cut}"
    )


def _describe_cuts(value: Sharding) -> str:
    cuts = tiled_dims(value)
    return ", ".join(f"dim {d} in {n}" for d, n in cuts.items()) or "none"


def _show(value: Sharding) -> str:
    # '' would vanish in a message; say what it means instead.
    return format_sharding(value) or "'' (no sharding annotation)"
