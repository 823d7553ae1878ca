"""Dynamo (`torch.compile(backend="openxla")`) with SPMD: a compiled step retraces every step
(pytorch/xla#9755, open in 2.9.0).

Before it runs the cached graph, the bridge (`torch_xla/_dynamo/dynamo_bridge.py`;
`torch_xla/core/dynamo_bridge.py` in 2.4) compares the inputs' sharding specs with those
recorded when it traced. A tensor that was never annotated has the spec `''`; tracing
materialises it as replicated data, so the recorded spec is `'{replicated}'`. A job that feeds a
fresh unannotated tensor each step (a replicated batch, targets, a mask) then never matches:
every step re-extracts the graph (lazy tracing, a compilation-cache lookup) and the countdown
that would stop the checks (`XLA_DYNAMO_INPUT_SHARDING_CHECK_THRESHOLD`) is reset each time.

On CPU the retrace is counted exactly: a Dynamo step that runs its cached graph traces nothing,
so a step after the warm-up that looks the compilation cache up (`CachedCompile`) retraced.
The loop has the ViT loop's detectors: shardings recorded by name and baselined, the cost
signature (harness.stepcosts), losses against a CPU reference.

That the case would notice a fix: the bridge's comparison is made to read `''` as
`'{replicated}'` (the fix #9755 asks for) in a child, and the same loop passes.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spmd

STEPS = 5
WARMUP = 2  # step 0 traces and compiles; step 1 may retrace once the parameters are device data


# --------------------------------------------------------------------------------------------
# Child-side helpers (run inside case bodies only)
# --------------------------------------------------------------------------------------------


def _bridge_module():
    try:
        import torch_xla._dynamo.dynamo_bridge as bridge  # 2.5+
    except ImportError:
        import torch_xla.core.dynamo_bridge as bridge  # 2.4
    return bridge


def _record_traces(ctx, bridge) -> list:
    """Observe each graph extraction (a trace) with the sharding specs it recorded; changes nothing."""
    traces = ctx.record("traces", [])
    installed = bridge.extract_graph_helper

    def recording_extract(*args, **kwargs):
        extracted = installed(*args, **kwargs)
        traces.append({"specs": list(extracted[0])})
        return extracted

    bridge.extract_graph_helper = recording_extract
    return traces


def _reintroduce_spec_fix(ctx, bridge) -> None:
    """The fix #9755 asks for: the bridge reads an unannotated tensor's '' as '{replicated}'.

    The bridge calls torch_xla._XLAC._get_xla_sharding_specs through its module global
    `torch_xla`; only the bridge's view is replaced, every other caller sees the real binding.
    """
    import types

    import torch_xla

    real_specs = torch_xla._XLAC._get_xla_sharding_specs
    calls = ctx.record("fix_calls", [0])

    def normalised_specs(tensors):
        calls[0] += 1
        return ["{replicated}" if spec == "" else spec for spec in real_specs(tensors)]

    xlac = types.SimpleNamespace(**{name: getattr(torch_xla._XLAC, name) for name in dir(torch_xla._XLAC)})
    xlac._get_xla_sharding_specs = normalised_specs
    view = types.SimpleNamespace(**{name: getattr(torch_xla, name) for name in dir(torch_xla)})
    view._XLAC = xlac
    bridge.torch_xla = view


# --------------------------------------------------------------------------------------------
# Case bodies
# --------------------------------------------------------------------------------------------


def body_dynamo_spmd_steps(ctx, steps: int, reintroduce_fix: bool = False) -> None:
    """A 2-layer MLP with row-sharded weights compiled by Dynamo (openxla), one forward step per
    batch (no grad); the batch is row-sharded, the targets come fresh and unannotated each step.

    Forward only: compiling forward and backward under SPMD gave losses that leave the CPU
    reference from the third step on (2.9.0, without any retrace after the warm-up), a second
    problem this case does not claim to judge.
    """
    import contextlib
    import copy

    import torch
    import torch.nn as nn
    import torch_xla.distributed.spmd as xs

    from harness import recording, stepcosts, xla

    bridge = _bridge_module()
    traces = _record_traces(ctx, bridge)
    if reintroduce_fix:
        _reintroduce_spec_fix(ctx, bridge)

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    model = copy.deepcopy(reference).to(xla.device())
    mesh = xla.mesh((xla.num_devices(), 1), ("fsdp", "model"))
    for param in model.parameters():
        if param.dim() == 2:
            xs.mark_sharding(param, mesh, ("fsdp", None))
    ctx.record("param_shapes", recording.record_parameters(ctx, model))

    def loss_of(net, x, target):
        return (net(x) - target).pow(2).mean()

    compiled = torch.compile(lambda x, target: loss_of(model, x, target), backend="openxla")
    meter = None
    rows = 2 * xla.num_devices()
    losses, cpu_losses, call_specs, traces_per_step = [], [], [], []
    for step in range(steps):
        x_cpu, target_cpu = torch.randn(rows, 16), torch.randn(rows, 8)
        x = x_cpu.to(xla.device())
        xs.mark_sharding(x, mesh, ("fsdp", None))
        target = target_cpu.to(xla.device())  # a job's targets: never annotated
        call_specs.append(xla.spec_of(target))
        traced_before = len(traces)
        if step == 1:
            # Dynamo's first call partitions the graph with torch_xla's counters cleared
            # (UnsupportedNodesCollector): the meter, which refuses a reset inside a measured
            # step, starts after it. Its step N is the loop's step N + 1.
            meter = stepcosts.StepMeter(ctx, warmup=WARMUP - 1, parameters=model.parameters())
        with meter.step() if meter else contextlib.nullcontext(), torch.no_grad():
            loss = compiled(x, target)
            xla.sync()
        traces_per_step.append(len(traces) - traced_before)
        losses.append(float(loss.cpu()))
        with torch.no_grad():
            cpu_losses.append(float(loss_of(reference, x_cpu, target_cpu)))
        if step == 0:
            ctx.record_sharding("batch", xla.spec_of(x))
    recording.record_parameters(ctx, model, prefix="after_steps.")
    ctx.record("losses", {"xla": losses, "cpu": cpu_losses})
    ctx.record("traces_per_step", traces_per_step)
    ctx.record("target_specs_at_call", call_specs)
    if not torch.allclose(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5):
        raise AssertionError(f"Dynamo SPMD losses {losses} differ from the CPU reference {cpu_losses}")

    # Loop step N is the meter's step N - 1; step 0 (Dynamo's compilation) is not metered.
    lookups = [None] + [entry["cache_hits"] + entry["compiles"] for entry in meter.signature["steps"]]
    retraced = [step for step in range(WARMUP, steps) if lookups[step]]
    if retraced:
        traced_specs = sorted({spec for trace in traces for spec in trace["specs"]})
        raise AssertionError(
            f"Dynamo retraced the compiled SPMD step at steps {retraced} after the {WARMUP}-step warm-up "
            f"(graph extractions per step {traces_per_step}, compilation-cache lookups per step {lookups}): "
            f"the unannotated targets' sharding spec at the call is {call_specs[-1]!r}, "
            f"the traced graph recorded {traced_specs}"
        )


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _check_params_sharded(result, devices: int) -> None:
    from harness.sharding import assert_tiled_along, is_replicated

    for name, shape in result.values["param_shapes"].items():
        spec = result.shardings[f"after_steps.{name}"]
        if len(shape) == 2:
            assert_tiled_along(spec, 0, devices, context=f"{name} {shape} after the steps")
        else:
            assert is_replicated(spec), f"{name} {shape}: expected {{replicated}}, got {spec!r}"


@pytest.mark.needs(devices=2)
@pytest.mark.known_bug("dynamo-spmd-retrace-every-step")
def test_dynamo_compiled_spmd_step(spmd) -> None:
    result = spmd.run(body_dynamo_spmd_steps, steps=STEPS, fresh=True)  # cost-measured: a clean compile cache
    _check_params_sharded(result, spmd.backend.capabilities().devices)
    assert result.values["traces_per_step"][WARMUP:] == [0] * (STEPS - WARMUP)


@pytest.mark.needs(devices=2)
@pytest.mark.no_cost_check(
    "the reintroduced fix changes what the bridge reads; its loop is judged by its own assertions"
)
@pytest.mark.no_sharding_baseline("the same loop as test_dynamo_compiled_spmd_step, with the fix put back")
def test_reintroduced_spec_fix_stops_the_retrace(spmd) -> None:
    """Self-test: with '' read as '{replicated}' by the bridge, the loop above passes (its
    xfail would turn into an unexpected pass)."""
    result = spmd.run(body_dynamo_spmd_steps, steps=STEPS, reintroduce_fix=True, fresh=True)
    assert result.values["fix_calls"][0] >= STEPS, "the bridge never called the reintroduced fix"
    assert result.values["traces_per_step"][WARMUP:] == [0] * (STEPS - WARMUP)
    assert set(result.values["target_specs_at_call"]) == {""}, "the targets were annotated: the bug's trigger is gone"
