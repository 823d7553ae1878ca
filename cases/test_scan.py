"""scan with SPMD: `mark_sharding` or `print` inside the scanned function (pytorch/xla#9405).

`torch_xla.experimental.scan.scan(fn, init, xs)` (2.5.1+) traces `fn` once, through
AOTAutograd, on functional tensors that hold no XLA data; `xs.mark_sharding` there raises
"Expected XLA tensor. Got: XLAFloatType" (2.9.0; 2.6-2.8: "Input tensor is not an XLA
tensor"), whether functionalization is on or off. #9405 is closed upstream, yet every release
measured here from 2.6.0 to 2.9.0 raises, and 2.5.1 (whose scan traced fn on XLA tensors) runs
the same fn and matches the CPU: a regression of 2.6.0, open; the releases win.

#8742 (a `mark_sharding` inside `fn` replacing the inputs' device data: NaN; fixed by #8769
in 2.7) sits behind the same call: on CPU no release gets as far as the replacement, so it has
no case of its own here.

That the case would notice a fix: the same scan with the annotation moved out of `fn` onto the
carry (the workaround) passes the same checks, so a release where marking inside `fn` works
turns the xfail into an unexpected pass.
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
