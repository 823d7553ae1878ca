"""Hypothesis strategies: meshes, partition specs and small programs (harness.oracles.program).

What the generator never draws, because torch and XLA may legitimately differ there (the oracle
would report a difference that is no bug; the tolerance is never loosened for them instead):

- out-of-range indices (index_select, gather, scatter_add, embedding): eager torch raises, XLA
  clamps a dynamic-slice start; every drawn index is in range, every slice and narrow in bounds.
- NaN and infinity (their ordering in max/sort, their propagation): no log, sqrt, division, exp
  of drawn data; `sin` is left out too (its argument reduction for large inputs differs).
- argmax/argmin, and sort's and topk's indices: ties between equal inputs (frequent with exact
  1/4 steps) may be broken differently. Their values are drawn: ties do not change them.
- index_put without accumulate onto a repeated position: which write wins is unspecified.
- in-place ops on a tensor that has a view, or on a view that XLA may not return as one: eager
  `reshape` copies where XLA aliases. An in-place op (and a mark) only targets a value no other
  live value views (tracked per value: `_Aliases`).
- re-marking a sharded tensor: mark_sharding on intermediates only for values never marked.
- a pad of all zeros (eager may return the input itself).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from harness.oracles import program as prog

AXIS_NAMES = ("x", "y", "z")
SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
CONSTANTS = (0.5, 2.0, -1.0, 0.25)
Draw = Callable[[Any], Any]


def mesh_shapes(devices: int, rank: int) -> list[tuple[int, ...]]:
    """Every ordered factorisation of `devices` into `rank` sizes (1s included: an (n, 1) mesh)."""
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    return [s for s in itertools.product(divisors, repeat=rank) if math.prod(s) == devices]


@st.composite
def meshes(draw: Draw, devices: int) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = draw(st.sampled_from(mesh_shapes(devices, rank)))
    order = draw(st.sampled_from(["identity", "permuted"]))
    ids = list(range(devices)) if order == "identity" else draw(st.permutations(range(devices)))
    return {"shape": list(shape), "axes": list(AXIS_NAMES[:rank]), "devices": list(ids)}


@st.composite
def specs(draw: Draw, shape: tuple[int, ...], mesh: dict[str, Any]) -> list[Any]:
    """Each dim gets no axis, one, or two (several mesh axes on one dim); the rest replicate."""
    unused = list(mesh["axes"])
    spec: list[Any] = []
    for _ in shape:
        count = draw(st.integers(0, min(2, len(unused))))
        names = [unused.pop(draw(st.integers(0, len(unused) - 1))) for _ in range(count)]
        spec.append(None if not names else names[0] if count == 1 else names)
    return spec


@st.composite
def maybe_spec(draw: Draw, shape: tuple[int, ...], mesh: dict[str, Any]) -> list[Any] | None:
    return draw(specs(shape, mesh)) if draw(st.booleans()) else None


@st.composite
def shapes(draw: Draw, min_rank: int = 1) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.sampled_from(SIZES), min_size=min_rank, max_size=3)))


def _related_shape(draw: Draw, first: tuple[int, ...]) -> tuple[int, ...]:
    """A second input: the first's shape, a broadcastable variant of it, or any shape."""
    kind = draw(st.sampled_from(["same", "broadcast", "trailing", "any"]))
    if kind == "same":
        return first
    if kind == "broadcast":
        return tuple(1 if draw(st.booleans()) else size for size in first)
    if kind == "trailing" and first:
        return first[draw(st.integers(0, len(first) - 1)) :]
    return draw(shapes())


class _Aliases:
    """Which values share storage in eager torch: a view op's value views its operand's; an
    in-place op and a mark return their operand itself."""

    def __init__(self, count: int) -> None:
        self.tensor = list(range(count))  # the tensor object each value is
        self.storage = list(range(count))  # the storage it views
        self.marked: set[int] = set()

    def add(self, op: dict[str, Any]) -> None:
        x = op.get("x", -1)
        if op["op"] in prog.SAME_TENSOR_OPS:
            self.tensor.append(self.tensor[x])
            self.storage.append(self.storage[x])
        else:
            fresh = len(self.tensor) + 10**6
            self.tensor.append(fresh)
            self.storage.append(self.storage[x] if op["op"] in prog.VIEW_OPS else fresh)
        if op["op"] == "mark":
            self.marked.add(self.tensor[x])

    def alone(self, slot: int) -> bool:
        """No other value views this value's storage (safe to mutate in place)."""
        return all(
            self.tensor[s] == self.tensor[slot]
            for s in range(len(self.tensor))
            if self.storage[s] == self.storage[slot]
        )


class _State:
    def __init__(self, draw: Draw, mesh: dict[str, Any], shapes: list[tuple[int, ...]], marked: list[int]) -> None:
        self.draw, self.mesh, self.shapes = draw, mesh, shapes
        self.aliases = _Aliases(len(shapes))
        self.aliases.marked.update(marked)

    def dim(self, x: int) -> int:
        return self.draw(st.integers(0, len(self.shapes[x]) - 1))

    def leaf(self, shape: tuple[int, ...]) -> dict[str, Any]:
        seed = self.draw(st.integers(0, 999))
        return {"shape": list(shape), "seed": seed, "spec": self.draw(maybe_spec(shape, self.mesh))}

    def index_leaf(self, shape: tuple[int, ...], high: int) -> dict[str, Any]:
        return {"shape": list(shape), "seed": self.draw(st.integers(0, 999)), "high": high}

    def partner(self, x: int, fits: Callable[[tuple[int, ...]], bool]) -> int:
        """Another value whose shape fits (x itself always does for the callers)."""
        candidates = [s for s, shape in enumerate(self.shapes) if fits(shape)]
        return self.draw(st.sampled_from(candidates)) if x not in candidates or len(candidates) > 1 else x


def _unary(s: _State, x: int) -> dict[str, Any]:
    return {"op": "unary", "fn": s.draw(st.sampled_from(prog.UNARY)), "x": x}


def _scalar(s: _State, x: int) -> dict[str, Any]:
    return {
        "op": "scalar",
        "fn": s.draw(st.sampled_from(["add", "mul"])),
        "x": x,
        "c": s.draw(st.sampled_from(CONSTANTS)),
    }


def _binary(s: _State, x: int) -> dict[str, Any]:
    y = s.partner(x, lambda shape: prog.broadcast(s.shapes[x], shape) is not None)
    kind = s.draw(st.sampled_from(["binary", "where"]))
    op = {"op": kind, "x": x, "y": y}
    return {**op, "fn": s.draw(st.sampled_from(prog.BINARY))} if kind == "binary" else op


def _matmul(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if not shape or len(shape) > 4:
        return None
    n = s.draw(st.sampled_from(SIZES))
    if s.draw(st.booleans()):
        return {"op": "matmul", "x": x, "w": s.leaf((shape[-1], n))}
    dim = s.dim(x)
    return {"op": "einsum", "x": x, "dim": dim, "w": s.leaf((shape[dim], n))}


def _along(s: _State, x: int) -> dict[str, Any] | None:
    if not s.shapes[x]:
        return None
    kind = s.draw(st.sampled_from(["reduce", "softmax", "log_softmax", "cumsum", "flip", "roll", "layer_norm"]))
    op: dict[str, Any] = {"op": kind, "x": x}
    if kind != "layer_norm":
        op["dim"] = s.dim(x)
    if kind == "reduce":
        op.update(fn=s.draw(st.sampled_from(prog.REDUCE)), keepdim=s.draw(st.booleans()))
    if kind == "roll":
        op["shift"] = s.draw(st.integers(-9, 9))
    return op


def _reshape(s: _State, x: int) -> dict[str, Any] | None:
    shape = list(s.shapes[x])
    if not shape:
        return None
    d = s.dim(x)
    kind = s.draw(st.sampled_from(["merge", "split", "flatten"]))
    if kind == "flatten":
        return {"op": "flatten", "x": x, "start": d, "end": s.draw(st.integers(d, len(shape) - 1))}
    if kind == "merge" and d + 1 < len(shape):
        new = shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2 :]
    else:
        factor = s.draw(st.sampled_from([f for f in range(1, shape[d] + 1) if shape[d] % f == 0]))
        new = shape[:d] + [factor, shape[d] // factor] + shape[d + 1 :]
    if len(new) > prog.LIMITS["rank"]:
        return None
    return {"op": "reshape", "method": s.draw(st.sampled_from(["reshape", "view"])), "x": x, "shape": new}


def _move(s: _State, x: int) -> dict[str, Any] | None:
    rank = len(s.shapes[x])
    if rank < 2:
        return None
    if s.draw(st.booleans()):
        return {"op": "transpose", "x": x, "d0": s.dim(x), "d1": s.dim(x)}
    return {"op": "permute", "x": x, "dims": list(s.draw(st.permutations(range(rank))))}


def _join(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if not shape:
        return None
    if s.draw(st.booleans()) and len(shape) < prog.LIMITS["rank"]:
        return {
            "op": "stack",
            "x": x,
            "y": s.partner(x, lambda o: o == shape),
            "dim": s.draw(st.integers(0, len(shape))),
        }
    dim = s.dim(x)
    same_but_dim = lambda o: len(o) == len(shape) and all(a == b for i, (a, b) in enumerate(zip(o, shape)) if i != dim)  # noqa: E731
    return {"op": "cat", "x": x, "y": s.partner(x, same_but_dim), "dim": dim}


def _pad(s: _State, x: int) -> dict[str, Any] | None:
    rank = len(s.shapes[x])
    if not rank:
        return None
    pad = s.draw(st.lists(st.integers(0, 3), min_size=2, max_size=2 * min(rank, 2)).filter(lambda p: len(p) % 2 == 0))
    pad[0] = pad[0] or 1  # never all zeros: see the module doc
    return {"op": "pad", "x": x, "pad": pad, "c": s.draw(st.sampled_from((0.0, *CONSTANTS)))}


def _slice(s: _State, x: int) -> dict[str, Any] | None:
    if not s.shapes[x]:
        return None
    dim = s.dim(x)
    size = s.shapes[x][dim]
    start = s.draw(st.integers(0, size - 1))
    stop = s.draw(st.integers(start + 1, size))
    return {"op": "slice", "x": x, "dim": dim, "start": start, "stop": stop, "step": s.draw(st.integers(1, 3))}


def _index(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if not shape:
        return None
    dim = s.dim(x)
    kind = s.draw(st.sampled_from(["index_select", "gather", "scatter_add", "embedding", "index_put"]))
    if kind == "index_select":
        return {
            "op": kind,
            "x": x,
            "dim": dim,
            "index": s.draw(st.lists(st.integers(0, shape[dim] - 1), min_size=1, max_size=6)),
        }
    if kind == "index_put":
        accumulate = s.draw(st.booleans())
        positions = st.integers(0, shape[dim] - 1)
        index = s.draw(st.lists(positions, min_size=1, max_size=6, unique=not accumulate))
        src = shape[:dim] + (len(index),) + shape[dim + 1 :]
        return {"op": kind, "x": x, "dim": dim, "index": index, "src": s.leaf(src), "accumulate": accumulate}
    if kind == "embedding":
        if len(shape) != 2:
            return None
        index = tuple(s.draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
        return {"op": kind, "w": x, "index": s.index_leaf(index, shape[0])}
    index = tuple(
        s.draw(st.integers(1, 6)) if d == dim else s.draw(st.integers(1, size)) for d, size in enumerate(shape)
    )
    op = {"op": kind, "x": x, "dim": dim, "index": s.index_leaf(index, shape[dim])}
    return {**op, "src": s.leaf(index)} if kind == "scatter_add" else op


def _sort(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if not shape:
        return None
    dim = s.dim(x)
    op = {"op": "sort", "x": x, "dim": dim, "descending": s.draw(st.booleans())}
    if s.draw(st.booleans()):
        op.update(op="topk", k=s.draw(st.integers(1, shape[dim])))
    return op


def _conv(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if len(shape) not in (3, 4):
        return None
    padding = s.draw(st.integers(0, 2))
    kernel = tuple(s.draw(st.integers(1, min(3, size + 2 * padding))) for size in shape[2:])
    w = (s.draw(st.sampled_from(SIZES[:4])), shape[1], *kernel)
    return {"op": "conv", "x": x, "w": s.leaf(w), "padding": padding, "stride": s.draw(st.integers(1, 2))}


def _inplace(s: _State, x: int) -> dict[str, Any] | None:
    shape = s.shapes[x]
    if not s.aliases.alone(x):
        return None  # see the module doc: never mutate a value another value views
    fn = s.draw(st.sampled_from(prog.INPLACE))
    op: dict[str, Any] = {"op": "inplace", "x": x, "fn": fn, "c": s.draw(st.sampled_from(CONSTANTS))}
    view = s.draw(st.sampled_from(prog.INPLACE_VIEWS if shape else ("none",)))
    op["view"] = view
    if view in ("narrow", "select"):
        dim = s.dim(x)
        start = s.draw(st.integers(0, shape[dim] - 1))
        op.update(dim=dim, start=start, length=s.draw(st.integers(1, shape[dim] - start)), index=start)
    elif view == "transpose":
        op.update(d0=s.dim(x), d1=s.dim(x))
    return op


def _mark(s: _State, x: int) -> dict[str, Any] | None:
    if not s.aliases.alone(x) or s.aliases.tensor[x] in s.aliases.marked:
        return None  # see the module doc: never re-mark, never mark a view
    return {"op": "mark", "x": x, "spec": s.draw(specs(s.shapes[x], s.mesh))}


# _along and _index each stand for several ops: drawn more often, so that each of theirs is too.
DRAWERS: tuple[Callable[[_State, int], dict[str, Any] | None], ...] = (
    _unary,
    _scalar,
    _binary,
    _matmul,
    _along,
    _along,
)
DRAWERS += (_along, _reshape, _move, _join, _pad, _slice, _index, _index, _sort, _conv, _inplace, _mark)


def _checked(mesh: dict[str, Any], inputs: list[dict[str, Any]], ops: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return prog.check_program({"mesh": mesh, "inputs": inputs, "ops": ops, "outputs": [0]})


@st.composite
def programs(draw: Draw, devices: int, max_ops: int = 6) -> dict[str, Any]:
    mesh = draw(meshes(devices))
    first = draw(shapes())
    input_shapes = [first] + [_related_shape(draw, first) for _ in range(draw(st.integers(0, 2)))]
    inputs = [
        {"shape": list(shape), "seed": i, "spec": draw(maybe_spec(shape, mesh))} for i, shape in enumerate(input_shapes)
    ]
    state = _State(draw, mesh, list(input_shapes), [i for i, leaf in enumerate(inputs) if leaf["spec"] is not None])
    ops: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, max_ops))):
        x = draw(st.integers(0, len(state.shapes) - 1))
        op = draw(st.sampled_from(DRAWERS))(state, x) or _unary(state, x)
        try:
            state.shapes = _checked(mesh, inputs, [*ops, op])
        except prog.ProgramError:  # only a size past prog.LIMITS (a merge of 9x8 dims, cats of cats)
            op = _unary(state, x)
            state.shapes = _checked(mesh, inputs, [*ops, op])  # still failing: the generator's own bug
        state.aliases.add(op)
        ops.append(op)
    last = len(state.shapes) - 1
    extra = draw(st.lists(st.integers(0, last - 1), max_size=2, unique=True)) if last else []
    return {"mesh": mesh, "inputs": inputs, "ops": ops, "outputs": sorted({last, *extra})}
