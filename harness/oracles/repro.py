"""A finding as a standalone Python script: plain torch lines a maintainer can run and read.

The script needs only torch and torch_xla (no harness): it builds the same data, runs the program
eagerly on the CPU and sharded on XLA, prints both and fails the way the oracle did.
"""

from __future__ import annotations

from typing import Any

from harness.oracles.program import ATOL, RTOL, check_program

HEADER = '''\
"""{title}

Found by the harness's differential oracle (harness.oracles): the program below, sharded with
mark_sharding on {devices} CPU devices, should compute what it computes eagerly on the CPU.
Run: python this_file.py   (PJRT_DEVICE=CPU, CPU_NUM_DEVICES={devices} are set below)
"""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "{devices}")

import numpy as np
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()


def data(shape, seed):  # exact multiples of 1/4 in [-2, 2]
    return torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(seed)).float() / 4


def index(shape, seed, high):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def program(device, mark):
    def leaf(shape, seed, spec):
        t = data(shape, seed).to(device)
        if spec is not None:
            mark(t, spec)
        return t

'''

FOOTER = """

mesh = xs.Mesh(np.array({devices_list}), {mesh_shape}, {axes})
want = program("cpu", lambda t, spec: None)
got = program(torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device(),
              lambda t, spec: xs.mark_sharding(t, mesh, spec))
torch_xla.sync() if hasattr(torch_xla, "sync") else xm.mark_step()
print("torch_xla", torch_xla.__version__)
ok = True
for w, g in zip(want, got):
    g = g.cpu()
    print("CPU:", w.tolist())
    print("XLA:", g.tolist())
    scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
    ok &= g.shape == w.shape and bool(((g - w).abs() <= {rtol} * w.abs() + {atol} * scale).all())
assert ok, "XLA with mark_sharding differs from eager CPU"
print("agree")
"""


def _spec(spec: list[Any] | None) -> str:
    if spec is None:
        return "None"
    entries = [repr(tuple(e)) if isinstance(e, list) else repr(e) for e in spec]
    return "(" + ", ".join(entries) + ("," if len(entries) == 1 else "") + ")"


def _leaf(leaf: dict[str, Any]) -> str:
    return f"leaf({leaf['shape']}, {leaf['seed']}, {_spec(leaf.get('spec'))})"


def _index(leaf: dict[str, Any]) -> str:
    return f"index({leaf['shape']}, {leaf['seed']}, {leaf['high']}).to(device)"


def _inplace_lines(op: dict[str, Any]) -> list[str]:
    x = f"v{op['x']}"
    view = {
        "none": x,
        "narrow": f"{x}.narrow({op.get('dim')}, {op.get('start')}, {op.get('length')})",
        "select": f"{x}.select({op.get('dim')}, {op.get('index')})",
        "transpose": f"{x}.transpose({op.get('d0')}, {op.get('d1')})",
    }[op["view"]]
    call = "zero_()" if op["fn"] == "zero_" else f"{op['fn']}({op['c']})"
    return [f"{view}.{call}"]


def _expr(op: dict[str, Any]) -> str:
    x, y, kind = f"v{op.get('x')}", f"v{op.get('y')}", op["op"]
    dim = op.get("dim")
    simple = {
        "unary": lambda: f"torch.{op['fn']}({x})",
        "scalar": lambda: f"{x} {'+' if op['fn'] == 'add' else '*'} {op['c']}",
        "binary": lambda: f"torch.{op['fn']}({x}, {y})",
        "where": lambda: f"torch.where({x} > 0, {x}, {y})",
        "matmul": lambda: f"{x} @ {_leaf(op['w'])}",
        "reduce": lambda: f"torch.{op['fn']}({x}, dim={dim}, keepdim={op['keepdim']})",
        "softmax": lambda: f"torch.softmax({x}, {dim})",
        "log_softmax": lambda: f"torch.log_softmax({x}, {dim})",
        "cumsum": lambda: f"torch.cumsum({x}, {dim})",
        "flip": lambda: f"torch.flip({x}, [{dim}])",
        "roll": lambda: f"torch.roll({x}, {op.get('shift')}, {dim})",
        "layer_norm": lambda: f"F.layer_norm({x}, {x}.shape[-1:])",
        "flatten": lambda: f"{x}.flatten({op.get('start')}, {op.get('end')})",
        "transpose": lambda: f"{x}.transpose({op.get('d0')}, {op.get('d1')})",
        "permute": lambda: f"{x}.permute({op.get('dims')})",
        "cat": lambda: f"torch.cat([{x}, {y}], {dim})",
        "stack": lambda: f"torch.stack([{x}, {y}], {dim})",
        "pad": lambda: f"F.pad({x}, {op.get('pad')}, value={op.get('c')})",
        "slice": lambda: f"{x}[{':, ' * (dim or 0)}{op.get('start')}:{op.get('stop')}:{op.get('step')}]",
        "index_select": lambda: f"torch.index_select({x}, {dim}, torch.tensor({op.get('index')}).to(device))",
        "gather": lambda: f"torch.gather({x}, {dim}, {_index(op['index'])})",
        "scatter_add": lambda: f"{x}.scatter_add({dim}, {_index(op['index'])}, {_leaf(op['src'])})",
        "embedding": lambda: f"F.embedding({_index(op['index'])}, v{op.get('w')})",
        "index_put": lambda: (
            f"{x}.movedim({dim}, 0).index_put((torch.tensor({op.get('index')}).to(device),), "
            f"{_leaf(op['src'])}.movedim({dim}, 0), accumulate={op.get('accumulate')}).movedim(0, {dim})"
        ),
        "sort": lambda: f"torch.sort({x}, {dim}, descending={op.get('descending')}).values",
        "topk": lambda: f"torch.topk({x}, {op.get('k')}, {dim}, largest={op.get('descending')}).values",
        "conv": lambda: (  # program_lines adds 1d or 2d, from x's rank
            f"F.conv{op['spatial']}d({x}, {_leaf(op['w'])}, stride={op.get('stride')}, padding={op.get('padding')})"
        ),
    }
    if kind == "reshape":
        return f"{x}.reshape({op['shape']})" if op["method"] == "reshape" else f"{x}.contiguous().view({op['shape']})"
    if kind == "einsum":  # program_lines adds the equation, which needs x's rank
        return f"torch.einsum({op['equation']!r}, {x}, {_leaf(op['w'])})"
    return simple[kind]()


def program_lines(program: dict[str, Any], ranks: list[int]) -> list[str]:
    lines = [f"v{i} = {_leaf(leaf)}" for i, leaf in enumerate(program["inputs"])]
    for n, op in enumerate(program["ops"], start=len(program["inputs"])):
        if op["op"] == "inplace":
            lines += _inplace_lines(op) + [f"v{n} = v{op['x']}"]
        elif op["op"] == "mark":
            lines += [f"mark(v{op['x']}, {_spec(op['spec'])})", f"v{n} = v{op['x']}"]
        elif op["op"] == "einsum":
            letters = "abcd"[: ranks[op["x"]]]
            kept = letters.replace(letters[op["dim"]], "")
            equation = f"{letters},{letters[op['dim']]}z->{kept}z"
            lines.append(f"v{n} = {_expr({**op, 'equation': equation})}")
        elif op["op"] == "conv":
            lines.append(f"v{n} = {_expr({**op, 'spatial': ranks[op['x']] - 2})}")
        else:
            lines.append(f"v{n} = {_expr(op)}")
    outputs = ", ".join(f"v{slot}" for slot in program["outputs"])
    return lines + [f"return [{outputs}]"]


def script(program: dict[str, Any], title: str) -> str:
    ranks = [len(shape) for shape in check_program(program)]
    mesh = program["mesh"]
    body = "\n".join("    " + line for line in program_lines(program, ranks))
    return (
        HEADER.format(title=title.replace('"""', "'''"), devices=len(mesh["devices"]))
        + body
        + FOOTER.format(
            devices_list=mesh["devices"],
            mesh_shape=tuple(mesh["shape"]),
            axes=tuple(mesh["axes"]),
            rtol=RTOL,
            atol=ATOL,
        )
    )


def report(program: dict[str, Any], verdict: dict[str, str]) -> str:
    """What a failing program prints: its verdict, then the script that reproduces it."""
    title = f"{verdict['status']}: {verdict['detail'].splitlines()[0] if verdict['detail'] else ''}"[:300]
    return f"--- {title}\n{verdict['detail'][:1500]}\n--- standalone repro ---\n{script(program, title)}"
