"""scan with SPMD: `mark_sharding` or `print` inside the scanned function (pytorch/xla#9405).

`torch_xla.experimental.scan.scan(fn, init, xs)` (2.5.1+) traces `fn` once, through
AOTAutograd, on functional tensors that hold no XLA data; `xs.mark_sharding` there raises
"Expected XLA tensor. Got: XLAFloatType" (2.9.0; 2.6-2.8: "Input tensor is not an XLA
tensor"), whether functionalization is on or off. #9405 is closed upstream, yet every release
measured here from 2.6.0 to 2.9.0 raises, and 2.5.1 (whose scan is a Python loop over fn, on
XLA tensors) runs the same fn and matches the CPU: a regression of 2.6.0, open; the releases win.
`print` of an activation inside `fn` (#9405's other half) raises the same way from 2.6.0 on.

That the case would notice a fix: the same scan with the annotation moved out of `fn` onto the
carry (the workaround) passes the same checks, so a release where marking inside `fn` works
turns the xfail into an unexpected pass.

pytorch/xla#8742 (scan + flash attention + SPMD: NaN, or a different output every run; fixed by
#8769 in 2.7): scan traces `fn` on placeholder tensors that hold device data. Flash attention
(an op AOTAutograd records, from pytorch/xla#8654) marks its inputs in place inside its XLA
kernel, and `mark_sharding` on a tensor whose IR is device data (`q = hidden.clone()` shares the
carry's) replaces that data instead of annotating it: the traced `fn` then reads the placeholder's
contents instead of its input. On CPU the same is an op of the case's own (`torch.library`:
a fake kernel for the trace, an XLA kernel that marks its input, then computes) fed a clone of the
carry, as the attention layers of #8742 were. Measured on CPU: 2.4.0 has no scan; 2.5.1's scan is
a Python loop (nothing traced: right); 2.6.0 reproduces (outputs that differ from the loop, NaN,
two runs that differ: registry `scan-mark-sharding-replaces-fn-input`); 2.7.0-2.9.0 pass (#8769
multiplies fn's inputs by 1, so they hold no device data); the self-test does the same in `fn`
and passes on 2.6.0 too. The flash-attention twin runs on a TPU only (a Pallas TPU kernel) and
skips elsewhere, saying so; it was not run here.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spmd

LAYERS = 3
NO_SCAN = "has no torch_xla.experimental.scan (from 2.5.1)"


def body_scan_with_mark_sharding(ctx, mark_inside: bool, print_inside: bool = False) -> None:
    """A 3-layer tanh stack scanned over its stacked weights; the activation is row-sharded
    inside `fn` (mark_inside) or only the initial carry is (the workaround). print_inside: `fn`
    prints its activation (#9405's other report), as one debugging a layer does."""
    import torch
    import torch_xla.distributed.spmd as xs

    from harness import xla

    try:
        from torch_xla.experimental.scan import scan
    except ImportError:
        ctx.record("has_scan", False)
        return
    ctx.record("has_scan", True)
    mesh = xla.mesh((xla.num_devices(), 1), ("fsdp", "model"))

    def layer(carry, weight):
        h = torch.tanh(carry @ weight)
        if mark_inside:
            xs.mark_sharding(h, mesh, ("fsdp", None))
        if print_inside:
            print(f"layer activation: {h}")
        return h, h.sum(dim=1)

    torch.manual_seed(0)
    init_cpu, weights_cpu = torch.randn(2 * xla.num_devices(), 8), torch.randn(LAYERS, 8, 8) * 0.5
    init = init_cpu.to(xla.device())
    xs.mark_sharding(init, mesh, ("fsdp", None))
    final, ys = scan(layer, init, weights_cpu.to(xla.device()))
    xla.sync()
    ctx.record_sharding("final_carry", xla.spec_of(final))

    carry, expected_ys = init_cpu, []
    for weight in weights_cpu:
        carry = torch.tanh(carry @ weight)
        expected_ys.append(carry.sum(dim=1))
    got = ys.cpu()
    if not torch.allclose(got, torch.stack(expected_ys), rtol=1e-4, atol=1e-5):
        raise AssertionError(f"scan's per-layer outputs differ from a Python loop on the CPU: {got} vs {expected_ys}")
    if not torch.allclose(final.cpu(), carry, rtol=1e-4, atol=1e-5):
        raise AssertionError("scan's final carry differs from a Python loop on the CPU")


def _skip_without_scan(result) -> None:
    if result.values.get("has_scan", True) is False:
        pytest.skip(f"torch_xla {result.torch_xla} {NO_SCAN}")


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("scan-mark-sharding-inside-fn")
@pytest.mark.parametrize("functionalization", [True, False], ids=["func-on", "func-off"])
def test_mark_sharding_inside_scanned_fn(spmd, functionalization) -> None:
    result = spmd.run(body_scan_with_mark_sharding, mark_inside=True, functionalization=functionalization)
    _skip_without_scan(result)
    assert result.shardings["final_carry"]


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("scan-print-inside-fn")
def test_print_inside_scanned_fn(spmd) -> None:
    """#9405's other half: `print` of an activation inside `fn` raises on 2.6-2.9 (the same functional
    tensors without XLA data), works on 2.5.1. The case below, the same scan without a call in
    `fn`, passes the same checks, so a release where fn can print turns this xfail into a pass."""
    result = spmd.run(body_scan_with_mark_sharding, mark_inside=False, print_inside=True)
    _skip_without_scan(result)
    assert result.shardings["final_carry"]


@pytest.mark.needs(devices=2)
def test_mark_sharding_outside_scanned_fn_passes_the_same_checks(spmd) -> None:
    """Self-test of the case above: with the annotation on the carry, not inside fn, the same
    scan passes, so a release that lets fn mark its activation turns that xfail into an
    unexpected pass; the carry stays row-sharded through the loop."""
    from harness.sharding import assert_tiled_along

    result = spmd.run(body_scan_with_mark_sharding, mark_inside=False)
    _skip_without_scan(result)
    assert_tiled_along(result.shardings["final_carry"], 0, spmd.backend.capabilities().devices, context="final carry")


# --------------------------------------------------------------------------------------------
# pytorch/xla#8742: fn marks its own input inside scan
# --------------------------------------------------------------------------------------------

MARKED_INPUT = "scan over a fn that marks its own input"
NO_CUSTOM_OP = "runs torch without torch.library.custom_op (from torch 2.4)"


def _runs_agree(ctx, runs, reference, rtol: float, atol: float) -> None:
    """Every run of the scan is finite, equal to the unscanned reference, and equal to the first
    run; else one AssertionError naming each way it is not (the entry's signature)."""
    import torch

    problems = []
    for index, got in enumerate(runs):
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            problems.append(f"run {index} has {bad} of {got.numel()} values not finite")
        elif not torch.allclose(got, reference, rtol=rtol, atol=atol):
            diff = (got - reference).abs().max().item()
            problems.append(f"run {index} differs from the unscanned loop (max |diff| {diff:.3g})")
    if len(runs) > 1 and not torch.equal(torch.nan_to_num(runs[0]), torch.nan_to_num(runs[1])):
        problems.append("two runs of the same scan on the same inputs differ")
    ctx.record("problems", problems)
    if problems:
        raise AssertionError(
            f"{MARKED_INPUT} (mark_sharding inside fn): " + "; ".join(problems) + " (the input's device data "
            "was replaced while scan traced fn, pytorch/xla#8742)"
        )


def body_scan_fn_marks_its_input(ctx, defeat_device_data: bool = False) -> None:
    """A 3-layer tanh stack scanned over its stacked weights; `fn` first marks its carry with the
    op a traced flash attention runs (in place, through the dispatcher). defeat_device_data: `fn`
    marks `carry * 1` instead, #8769's fix done in user code. Two runs against the CPU loop."""
    import torch

    from harness import xla

    try:
        from torch_xla.experimental.scan import scan
    except ImportError:
        ctx.record("skip", NO_SCAN)
        return
    import torch_xla.distributed.spmd as xs

    if not hasattr(torch.library, "custom_op"):
        ctx.record("skip", NO_CUSTOM_OP)
        return
    n = xla.num_devices()
    mesh = xla.mesh((n, 1), ("fsdp", "model"))

    # What flash attention is from pytorch/xla#8654 on: an op AOTAutograd records (its fake
    # kernel gives the shape) whose XLA kernel marks its inputs in place, then computes.
    # The schema is written out: this module's annotations are strings (from __future__), which
    # torch 2.7+ cannot infer a schema from.
    @torch.library.custom_op("harness_case::mark_then_double", mutates_args=(), schema="(Tensor x) -> Tensor")
    def mark_then_double(x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "xla":
            xs.mark_sharding(x, mesh, ("fsdp", None))
        return x * 2

    @mark_then_double.register_fake
    def _(x):
        return torch.empty_like(x)

    # scan traces fn's backward too (AOTAutograd): the gradient of x * 2.
    mark_then_double.register_autograd(lambda _ctx, grad: grad * 2)

    def layer(carry, weight):
        # As the attention layers of #8742 did: q = hidden.clone(), which shares the carry's data.
        marked = mark_then_double((carry * 1 if defeat_device_data else carry).clone())
        h = torch.tanh(marked @ weight)
        return h, h.sum(dim=1)

    torch.manual_seed(0)
    init_cpu, weights_cpu = torch.randn(2 * n, 8), torch.randn(LAYERS, 8, 8) * 0.5
    carry, expected = init_cpu, []
    for weight in weights_cpu:
        carry = torch.tanh((carry * 2) @ weight)
        expected.append(carry.sum(dim=1))
    runs = []
    for _ in range(2):
        final, ys = scan(layer, init_cpu.to(xla.device()), weights_cpu.to(xla.device()))
        xla.sync()
        runs.append(torch.cat([final.cpu().flatten(), ys.cpu().flatten()]))
    ctx.record_sharding("final_carry", xla.spec_of(final))
    reference = torch.cat([carry.flatten(), torch.stack(expected).flatten()])
    _runs_agree(ctx, runs, reference, rtol=1e-4, atol=1e-5)


def _skip_if_said(result) -> None:
    if "skip" in result.values:
        pytest.skip(f"torch_xla {result.torch_xla} {result.values['skip']}")


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("scan-mark-sharding-replaces-fn-input")
def test_scan_fn_marking_its_input_matches_the_loop(spmd) -> None:
    result = spmd.run(body_scan_fn_marks_its_input, fresh=True)
    _skip_if_said(result)
    assert result.values["problems"] == []


@pytest.mark.needs(devices=2)
def test_scan_fn_marking_a_computed_copy_matches_the_loop(spmd) -> None:
    """Self-test of the case above: the same fn marking `carry * 1` (what #8769 does to every input
    of fn from 2.7) passes on every release with scan, so a release where marking fn's input works
    turns that xfail into an unexpected pass, and 2.6.0's failure is the input's own."""
    result = spmd.run(body_scan_fn_marks_its_input, defeat_device_data=True, fresh=True)
    _skip_if_said(result)
    assert result.values["problems"] == []


def body_scan_flash_attention(ctx, layers: int, seq_len: int) -> None:
    """TPU: `layers` flash-attention layers (each marks q, k, v with its partition spec inside the
    kernel's wrapper) run by scan_layers, twice, against the same layers in a Python loop."""
    import torch
    import torch.nn as nn
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.custom_kernel import flash_attention

    from harness import xla

    try:
        from torch_xla.experimental.scan_layers import scan_layers
    except ImportError:
        ctx.record("skip", "has no torch_xla.experimental.scan_layers (from 2.6.0)")
        return
    n = xla.num_devices()
    mesh = xla.mesh((n, 1), ("fsdp", "model"))
    spec = ("fsdp", None, None, None)

    class Attention(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.proj = nn.Linear(dim, dim)

        def forward(self, hidden):
            out = flash_attention(
                hidden.clone(), hidden.clone(), hidden.clone(), causal=True, partition_spec=spec, mesh=mesh
            )
            return self.proj(out)

    torch.manual_seed(12)
    stack = nn.ModuleList(Attention(128) for _ in range(layers)).to(xla.device())
    hidden = torch.randn(n, 2, seq_len, 128).to(xla.device())
    xs.mark_sharding(hidden, mesh, spec)

    looped = hidden
    for layer in stack:
        looped = layer(looped)
    xla.sync()
    reference = looped.cpu()
    runs = []
    for _ in range(2):
        runs.append(scan_layers(stack, hidden))
        xla.sync()
    _runs_agree(ctx, [r.cpu() for r in runs], reference, rtol=1e-3, atol=1e-3)


@pytest.mark.needs(backend="tpu", jax=True, reason="flash attention is a Pallas TPU kernel")
@pytest.mark.known_bug("scan-mark-sharding-replaces-fn-input")
def test_scan_flash_attention_matches_the_loop(spmd) -> None:
    """pytorch/xla#8742 as reported: scan_layers over flash-attention layers on a TPU mesh is
    finite, the same on two runs, and equal to the Python loop. Never run here (no TPU): on CPU it
    skips with the reason."""
    result = spmd.run(body_scan_flash_attention, layers=3, seq_len=256, fresh=True, timeout=900)
    _skip_if_said(result)
    assert result.values["problems"] == []
