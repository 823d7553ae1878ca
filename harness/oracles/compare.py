"""Child side: one verdict per program, the sharded XLA run against the same program eager on the CPU.

The tolerance (RTOL, ATOL in harness.oracles.program): an output passes when its shape and dtype are the CPU's and every
element satisfies |xla - cpu| <= RTOL * |cpu| + ATOL * max(1, max|cpu|). Inputs are exact
multiples of 1/4, so adds, products, reductions, matmuls, cumsums and data movement are exact in
float32 in any order; the tolerance only absorbs the few ulps by which XLA's CPU tanh, sin, exp
(softmax, sigmoid) and rsqrt (layer_norm) may differ from ATen's. The generator produces no NaN or
infinity (no log, sqrt or division of drawn data), so NaN ordering never enters a comparison.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch

from harness.oracles.interpret import Place, run_program
from harness.oracles.program import ATOL, RTOL

DETAIL_LIMIT = 2000


def verdict(status: str, detail: str = "") -> dict[str, str]:
    return {"status": status, "detail": detail[:DETAIL_LIMIT]}


def compare_outputs(got: list[torch.Tensor], want: list[torch.Tensor], slots: list[int]) -> dict[str, str]:
    for slot, g, w in zip(slots, got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return verdict(
                "mismatch", f"value {slot}: XLA gave {tuple(g.shape)} {g.dtype}, CPU {tuple(w.shape)} {w.dtype}"
            )
        if w.is_floating_point():
            scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
            bad = ~((g - w).abs() <= RTOL * w.abs() + ATOL * scale)
        else:
            bad = g != w
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            return verdict(
                "mismatch",
                f"value {slot}: {int(bad.sum())} of {w.numel()} elements differ; first at {where}: "
                f"XLA {g[where].item()!r}, CPU {w[where].item()!r}\nXLA {g.tolist()}\nCPU {w.tolist()}",
            )
    return verdict("ok")


def check_program_on_xla(program: dict[str, Any]) -> dict[str, str]:
    """Run the program both ways and compare its outputs; an exception on one side is a verdict too."""
    from harness import xla

    slots = program["outputs"]
    try:
        want = [run_program(program, Place(None))[slot].clone() for slot in slots]
    except Exception:  # the generator made a program eager torch refuses: ours to fix, not torch_xla's
        return verdict("invalid", traceback.format_exc(limit=3))
    try:
        values = run_program(program, Place(program["mesh"]))
        outputs = [values[slot] for slot in slots]
        xla.sync()
        got = [tensor.cpu() for tensor in outputs]
    except Exception as exc:
        return verdict("xla_error", f"{type(exc).__name__}: {exc}")
    return compare_outputs(got, want, slots)
