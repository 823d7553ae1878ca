"""Child side: run a program (harness.oracles.program) eagerly on the CPU, or on XLA with its
partition specs. The two runs differ only in where tensors live and in `mark_sharding`.

Input data are small multiples of 1/4 (from -2 to 2): sums and products of a few of them are
exact in float32 whatever the order of accumulation, so most mismatches are not rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

UNARY: dict[str, Callable[[Any], Any]] = {
    "tanh": torch.tanh,
    "neg": torch.neg,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
}


def float_leaf(shape: list[int], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, tuple(shape), generator=generator).to(torch.float32) / 4


def index_leaf(shape: list[int], seed: int, high: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, tuple(shape), generator=generator)


class Place:
    """Where a run's tensors live: the CPU (specs ignored) or an XLA device (specs applied)."""

    def __init__(self, mesh_desc: dict[str, Any] | None) -> None:
        self.mesh = None
        self.axes: list[str] = []
        self.by_index = False
        self.device = torch.device("cpu")
        if mesh_desc is not None:
            import numpy as np
            import torch_xla.distributed.spmd as xs

            from harness import xla

            self.device = xla.device()
            self.axes = list(mesh_desc["axes"])
            self.by_index = mesh_desc.get("spec_by") == "index"
            self.mesh = xs.Mesh(np.array(mesh_desc["devices"]), tuple(mesh_desc["shape"]), tuple(mesh_desc["axes"]))

    def leaf(self, tensor: torch.Tensor, spec: list[Any] | None) -> torch.Tensor:
        tensor = tensor.to(self.device)
        self.mark(tensor, spec)
        return tensor

    def mark(self, tensor: torch.Tensor, spec: list[Any] | None) -> None:
        if self.mesh is None or spec is None:
            return
        import torch_xla.distributed.spmd as xs

        xs.mark_sharding(tensor, self.mesh, partition_spec(spec, self.axes if self.by_index else None))


def partition_spec(spec: list[Any], axes: list[str] | None = None) -> tuple[Any, ...]:
    """JSON's lists of axis names become the tuples torch_xla wants (a list spec is refused);
    with `axes`, each name becomes its axis's index (the metamorphic oracle's by-index relation)."""

    def axis(name: Any) -> Any:
        return axes.index(name) if axes is not None and name is not None else name

    return tuple(tuple(map(axis, entry)) if isinstance(entry, list) else axis(entry) for entry in spec)


def run_program(program: dict[str, Any], place: Place) -> list[torch.Tensor]:
    """Every value of the program, in order (inputs first); the caller picks the outputs."""
    values = [place.leaf(float_leaf(leaf["shape"], leaf["seed"]), leaf.get("spec")) for leaf in program["inputs"]]
    for op in program["ops"]:
        values.append(OPS[op["op"]](op, values, place))
    return values


def _float(op: dict[str, Any], key: str, place: Place) -> torch.Tensor:
    leaf = op[key]
    return place.leaf(float_leaf(leaf["shape"], leaf["seed"]), leaf.get("spec"))


def _index(op: dict[str, Any], key: str, place: Place) -> torch.Tensor:
    leaf = op[key]
    return index_leaf(leaf["shape"], leaf["seed"], leaf["high"]).to(place.device)


def _inplace(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    """Mutate x, directly or through a view of it; the op's value is x itself."""
    x = values[op["x"]]
    view = {
        "none": lambda: x,
        "narrow": lambda: x.narrow(op.get("dim", 0), op.get("start", 0), op.get("length", 1)),
        "select": lambda: x.select(op.get("dim", 0), op.get("index", 0)),
        "transpose": lambda: x.transpose(op.get("d0", 0), op.get("d1", 0)),
    }[op["view"]]()
    if op["fn"] == "zero_":
        view.zero_()
    else:
        getattr(view, op["fn"])(op["c"])
    return x


def _mark(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    place.mark(values[op["x"]], op["spec"])
    return values[op["x"]]


def _einsum(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    x = values[op["x"]]
    letters = "abcd"[: x.dim()]
    kept = letters.replace(letters[op["dim"]], "")
    return torch.einsum(f"{letters},{letters[op['dim']]}z->{kept}z", x, _float(op, "w", place))


def _reduce(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    fn = getattr(torch, op["fn"])
    return fn(values[op["x"]], dim=op["dim"], keepdim=op["keepdim"])


def _reshape(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    x = values[op["x"]]
    # .view needs strides eager torch may not have after a transpose; XLA tensors always do.
    # The program asks for a view of a contiguous tensor, so both sides take the same path.
    return x.reshape(op["shape"]) if op["method"] == "reshape" else x.contiguous().view(op["shape"])


def _index_put(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    index = torch.tensor(op["index"], dtype=torch.int64).to(place.device)
    src = _float(op, "src", place).movedim(op["dim"], 0)
    moved = values[op["x"]].movedim(op["dim"], 0)
    return moved.index_put((index,), src, accumulate=op["accumulate"]).movedim(0, op["dim"])


def _conv(op: dict[str, Any], values: list[Any], place: Place) -> torch.Tensor:
    conv = F.conv1d if values[op["x"]].dim() == 3 else F.conv2d
    return conv(values[op["x"]], _float(op, "w", place), stride=op["stride"], padding=op["padding"])


OPS: dict[str, Callable[[dict[str, Any], list[Any], Place], torch.Tensor]] = {
    "unary": lambda op, v, p: UNARY[op["fn"]](v[op["x"]]),
    "scalar": lambda op, v, p: v[op["x"]] + op["c"] if op["fn"] == "add" else v[op["x"]] * op["c"],
    "binary": lambda op, v, p: BINARY[op["fn"]](v[op["x"]], v[op["y"]]),
    "where": lambda op, v, p: torch.where(v[op["x"]] > 0, v[op["x"]], v[op["y"]]),
    "matmul": lambda op, v, p: v[op["x"]] @ _float(op, "w", p),
    "einsum": _einsum,
    "reduce": _reduce,
    "softmax": lambda op, v, p: torch.softmax(v[op["x"]], op["dim"]),
    "log_softmax": lambda op, v, p: torch.log_softmax(v[op["x"]], op["dim"]),
    "cumsum": lambda op, v, p: torch.cumsum(v[op["x"]], op["dim"]),
    "flip": lambda op, v, p: torch.flip(v[op["x"]], [op["dim"]]),
    "roll": lambda op, v, p: torch.roll(v[op["x"]], op["shift"], op["dim"]),
    "layer_norm": lambda op, v, p: F.layer_norm(v[op["x"]], v[op["x"]].shape[-1:]),
    "reshape": _reshape,
    "flatten": lambda op, v, p: v[op["x"]].flatten(op["start"], op["end"]),
    "transpose": lambda op, v, p: v[op["x"]].transpose(op["d0"], op["d1"]),
    "permute": lambda op, v, p: v[op["x"]].permute(op["dims"]),
    "cat": lambda op, v, p: torch.cat([v[op["x"]], v[op["y"]]], op["dim"]),
    "stack": lambda op, v, p: torch.stack([v[op["x"]], v[op["y"]]], op["dim"]),
    "pad": lambda op, v, p: F.pad(v[op["x"]], op["pad"], value=op["c"]),
    "slice": lambda op, v, p: v[op["x"]][(slice(None),) * op["dim"] + (slice(op["start"], op["stop"], op["step"]),)],
    "index_select": lambda op, v, p: torch.index_select(
        v[op["x"]], op["dim"], torch.tensor(op["index"], dtype=torch.int64).to(p.device)
    ),
    "gather": lambda op, v, p: torch.gather(v[op["x"]], op["dim"], _index(op, "index", p)),
    "scatter_add": lambda op, v, p: v[op["x"]].scatter_add(op["dim"], _index(op, "index", p), _float(op, "src", p)),
    "embedding": lambda op, v, p: F.embedding(_index(op, "index", p), v[op["w"]]),
    "index_put": _index_put,
    "sort": lambda op, v, p: torch.sort(v[op["x"]], op["dim"], descending=op["descending"]).values,
    "topk": lambda op, v, p: torch.topk(v[op["x"]], op["k"], op["dim"], largest=op["descending"]).values,
    "conv": _conv,
    "inplace": _inplace,
    "mark": _mark,
}
