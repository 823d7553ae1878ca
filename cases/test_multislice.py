"""Bug 4: MegaScale discovery running twice in multi-slice jobs (pytorch/xla#8812).

`trace_pallas` lowers a kernel with `jax.jit(kernel).lower(...)`; the first lowering starts JAX's
own backends, which on TPU creates a second libtpu client that redoes MegaScale discovery unless
`SKIP_MEGASCALE_PJRT_CLIENT=true` is set at that moment. Where the guard lives:

    2.4.0-2.5.1   none                                     (entry megascale-no-guard)
    2.6.x         inline set/pop inside trace_pallas        (no nesting API)
    nightlies     requires_jax whose context *deleted* the variable on exit (#8654), so a nested
                  decorated helper unset it before lower() ran (entry megascale-guard-deleted-by-nesting)
    2.7.0         nesting-safe `_jax_env_context` in torch_xla/experimental/custom_kernel.py (#8819)
    2.8.0+        `jax_env_context`/`requires_jax` in torch_xla/_internal/jax_workarounds.py

On CPU the variable is observed directly: JAX's backend initialisation and the traced kernel
record its value. On a 2-slice TPU job a flash-attention step is run for real.
"""

from __future__ import annotations

import pytest

from harness.registry import get_entry

pytestmark = pytest.mark.spmd

VAR = "SKIP_MEGASCALE_PJRT_CLIENT"
NO_GUARD_API = (
    "has no guard function to nest or patch (none before 2.6; 2.6.x sets and pops the variable inline in trace_pallas)"
)


# --------------------------------------------------------------------------------------------
# Child-side helpers (run inside case bodies only)
# --------------------------------------------------------------------------------------------


def _record_jax_backend_inits(ctx):
    """Wrap jax._src.xla_bridge._init_backend (jax 0.4.38 and 0.7.1) to record VAR per platform.

    Must run before JAX starts any backend (importing torch_xla and use_spmd start none, which
    the bodies assert). Returns the bridge module.
    """
    import os

    import jax._src.xla_bridge as bridge

    inits = ctx.record("jax_backend_inits", [])
    original = bridge._init_backend

    def recording_init_backend(platform, *args, **kwargs):
        inits.append({"platform": platform, VAR: os.environ.get(VAR)})
        return original(platform, *args, **kwargs)

    bridge._init_backend = recording_init_backend
    return bridge


def _guard_api():
    """(module, name of its context manager) of the release's nesting guard, or None on 2.6.x.

    `requires_jax` lives in the same module and looks the context manager up as a module global
    at call time, so replacing that attribute changes every decorated function.
    """
    try:
        from torch_xla._internal import jax_workarounds  # 2.8+
    except ImportError:
        jax_workarounds = None
    if jax_workarounds is not None and hasattr(jax_workarounds, "jax_env_context"):
        return jax_workarounds, "jax_env_context"
    import torch_xla.experimental.custom_kernel as custom_kernel

    if hasattr(custom_kernel, "_jax_env_context"):  # 2.7
        return custom_kernel, "_jax_env_context"
    return None


def _reintroduce_deleting_guard(ctx) -> bool:
    """Patch in the pre-#8819 guard: set VAR on entry, delete it on exit (never restore)."""
    import contextlib
    import os

    api = _guard_api()
    ctx.record("guard_api", api and f"{api[0].__name__}.{api[1]}")
    if api is None:
        return False

    @contextlib.contextmanager
    def deleting_guard():
        os.environ[VAR] = "true"
        try:
            yield
        finally:
            os.environ.pop(VAR, None)

    setattr(api[0], api[1], deleting_guard)
    return True


def _trace_plain_kernel(torch_device) -> list:
    """trace_pallas a plain JAX function (no Pallas) that records VAR while it is traced."""
    import os

    # torch_xla 2.9.0 with jax 0.7.1: without this import, trace_pallas's own import of
    # jax._src.pallas.mosaic.pallas_call_registration hits a circular import (AttributeError).
    import jax.experimental.pallas  # noqa: F401 - imported for that side effect only
    import torch
    from torch_xla.experimental.custom_kernel import trace_pallas

    seen_while_traced = []

    def add_one(x):
        seen_while_traced.append(os.environ.get(VAR))
        return x + 1

    trace_pallas(add_one, torch.ones(8, device=torch_device))
    return seen_while_traced


def _assert_backends_not_started(bridge, when: str) -> None:
    if bridge.backends_are_initialized():
        raise AssertionError(f"JAX backends were initialised {when}; expected them untouched until a kernel is traced")


def _plain_spmd_step() -> None:
    import torch
    import torch_xla.distributed.spmd as xs

    from harness import xla

    mesh = xla.mesh((xla.num_devices(),), ("data",))
    t = torch.randn(2 * xla.num_devices(), 4).to(xla.device())
    xs.mark_sharding(t, mesh, ("data", None))
    (t * 2).sum().cpu()
    xla.sync()


# --------------------------------------------------------------------------------------------
# Case bodies
# --------------------------------------------------------------------------------------------


def body_trace_pallas_sets_skip(ctx, reintroduce_deleting_guard: bool = False) -> None:
    """A child of its own, set up (torch_xla imported, SPMD on) but with no JAX backend started yet:
    JAX start-up and the traced kernel must both see VAR == 'true'."""
    import os

    bridge = _record_jax_backend_inits(ctx)
    os.environ.pop(VAR, None)

    from harness import xla

    _assert_backends_not_started(bridge, "by the child's set-up (import torch_xla, use_spmd)")
    _plain_spmd_step()
    _assert_backends_not_started(bridge, "by a plain SPMD step")

    if reintroduce_deleting_guard and not _reintroduce_deleting_guard(ctx):
        return
    traced = ctx.record("seen_while_traced", _trace_plain_kernel(xla.device()))
    inits = ctx.values["jax_backend_inits"]
    after = ctx.record("after_trace", os.environ.get(VAR))

    if not traced:
        raise AssertionError("trace_pallas never traced the kernel; nothing was checked")
    if any(value != "true" for value in traced):
        raise AssertionError(f"{VAR} was not 'true' while trace_pallas traced the kernel (saw {traced})")
    if not inits:
        raise AssertionError("trace_pallas did not initialise JAX's backends; the start-up check saw nothing")
    wrong = [i for i in inits if i[VAR] != "true"]
    if wrong:
        raise AssertionError(f"{VAR} was not 'true' at JAX backend initialisation: {wrong}")
    if after is not None:
        raise AssertionError(f"{VAR} not restored: unset before trace_pallas, {after!r} after")


def body_nested_guards(ctx, reintroduce_deleting_guard: bool = False) -> None:
    """An inner guard exiting must leave VAR set for the rest of the outer guard."""
    import os

    if reintroduce_deleting_guard:
        if not _reintroduce_deleting_guard(ctx):
            return
    api = _guard_api()
    ctx.record("guard_api", api and f"{api[0].__name__}.{api[1]}")
    if api is None:
        return
    module, name = api
    os.environ.pop(VAR, None)
    try:

        @module.requires_jax
        def inner():
            return os.environ.get(VAR)

        @module.requires_jax
        def outer():
            inside_inner = inner()
            return inside_inner, os.environ.get(VAR)

        inside_inner, after_inner = ctx.record("decorators", outer())
        if inside_inner != "true" or after_inner != "true":
            raise AssertionError(
                f"{VAR} was not 'true' inside nested requires_jax functions "
                f"(inner saw {inside_inner!r}; outer saw {after_inner!r} after inner returned)"
            )

        guard = getattr(module, name)
        with guard():
            with guard():
                pass
            after_inner_with = ctx.record("contexts", os.environ.get(VAR))
        if after_inner_with != "true":
            raise AssertionError(
                f"{VAR} was not 'true' in the outer {name} after a nested one exited (saw {after_inner_with!r})"
            )
        if os.environ.get(VAR) is not None:
            raise AssertionError(f"{VAR} not restored: unset before the guards, {os.environ.get(VAR)!r} after")
    finally:
        os.environ.pop(VAR, None)


def body_preset_value_restored(ctx, presets: list[str], via: str, reintroduce_deleting_guard: bool = False) -> None:
    """A value of VAR set before the guard is 'true' inside it and back afterwards."""
    import os

    if reintroduce_deleting_guard and not _reintroduce_deleting_guard(ctx):
        return
    api = _guard_api()
    ctx.record("guard_api", api and f"{api[0].__name__}.{api[1]}")
    if via == "guard" and api is None:
        return
    from harness import xla

    observed = ctx.record("observed", [])
    try:
        for preset in presets:
            os.environ[VAR] = preset
            if via == "guard":
                with getattr(*api)():
                    inside = [os.environ.get(VAR)]
            else:
                inside = _trace_plain_kernel(xla.device())
            after = os.environ.get(VAR)
            observed.append({"before": preset, "inside": inside, "after": after})
            if any(value != "true" for value in inside):
                raise AssertionError(f"{VAR} was not 'true' inside {via} with {preset!r} set before (saw {inside})")
            if after != preset:
                raise AssertionError(f"{VAR} not restored by {via}: {preset!r} before, {after!r} after")
    finally:
        os.environ.pop(VAR, None)


def body_flash_attention_multislice(ctx, seq_len: int, steps: int) -> None:
    """2-slice TPU: flash attention forward/backward on a mesh over every device of both slices.

    Evidence of a second MegaScale discovery: JAX creating its own TPU client without VAR set.
    libtpu's own log lines that mention MegaScale are counted from this process's log for the
    record; their wording is not a stable interface, so they are not asserted on.
    """
    import os
    import re

    import torch

    bridge = _record_jax_backend_inits(ctx)
    from harness import xla

    xla.enable_spmd()
    _assert_backends_not_started(bridge, "by import torch_xla")
    import jax.experimental.pallas  # noqa: F401  (see _trace_plain_kernel)
    from torch_xla.experimental.custom_kernel import flash_attention

    devices = xla.num_devices()
    slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1"))
    ctx.record("mesh", {"devices": devices, "slices": slices})
    mesh = xla.mesh((slices, devices // slices), ("dcn", "ici"))
    shape = (devices, 2, seq_len, 128)  # batch over both mesh axes, i.e. across the slices
    q, k, v = (torch.randn(shape, requires_grad=True, device=xla.device()) for _ in range(3))
    losses = []
    for _ in range(steps):
        out = flash_attention(q, k, v, causal=True, partition_spec=(("dcn", "ici"), None, None, None), mesh=mesh)
        loss = out.float().pow(2).mean()
        loss.backward()
        xla.sync()
        losses.append(float(loss.detach().cpu()))
    ctx.record("losses", losses)
    if not all(torch.isfinite(torch.tensor(losses))):
        raise AssertionError(f"flash attention losses are not finite: {losses}")

    inits = ctx.values["jax_backend_inits"]
    unguarded_tpu = [i for i in inits if i["platform"] == "tpu" and i[VAR] != "true"]
    if unguarded_tpu:
        raise AssertionError(
            f"{VAR} was not 'true' when JAX created its TPU client ({unguarded_tpu}): "
            "that client runs MegaScale discovery a second time in this process"
        )
    log_path = os.readlink("/proc/self/fd/2")
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as fh:
            lines = [line.rstrip() for line in fh if re.search(r"(?i)megascale", line)]
        ctx.record("megascale_log_lines", {"count": len(lines), "first": lines[:10]})


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _skip_without_guard_api(result) -> None:
    if result.values.get("guard_api", "") is None:
        pytest.skip(f"torch_xla {result.torch_xla} {NO_GUARD_API}")


@pytest.mark.needs(jax=True)
@pytest.mark.known_bug("megascale-no-guard")
def test_trace_pallas_sets_skip_megascale(spmd) -> None:
    result = spmd.run(body_trace_pallas_sets_skip, fresh=True)
    platforms = [i["platform"] for i in result.values["jax_backend_inits"]]
    assert "cpu" in platforms, f"JAX started no CPU backend during trace_pallas: {platforms}"


@pytest.mark.needs(jax=True)
@pytest.mark.known_bug("megascale-guard-deleted-by-nesting")
def test_nested_guards_leave_skip_set(spmd) -> None:
    result = spmd.run(body_nested_guards)
    _skip_without_guard_api(result)
    assert result.values["decorators"] == ["true", "true"]
    assert result.values["contexts"] == "true"


PRESET_ROWS = [
    # the public path every Pallas kernel takes; before 2.6 there is no guard at all, so a preset
    # 'false' is seen inside: judged as megascale-no-guard there, as the 2.6 entry from 2.6.0 on
    pytest.param(
        "trace_pallas",
        marks=[
            pytest.mark.known_bug("megascale-preset-dropped-by-trace-pallas"),
            pytest.mark.known_bug("megascale-no-guard"),
        ],
        id="via-trace-pallas",
    ),
    # the guard itself (2.7+)
    pytest.param("guard", marks=pytest.mark.known_bug("megascale-guard-deleted-by-nesting"), id="via-guard"),
]


@pytest.mark.needs(jax=True)
@pytest.mark.parametrize("via", PRESET_ROWS)
def test_preset_skip_value_is_restored(spmd, via) -> None:
    presets = ["true", "false"]  # a job that sets it for good; a job that sets it off
    result = spmd.run(body_preset_value_restored, presets=presets, via=via, fresh=via == "trace_pallas")
    _skip_without_guard_api(result)
    assert [o["after"] for o in result.values["observed"]] == presets


REINTRODUCTION_ROWS = [
    # trace_pallas calls the decorated to_jax_shape_dtype_struct: its exit unset VAR before lower()
    pytest.param("body_trace_pallas_sets_skip", {}, id="trace-pallas"),
    # an inner decorated function / context exits inside an outer one
    pytest.param("body_nested_guards", {}, id="nested-guards"),
    # a value set before the guard is deleted instead of restored
    pytest.param("body_preset_value_restored", {"presets": ["false"], "via": "guard"}, id="preset-restore"),
]


@pytest.mark.needs(jax=True)
@pytest.mark.parametrize("body_name,options", REINTRODUCTION_ROWS)
def test_reintroduced_deleting_guard_is_detected(spmd, body_name, options) -> None:
    """Self-test: with the pre-#8819 guard patched back in, the case fails with the entry's signature."""
    result = spmd.run(globals()[body_name], reintroduce_deleting_guard=True, fresh=True, check=False, **options)
    _skip_without_guard_api(result)
    assert result.outcome == "error", (
        f"expected the case to fail with the deleting guard patched in; outcome {result.outcome}"
    )
    entry = get_entry("megascale-guard-deleted-by-nesting")
    signature = entry.matching_signature(result.error.evidence)
    assert signature, (
        f"failure {result.error.evidence!r} matches none of {entry.id}'s signatures {[p.pattern for p in entry.signatures]}"
    )


@pytest.mark.needs(backend="tpu", multislice=True, jax=True)
@pytest.mark.known_bug("megascale-no-guard")
def test_flash_attention_step_across_slices(spmd) -> None:
    result = spmd.run(body_flash_attention_multislice, seq_len=512, steps=2, preload=False, timeout=900)
    tpu_inits = [i for i in result.values["jax_backend_inits"] if i["platform"] == "tpu"]
    assert len(tpu_inits) <= 1, f"JAX created its TPU client more than once: {tpu_inits}"
