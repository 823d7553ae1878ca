"""Start-up order: what a job may call before and after `use_spmd()` (pytorch/xla#9535, #9735).

`xr.use_spmd()` documents that it "forces SPMD mode if some tensors are already initialized on
non-SPMD devices", replicating them. Two reports, both open and CPU-reproducible:

* #9735: `torch_xla.device()` or `xm.set_rng_state(...)` before `use_spmd()` (jobs that pick
  their device or seed first): `use_spmd()` warns "Replicating tensors already initialized ...",
  then the first SPMD computation dies with SIGSEGV. #9535 reports the same core dump after
  `xm.xla_device_kind()` is asked before `use_spmd()`.
* #9535: `xm.xla_device_kind()` after `use_spmd()` raises "Unknown device SPMD:0": the default
  device is the SPMD virtual device, which the runtime's device table does not hold.

Each body runs in a child of its own that has not imported torch_xla (`preload=False`), so the
order is the body's. A crash is charged to its case with the signal (docs/architecture.md).

That the cases would notice a fix: the device-kind fix is reintroduced in a child (the virtual
device answered for by a real one) and the case passes; the crashes live in torch_xla's C++, so
their proof is the same body with `use_spmd()` first, the documented order: every check after
the crash point passes there, so a release where the reported order stops crashing passes too.
"""

from __future__ import annotations

import pytest

# Every case here is a child of its own that imports torch_xla after its start-up calls (5-15 s).
pytestmark = [pytest.mark.spmd, pytest.mark.slow]

NO_DEVICE_KIND = "has no xm.xla_device_kind (public from 2.6)"

# The line use_spmd() prints when something touched the runtime first; the crash signature
# requires it in the child's log, so a SIGSEGV with another cause is not taken for this bug.
FORCED_SPMD_WARNING = "Replicating tensors already initialized"


# --------------------------------------------------------------------------------------------
# Child-side helpers (run inside case bodies only)
# --------------------------------------------------------------------------------------------


def _default_device():
    """torch_xla.device() (2.5+), else xm.xla_device() (2.4): what a job calls to get its device."""
    import torch_xla

    if hasattr(torch_xla, "device"):
        return torch_xla.device()
    import torch_xla.core.xla_model as xm

    return xm.xla_device()


def _has_device_kind(ctx) -> bool:
    import torch_xla.core.xla_model as xm

    return ctx.record("has_device_kind", hasattr(xm, "xla_device_kind"))


def _touch_runtime(ctx, call: str) -> None:
    """The call a job makes before use_spmd(): each initialises the runtime's default device."""
    import torch_xla.core.xla_model as xm

    if call == "device":
        ctx.record("device_asked", str(_default_device()))
    elif call == "set_rng_state":
        xm.set_rng_state(1234)
    elif call == "xla_device_kind":
        ctx.record("kind_asked", xm.xla_device_kind())
    else:
        raise ValueError(f"unknown start-up call {call!r}")


def _sharded_step(ctx) -> None:
    """A first SPMD computation: a row-sharded matmul read back and checked against the CPU."""
    import sys

    import torch
    import torch_xla.distributed.spmd as xs

    from harness import xla

    torch.manual_seed(0)
    a, b = torch.randn(4 * xla.num_devices(), 8), torch.randn(8, 4)
    on_device = a.to(_default_device())
    xs.mark_sharding(on_device, xla.mesh((xla.num_devices(), 1), ("data", "model")), ("data", None))
    ctx.record_sharding("a", xla.spec_of(on_device))
    # Printed (and flushed) so a crash's log tail shows which step it reached.
    print("start-up order: first SPMD computation", file=sys.stderr, flush=True)
    got = (on_device @ b.to(on_device.device)).cpu()
    xla.sync()
    if not torch.allclose(got, a @ b, rtol=1e-4, atol=1e-5):
        raise AssertionError(
            f"the first SPMD matmul differs from the CPU: max abs diff {float((got - a @ b).abs().max())}"
        )
    ctx.record("first_step", "matches the CPU")


def _reintroduce_device_kind_fix(ctx) -> None:
    """The fix #9535 asks for, in Python: the SPMD virtual device is answered for by a real one.

    No binding takes a runtime device name, and PJRT names its CPU device kind "cpu", so on the
    CPU backend the real device's kind is the lowercased device type. Other backends keep the bug.
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    installed = xm.xla_device_kind

    def kind_of_a_real_device(device=None):
        if xr.is_spmd() and xr.device_type() == "CPU":
            ctx.record("fix_answered", True)
            return "cpu"
        return installed(device)

    xm.xla_device_kind = kind_of_a_real_device


# --------------------------------------------------------------------------------------------
# Case bodies
# --------------------------------------------------------------------------------------------


def body_call_before_use_spmd(ctx, call: str) -> None:
    """`call`, then use_spmd(), then a first SPMD step."""
    from harness import xla

    if call == "xla_device_kind" and not _has_device_kind(ctx):
        return
    _touch_runtime(ctx, call)
    xla.enable_spmd()
    _sharded_step(ctx)


def body_documented_order(ctx, calls: list[str], reintroduce_device_kind_fix: bool) -> None:
    """use_spmd() first, then each of `calls`, then the same first SPMD step."""
    from harness import xla

    xla.enable_spmd()
    if not _has_device_kind(ctx):
        calls = [call for call in calls if call != "xla_device_kind"]
    elif reintroduce_device_kind_fix:
        _reintroduce_device_kind_fix(ctx)
    for call in calls:
        _touch_runtime(ctx, call)
    _sharded_step(ctx)


def body_device_kind_after_use_spmd(ctx, reintroduce_fix: bool = False) -> None:
    """use_spmd(), then xm.xla_device_kind() for the default device and for torch_xla.device()."""
    import torch_xla.core.xla_model as xm

    from harness import xla

    xla.enable_spmd()
    if not _has_device_kind(ctx):
        return
    if reintroduce_fix:
        _reintroduce_device_kind_fix(ctx)
    kinds = ctx.record("kinds", {"default": xm.xla_device_kind(), "device()": xm.xla_device_kind(_default_device())})
    empty = [name for name, kind in kinds.items() if not isinstance(kind, str) or not kind]
    if empty:
        raise AssertionError(f"xla_device_kind() gave no device kind under SPMD for {empty}: {kinds}")
    _sharded_step(ctx)


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _skip_without_device_kind(result) -> None:
    if result.values.get("has_device_kind", True) is False:
        pytest.skip(f"torch_xla {result.torch_xla} {NO_DEVICE_KIND}")


CALL_ROWS = [
    # pytorch/xla#9735: a job that picks its device first
    pytest.param("device", id="device"),
    # pytorch/xla#9735: a job that seeds XLA's generator first
    pytest.param("set_rng_state", id="set-rng-state"),
    # pytorch/xla#9535: a job that asks the device kind first
    pytest.param("xla_device_kind", id="xla-device-kind"),
]


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("use-spmd-after-runtime-init-segfault")
@pytest.mark.parametrize("call", CALL_ROWS)
def test_runtime_call_before_use_spmd(spmd, call) -> None:
    result = spmd.run(body_call_before_use_spmd, call=call, preload=False)
    _skip_without_device_kind(result)
    assert result.values["first_step"] == "matches the CPU"


@pytest.mark.needs(
    devices=2, backend="cpu", reason="the reintroduced device-kind fix knows PJRT CPU's device kind only"
)
def test_documented_order_passes_the_same_checks(spmd) -> None:
    """Self-test of the case above: with use_spmd() first (and xla_device_kind's fix put back,
    #9535's other half) every call and every check passes, so a release where the reported
    order stops crashing turns the xfail into an unexpected pass. One child for the three calls."""
    calls = [row.values[0] for row in CALL_ROWS]
    result = spmd.run(body_documented_order, calls=calls, reintroduce_device_kind_fix=True, preload=False)
    assert result.values["first_step"] == "matches the CPU"
    if result.values["has_device_kind"]:
        assert result.values["kind_asked"] == "cpu"


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("xla-device-kind-spmd-virtual-device")
def test_xla_device_kind_after_use_spmd(spmd) -> None:
    result = spmd.run(body_device_kind_after_use_spmd, preload=False)
    _skip_without_device_kind(result)
    assert set(result.values["kinds"]) == {"default", "device()"}


@pytest.mark.needs(devices=2, backend="cpu", reason="the reintroduced fix knows PJRT CPU's device kind only")
def test_reintroduced_device_kind_fix_passes(spmd) -> None:
    """Self-test: with the fix put in, the xla_device_kind case passes (its xfail would turn
    into an unexpected pass); without it, test_xla_device_kind_after_use_spmd shows the signature."""
    result = spmd.run(body_device_kind_after_use_spmd, reintroduce_fix=True, preload=False)
    _skip_without_device_kind(result)
    assert result.values.get("fix_answered"), "the reintroduced fix was never called"
    assert result.values["kinds"] == {"default": "cpu", "device()": "cpu"}
