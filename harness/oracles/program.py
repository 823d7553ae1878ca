"""A small program as plain JSON data, and the shape each of its ops produces (no torch here).

    {"mesh": {"shape": [2, 2], "axes": ["a", "b"], "devices": [0, 1, 2, 3]},
     "inputs": [{"shape": [5, 4], "seed": 1, "spec": ["a", null]}],
     "ops": [{"op": "softmax", "x": 0, "dim": 1}, {"op": "reduce", "fn": "sum", "x": 1, "dim": 0, "keepdim": false}],
     "outputs": [2]}

Values are numbered: the inputs first, then one per op in order. An input's `spec` is its
partition spec on the mesh (one entry per dim: null, an axis name, or a list of axis names;
`null` for the whole spec leaves it unmarked). Ops that need a tensor of their own (a matmul's
weight, gather's index) carry it as a leaf: {"shape", "seed", "spec"} for floats, {"shape",
"seed", "high"} for int64 indices drawn from [0, high).

A program comes from the generator or from a committed file: `check_program` refuses, naming the
place, anything the interpreter could not run, before a child sees it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from harness.errors import HarnessUsageError

Shape = tuple[int, ...]

UNARY = ("tanh", "neg", "abs", "sigmoid", "relu")  # no sin: see harness.oracles.generate
BINARY = ("add", "sub", "mul", "maximum")
REDUCE = ("sum", "mean", "amax", "amin")
INPLACE = ("add_", "mul_", "zero_")
INPLACE_VIEWS = ("none", "narrow", "select", "transpose")
# Ops whose result shares storage with their operand in eager torch (a view), or is the operand.
VIEW_OPS = ("reshape", "flatten", "transpose", "permute", "slice")
SAME_TENSOR_OPS = ("inplace", "mark")
# The oracle's tolerance, stated in harness.oracles.compare (here so the parent's repro scripts
# state the same numbers without importing torch).
RTOL = 1e-4
ATOL = 1e-4
LIMITS = {"rank": 4, "dim": 64, "ops": 40, "inputs": 8, "elements": 1 << 16}


class ProgramError(HarnessUsageError):
    """A program description the interpreter cannot run; the message names the place and the rule."""


def _fail(where: str, why: str) -> ProgramError:
    return ProgramError(f"oracle program, {where}: {why}")


def _int(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise _fail(where, f"expected a whole number {bound}, got {value!r:.60}")
    return value


def _shape(value: Any, where: str) -> Shape:
    if not isinstance(value, list) or len(value) > LIMITS["rank"]:
        raise _fail(where, f"expected a list of at most {LIMITS['rank']} sizes, got {value!r:.60}")
    shape = tuple(_int(size, f"{where}[{i}]", 1, LIMITS["dim"]) for i, size in enumerate(value))
    if math.prod(shape) > LIMITS["elements"]:
        raise _fail(where, f"{shape} has more than {LIMITS['elements']} elements")
    return shape


def _dim(value: Any, rank: int, where: str) -> int:
    return _int(value, where, 0, rank - 1) if rank else _int(value, where, 0, -1)


def check_mesh(mesh: Any) -> dict[str, Any]:
    if not isinstance(mesh, dict):
        raise _fail("mesh", "expected an object with shape, axes and devices")
    shape = _shape(mesh.get("shape"), "mesh.shape")
    axes = mesh.get("axes")
    if not isinstance(axes, list) or len(axes) != len(shape) or len(set(map(str, axes))) != len(axes):
        raise _fail("mesh.axes", f"expected {len(shape)} distinct axis names, got {axes!r:.60}")
    if not all(isinstance(axis, str) and axis.isidentifier() for axis in axes):
        raise _fail("mesh.axes", f"axis names must be identifiers, got {axes!r:.60}")
    if mesh.get("spec_by", "name") not in ("name", "index"):
        raise _fail(
            "mesh.spec_by", f"expected 'name' or 'index' (how specs reach mark_sharding), got {mesh['spec_by']!r:.40}"
        )
    devices = mesh.get("devices")
    if not isinstance(devices, list) or sorted(devices) != list(range(math.prod(shape))):
        raise _fail("mesh.devices", f"expected a permutation of 0..{math.prod(shape) - 1}, got {devices!r:.80}")
    return mesh


def spec_axes(spec: Any) -> list[str]:
    """The mesh axis names a partition spec uses, in order (an entry: null, a name or a list)."""
    return [name for entry in spec or [] for name in (entry if isinstance(entry, list) else [entry]) if name]


def axes_that_split(mesh: dict[str, Any], spec: Any) -> list[str]:
    """The axes a spec uses that are longer than 1: a spec over unit axes only cuts nothing."""
    sizes = dict(zip(mesh["axes"], mesh["shape"]))
    return [name for name in spec_axes(spec) if sizes.get(name, 1) > 1]


def spec_places(program: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of a program that holds a partition spec under "spec": its inputs, an op's
    weight or source, a mark op."""
    places = list(program["inputs"])
    for op in program["ops"]:
        places += [op[key] for key in ("w", "src") if isinstance(op.get(key), dict) and "spec" in op[key]]
        if op["op"] == "mark":
            places.append(op)
    return places


def check_spec(spec: Any, rank: int, axes: Sequence[str], where: str) -> None:
    """A partition spec: one entry per dim, each mesh axis used at most once."""
    if spec is None:
        return
    if not isinstance(spec, list) or len(spec) != rank:
        raise _fail(
            where, f"expected a list of {rank} entries (null, an axis name or a list of names), got {spec!r:.60}"
        )
    used: list[str] = []
    for name in spec_axes(spec):
        if name not in axes or name in used:
            raise _fail(where, f"{name!r:.30} is not a mesh axis ({', '.join(axes)}) or is used twice")
        used.append(name)


def check_leaf(leaf: Any, where: str, axes: Sequence[str], index: bool = False) -> Shape:
    if not isinstance(leaf, dict):
        raise _fail(where, "expected an object with shape and seed")
    shape = _shape(leaf.get("shape"), f"{where}.shape")
    _int(leaf.get("seed"), f"{where}.seed", 0, 2**31)
    if index:
        _int(leaf.get("high"), f"{where}.high", 1, LIMITS["dim"])
    else:
        check_spec(leaf.get("spec"), len(shape), axes, f"{where}.spec")
    return shape


def check_program(program: Any) -> list[Shape]:
    """The shape of every value of a valid program; ProgramError naming the place otherwise."""
    if not isinstance(program, dict):
        raise _fail("top level", "expected an object with mesh, inputs, ops and outputs")
    axes = check_mesh(program.get("mesh"))["axes"]
    inputs, ops = program.get("inputs"), program.get("ops")
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= LIMITS["inputs"]:
        raise _fail("inputs", f"expected a list of 1..{LIMITS['inputs']} leaves")
    if not isinstance(ops, list) or len(ops) > LIMITS["ops"]:
        raise _fail("ops", f"expected a list of at most {LIMITS['ops']} ops")
    shapes = [check_leaf(leaf, f"inputs[{i}]", axes) for i, leaf in enumerate(inputs)]
    for i, op in enumerate(ops):
        where = f"ops[{i}]"
        if not isinstance(op, dict) or op.get("op") not in SHAPE_RULES:
            raise _fail(where, f"expected an object whose op is one of {', '.join(SHAPE_RULES)}")
        shapes.append(SHAPE_RULES[op["op"]](op, _Operands(shapes, axes, where)))
    outputs = program.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        raise _fail("outputs", "expected a non-empty list of value numbers")
    for j, slot in enumerate(outputs):
        _int(slot, f"outputs[{j}]", 0, len(shapes) - 1)
    return shapes


class _Operands:
    """What a shape rule needs: the shapes so far, the mesh axes, the op's place for errors."""

    def __init__(self, shapes: list[Shape], axes: Sequence[str], where: str) -> None:
        self.shapes, self.axes, self.where = shapes, axes, where

    def value(self, op: dict[str, Any], key: str) -> Shape:
        return self.shapes[_int(op.get(key), f"{self.where}.{key}", 0, len(self.shapes) - 1)]

    def positions(self, op: dict[str, Any], key: str, size: int) -> list[int]:
        """A list of 1..LIMITS["dim"] positions along a dim of `size`, each in range on purpose:
        torch raises for an out-of-range index, XLA clamps it (both legitimate)."""
        index = op.get(key)
        if not isinstance(index, list) or not 1 <= len(index) <= LIMITS["dim"]:
            raise self.fail(f"{key} must be a list of 1..{LIMITS['dim']} positions")
        return [_int(position, f"{self.where}.{key}[{i}]", 0, size - 1) for i, position in enumerate(index)]

    def dim(self, op: dict[str, Any], key: str, rank: int) -> int:
        return _dim(op.get(key), rank, f"{self.where}.{key}")

    def int(self, op: dict[str, Any], key: str, low: int = 0, high: int | None = None) -> int:
        return _int(op.get(key), f"{self.where}.{key}", low, high)

    def choice(self, op: dict[str, Any], key: str, choices: Sequence[str]) -> str:
        if op.get(key) not in choices:
            raise self.fail(f"{key} must be one of {', '.join(choices)}, got {op.get(key)!r:.40}")
        return str(op[key])

    def number(self, op: dict[str, Any], key: str) -> float:
        value = op.get(key)
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or abs(value) > 64
        ):
            raise self.fail(f"{key} must be a finite number within +-64, got {value!r:.40}")
        return float(value)

    def leaf(self, op: dict[str, Any], key: str, index: bool = False) -> Shape:
        return check_leaf(op.get(key), f"{self.where}.{key}", self.axes, index)

    def fail(self, why: str) -> ProgramError:
        return _fail(self.where, why)


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """numpy broadcasting of two shapes, or None where they do not broadcast."""
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b), strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _elementwise(op: dict[str, Any], o: _Operands) -> Shape:
    if op["op"] == "unary":
        o.choice(op, "fn", UNARY)
        return o.value(op, "x")
    if op["op"] == "scalar":
        o.choice(op, "fn", ("add", "mul"))
        o.number(op, "c")
        return o.value(op, "x")
    if op["op"] == "binary":
        o.choice(op, "fn", BINARY)
    shape = broadcast(o.value(op, "x"), o.value(op, "y"))
    if shape is None:
        raise o.fail(f"shapes {o.value(op, 'x')} and {o.value(op, 'y')} do not broadcast")
    return shape


def _matmul(op: dict[str, Any], o: _Operands) -> Shape:
    x, w = o.value(op, "x"), o.leaf(op, "w")
    if len(x) < 1 or len(w) != 2 or x[-1] != w[0]:
        raise o.fail(f"x {x} @ w {w}: w must be 2-d with as many rows as x's last dim")
    return x[:-1] + w[1:]


def _einsum(op: dict[str, Any], o: _Operands) -> Shape:
    """x contracted along one dim with a 2-d weight: 'abc,bz->acz' for dim 1."""
    x, w = o.value(op, "x"), o.leaf(op, "w")
    dim = o.dim(op, "dim", len(x))
    if len(w) != 2 or w[0] != x[dim]:
        raise o.fail(f"w {w} must be 2-d with {x[dim]} rows (x's dim {dim})")
    return x[:dim] + x[dim + 1 :] + w[1:]


def _reduce(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    o.choice(op, "fn", REDUCE)
    dim = o.dim(op, "dim", len(x))
    if not isinstance(op.get("keepdim"), bool):
        raise o.fail("keepdim must be true or false")
    return x[:dim] + ((1,) if op["keepdim"] else ()) + x[dim + 1 :]


def _along_dim(op: dict[str, Any], o: _Operands) -> Shape:  # softmax, log_softmax, cumsum, flip
    x = o.value(op, "x")
    o.dim(op, "dim", len(x))
    return x


def _roll(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    o.dim(op, "dim", len(x))
    o.int(op, "shift", -LIMITS["dim"], LIMITS["dim"])
    return x


def _layer_norm(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    if not x:
        raise o.fail("layer_norm needs a tensor of rank 1 or more")
    return x


def _reshape(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    o.choice(op, "method", ("reshape", "view"))
    shape = _shape(op.get("shape"), f"{o.where}.shape")
    if math.prod(shape) != math.prod(x):
        raise o.fail(f"cannot reshape {x} to {shape}")
    return shape


def _flatten(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    start = o.dim(op, "start", len(x))
    end = o.int(op, "end", start, len(x) - 1)
    return x[:start] + (math.prod(x[start : end + 1]),) + x[end + 1 :]


def _transpose(op: dict[str, Any], o: _Operands) -> Shape:
    x = list(o.value(op, "x"))
    d0, d1 = o.dim(op, "d0", len(x)), o.dim(op, "d1", len(x))
    x[d0], x[d1] = x[d1], x[d0]
    return tuple(x)


def _permute(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    dims = op.get("dims")
    if not isinstance(dims, list) or sorted(dims) != list(range(len(x))):
        raise o.fail(f"dims must be a permutation of 0..{len(x) - 1}")
    return tuple(x[d] for d in dims)


def _join(op: dict[str, Any], o: _Operands) -> Shape:  # cat, stack
    x, y = o.value(op, "x"), o.value(op, "y")
    rank = len(x) + (1 if op["op"] == "stack" else 0)
    dim = o.dim(op, "dim", rank)
    if op["op"] == "stack":
        if x != y:
            raise o.fail(f"stack needs equal shapes, got {x} and {y}")
        return x[:dim] + (2,) + x[dim:]
    if len(x) != len(y) or any(a != b for i, (a, b) in enumerate(zip(x, y, strict=True)) if i != dim):
        raise o.fail(f"cat along {dim} needs shapes equal but there, got {x} and {y}")
    return x[:dim] + (x[dim] + y[dim],) + x[dim + 1 :]


def _pad(op: dict[str, Any], o: _Operands) -> Shape:
    """F.pad: pairs (before, after) from the last dim backwards, non-negative (a crop is a slice)."""
    x, pad = list(o.value(op, "x")), op.get("pad")
    if not isinstance(pad, list) or not pad or len(pad) % 2 or len(pad) > 2 * len(x):
        raise o.fail(f"pad must be an even-length list of at most {2 * len(x)} sizes")
    for i, size in enumerate(pad):
        x[len(x) - 1 - i // 2] += _int(size, f"{o.where}.pad[{i}]", 0, 8)
    o.number(op, "c")
    return tuple(x)


def _slice(op: dict[str, Any], o: _Operands) -> Shape:
    x = list(o.value(op, "x"))
    dim = o.dim(op, "dim", len(x))
    start = o.int(op, "start", 0, x[dim] - 1)
    stop = o.int(op, "stop", start + 1, x[dim])
    step = o.int(op, "step", 1, LIMITS["dim"])
    x[dim] = len(range(start, stop, step))
    return tuple(x)


def _index_select(op: dict[str, Any], o: _Operands) -> Shape:
    x = list(o.value(op, "x"))
    dim = o.dim(op, "dim", len(x))
    x[dim] = len(o.positions(op, "index", x[dim]))
    return tuple(x)


def _gather(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    dim = o.dim(op, "dim", len(x))
    index = o.leaf(op, "index", index=True)
    if len(index) != len(x) or any(i > s for d, (i, s) in enumerate(zip(index, x, strict=True)) if d != dim):
        raise o.fail(f"index {index} must have x's rank and fit in x {x} but along dim {dim}")
    if op["index"]["high"] != x[dim]:
        raise o.fail(f"index.high must be x's size along dim {dim}, {x[dim]}: every index in range")
    if op["op"] == "scatter_add":
        if o.leaf(op, "src") != index:
            raise o.fail("src must have the index's shape")
        return x
    return index


def _embedding(op: dict[str, Any], o: _Operands) -> Shape:
    w, index = o.value(op, "w"), o.leaf(op, "index", index=True)
    if len(w) != 2 or op["index"]["high"] != w[0]:
        raise o.fail(f"the table {w} must be 2-d and index.high its row count")
    return index + (w[1],)


def _sort(op: dict[str, Any], o: _Operands) -> Shape:
    """sort's or topk's values (never the indices: ties may be broken either way)."""
    x = list(o.value(op, "x"))
    if not x:
        raise o.fail(f"{op['op']} needs a tensor of rank 1 or more")
    dim = o.dim(op, "dim", len(x))
    if not isinstance(op.get("descending"), bool):
        raise o.fail("descending must be true or false")
    if op["op"] == "topk":
        x[dim] = o.int(op, "k", 1, x[dim])
    return tuple(x)


def _index_put(op: dict[str, Any], o: _Operands) -> Shape:
    """Out of place: x with the rows `index` along `dim` set to (or, accumulating, added) src's."""
    x = o.value(op, "x")
    dim = o.dim(op, "dim", len(x))
    index = o.positions(op, "index", x[dim])
    if not isinstance(op.get("accumulate"), bool):
        raise o.fail("accumulate must be true or false")
    # Without accumulate, which of two writes to one row wins is unspecified (both sides legitimately).
    if not op["accumulate"] and len(set(index)) != len(index):
        raise o.fail("index repeats a position; without accumulate the positions must be distinct")
    if o.leaf(op, "src") != x[:dim] + (len(index),) + x[dim + 1 :]:
        raise o.fail(f"src must have x's shape {x} with dim {dim} of size {len(index)}")
    return x


def _conv(op: dict[str, Any], o: _Operands) -> Shape:
    """conv1d on (N, C, L), conv2d on (N, C, H, W): w is (out channels, C, kernel...)."""
    x, w = o.value(op, "x"), o.leaf(op, "w")
    if len(x) not in (3, 4) or len(w) != len(x) or w[1] != x[1]:
        raise o.fail(f"x {x} must be (N, C, L) or (N, C, H, W) and w {w} (out, C, kernel...) of its rank")
    padding, stride = o.int(op, "padding", 0, 2), o.int(op, "stride", 1, 2)
    spatial = tuple((size + 2 * padding - k) // stride + 1 for size, k in zip(x[2:], w[2:], strict=True))
    if min(spatial) < 1:
        raise o.fail(f"kernel {w[2:]} is larger than the padded input {x[2:]} (padding {padding})")
    return (x[0], w[0], *spatial)


def _where(op: dict[str, Any], o: _Operands) -> Shape:
    return _elementwise(op, o)


def _inplace(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    o.choice(op, "fn", INPLACE)
    o.number(op, "c")
    view = o.choice(op, "view", INPLACE_VIEWS)
    if view == "narrow":
        dim = o.dim(op, "dim", len(x))
        start = o.int(op, "start", 0, x[dim] - 1)
        o.int(op, "length", 1, x[dim] - start)
    elif view == "select":
        dim = o.dim(op, "dim", len(x))
        o.int(op, "index", 0, x[dim] - 1)
    elif view == "transpose":
        o.dim(op, "d0", len(x))
        o.dim(op, "d1", len(x))
    return x


def _mark(op: dict[str, Any], o: _Operands) -> Shape:
    x = o.value(op, "x")
    check_spec(op.get("spec"), len(x), o.axes, f"{o.where}.spec")
    if op.get("spec") is None:
        raise o.fail("mark needs a spec")
    return x


SHAPE_RULES: dict[str, Callable[[dict[str, Any], _Operands], Shape]] = {
    "unary": _elementwise,
    "scalar": _elementwise,
    "binary": _elementwise,
    "where": _where,
    "matmul": _matmul,
    "einsum": _einsum,
    "reduce": _reduce,
    "softmax": _along_dim,
    "log_softmax": _along_dim,
    "cumsum": _along_dim,
    "flip": _along_dim,
    "roll": _roll,
    "layer_norm": _layer_norm,
    "reshape": _reshape,
    "flatten": _flatten,
    "transpose": _transpose,
    "permute": _permute,
    "cat": _join,
    "stack": _join,
    "pad": _pad,
    "slice": _slice,
    "index_select": _index_select,
    "gather": _gather,
    "scatter_add": _gather,
    "embedding": _embedding,
    "index_put": _index_put,
    "sort": _sort,
    "topk": _sort,
    "conv": _conv,
    "inplace": _inplace,
    "mark": _mark,
}
