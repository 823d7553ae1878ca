"""Self-tests of the cost detectors (harness.costs, harness.judges.costcheck), in fresh children.

Each reintroduces a cost regression of the kind users report into a small FSDPv2 training loop
that keeps its numbers and its recorded shardings, and shows the detector that must catch it
does, naming what changed:

* steady state (pytorch/xla#9755's kind): the input batch's sharding annotation changes every
  step, so every step traces and compiles a new graph with the same numerics;
* the cost baseline: a wrapped block computes its output from two row halves of its weight,
  so the partitioner gathers the weight twice; nothing recorded moves, the losses match;
* steady state, leaks (pytorch/xla#8423's kind, pytorch/pytorch#178276's on the host): the loop
  keeps one XLA tensor per step, or one host object per parameter per step;
* the cost baseline, memory: a block computes its product for eight copies of each row and keeps
  one, so its step graph's temp memory almost doubles; no collective, sharding or number moves;
* the meter itself: a body that clears torch_xla's counters every step (while every step compiles
  a new graph) is refused, never read as "no compiles".
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from harness import costs
from harness.costbaseline import CostBaseline
from harness.hlo import COLLECTIVE_OPCODES

pytestmark = [
    pytest.mark.spmd,
    pytest.mark.needs(devices=2),
    pytest.mark.no_cost_check("its bodies record cost regressions on purpose; the test judges them"),
]

STEPS = 3  # the third runs after the meter's two-step warm-up
# What the batch is marked with at each step when the annotation is made to move (over the
# ("fsdp", "model") mesh): rows cut, replicated, columns cut; three input shardings, three graphs.
ROTATING_SPECS = [("fsdp", None), (None, None), (None, "fsdp")]


def body_two_layer_fsdpv2(
    ctx,
    steps: int,
    rotate_input_sharding: bool = False,
    gather_twice: bool = False,
    keep_tensor_per_step: bool = False,
    keep_host_object_per_parameter: bool = False,
    clear_counters: bool = False,
    double_temp: bool = False,
) -> None:
    """A 2-layer MLP, each layer its own FSDPv2 unit, SGD on a batch-sharded input."""
    import functools

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    from harness import recording, stepcosts, xla

    class Layer(nn.Linear):
        def forward(self, x):
            if double_temp:
                # The product computed for eight copies of each row, one kept: each device holds
                # eight times the activation; the rows stay where they were, so do the numbers and
                # the collectives.
                return super().forward(torch.stack([x] * 8, dim=1))[:, 0]
            if not gather_twice:
                return super().forward(x)
            # The same rows in two halves: each half of the sharded weight is gathered on its own.
            half = self.out_features // 2
            return torch.cat([F.linear(x, self.weight[:half]), F.linear(x, self.weight[half:])], dim=-1) + self.bias

    n = xla.num_devices()
    mesh = xla.mesh((n, 1), ("fsdp", "model"))
    torch.manual_seed(0)
    model = nn.Sequential(Layer(16, 32), nn.Tanh(), Layer(32, 8))
    wrapped = FSDPv2(
        model,
        mesh=mesh,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Layer}),
    )
    recording.record_parameters(ctx, wrapped)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    meter = stepcosts.StepMeter(ctx, parameters=wrapped.parameters(), optimizer=optimizer)
    x_cpu = torch.randn(4 * n, 16)
    losses = []
    kept = []  # what a leaking loop holds on to, step after step
    for step in range(steps):
        with meter.step():
            if clear_counters:
                import torch_xla.debug.metrics as met

                met.clear_counters()
            x = x_cpu.to(xla.device())
            xs.mark_sharding(
                x, mesh, ROTATING_SPECS[step % len(ROTATING_SPECS)] if rotate_input_sharding else ("fsdp", None)
            )
            optimizer.zero_grad()
            loss = wrapped(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            if step == 0:
                recording.record_step_graph(ctx, "step0", [loss, *wrapped.parameters()])
            if keep_tensor_per_step:
                kept.append(loss.detach() * 1)  # one XLA tensor more alive after every step
            if keep_host_object_per_parameter:  # as a spec cache that never forgets (pytorch/pytorch#178276)
                kept += [ParameterSpec(name, tuple(p.shape)) for name, p in wrapped.named_parameters()]
            xla.sync()
        losses.append(loss.item())
    ctx.record("losses", losses)
    recording.record_parameters(ctx, wrapped, suffix="@after-steps")


@dataclasses.dataclass
class ParameterSpec:
    """A host-side record per parameter, like DTensor's DTensorSpec."""

    name: str
    shape: tuple


def signature_of(result) -> dict:
    return costs.check_signature(result.values[costs.SIGNATURES_VALUE][costs.DEFAULT_LABEL], "the body's signature")


def assert_same_numbers(a, b) -> None:
    assert all(
        math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a.values["losses"], b.values["losses"])
    ), f"the change must keep the numbers: {a.values['losses']} vs {b.values['losses']}"


def assert_healthy(result) -> None:
    """The unchanged loop must pass the detector first: on a build where it does not, the planted
    change cannot be told apart, and the build's own change is what the other failures name."""
    problems = costs.steady_state_problems(signature_of(result))
    assert problems == [], (
        "this build's unchanged two-layer FSDPv2 loop already fails the steady-state detector, so the "
        "detector's self-test cannot tell its planted change apart (the build's own change is what the "
        f"other failures of this run name): {'; '.join(problems)}"
    )


def assert_each_step_named(problems: list[str], change: str) -> None:
    """The detector names each step after its warm-up once, for the change planted in the loop."""
    expected = [f"step{i}" for i in range(2, STEPS)]
    assert [p.split(" ", 1)[0] for p in problems] == expected, (
        f"the steady-state detector should report {change} once at {', '.join(expected)} (after its 2-step "
        f"warm-up); on this build it reported {len(problems)} problem(s): {'; '.join(problems) or 'none'}"
    )


def test_steady_state_detector_catches_a_graph_per_step(spmd) -> None:
    healthy = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    retracing = spmd.run(body_two_layer_fsdpv2, steps=STEPS, rotate_input_sharding=True, fresh=True)
    assert_same_numbers(healthy, retracing)
    assert_healthy(healthy)
    steps = signature_of(retracing)["steps"]
    compiles = [s["compiles"] for s in steps]
    assert compiles == [1] * STEPS, (
        f"the planted change (the batch's sharding moves every step) should compile one graph per step; on this "
        f"build the loop compiled {compiles} graphs at steps 0-{STEPS - 1}, so the build's own change (the other "
        "failures of this run name it) hides what the self-test plants"
    )
    problems = costs.steady_state_problems(signature_of(retracing))
    assert_each_step_named(problems, "a graph compiled per step")
    # What differs is named: the batch's input sharding, replicated at step 1, columns cut at step 2.
    assert "{replicated} -> " in problems[0] and "parameter(" in problems[0], problems[0]


def test_cost_baseline_catches_communication_that_changes_no_sharding(spmd) -> None:
    before = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    after = spmd.run(body_two_layer_fsdpv2, steps=STEPS, gather_twice=True, fresh=True)
    assert_same_numbers(before, after)
    assert before.shardings == after.shardings, (
        "the planted change (a block gathering its weight twice) should move no recorded sharding; on this build "
        "the two loops record different shardings, so the build's own change hides what the self-test plants"
    )
    base = CostBaseline(
        None, "cpu", 0, "2.9.0", {"case": {costs.DEFAULT_LABEL: costs.comparable(signature_of(before))}}
    )  # type: ignore[arg-type]  # no file: only compare() is used
    assert base.compare("case", {costs.DEFAULT_LABEL: signature_of(before)}) == [], "no change, no line"
    # What fails: step0's graph. Each step's peak may move within the band or down (listed, not failed).
    lines = [str(c) for c in costs.failing(base.compare("case", {costs.DEFAULT_LABEL: signature_of(after)}) or [])]
    assert lines and all(line.startswith("step0: ") for line in lines), lines
    assert any(kind in line for line in lines for kind in COLLECTIVE_OPCODES), f"no collective named: {lines}"


def test_steady_state_detector_catches_a_tensor_kept_per_step(spmd) -> None:
    healthy = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    leaking = spmd.run(body_two_layer_fsdpv2, steps=STEPS, keep_tensor_per_step=True, fresh=True)
    assert_same_numbers(healthy, leaking)
    assert_healthy(healthy)
    live = [step["live"]["tensors"] for step in signature_of(leaking)["steps"]]
    assert live[1:] == [live[1] + n for n in range(STEPS - 1)], f"one tensor more alive per step: {live}"
    problems = costs.steady_state_problems(signature_of(leaking))
    assert_each_step_named(problems, "one XLA tensor kept per step")
    # The step, the growth and what stayed alive: the kept loss, a 0-dim float32 tensor.
    assert "left more alive than step1: XLA tensors" in problems[0], problems[0]
    assert "XLA tensors kept: float32[] +1" in problems[0], problems[0]


def test_steady_state_detector_catches_a_host_object_kept_per_parameter_per_step(spmd) -> None:
    leaking = spmd.run(body_two_layer_fsdpv2, steps=STEPS, keep_host_object_per_parameter=True, fresh=True)
    problems = costs.steady_state_problems(signature_of(leaking))
    assert_each_step_named(problems, "one host object kept per parameter per step")
    # One per parameter (two Linear layers: a weight and a bias each), named by type.
    assert "host objects kept: cases.test_costs.ParameterSpec +4" in problems[0], problems[0]
    assert "XLA tensors" not in problems[0], f"no device tensor was kept: {problems[0]}"


def test_cost_baseline_catches_temp_memory_that_changes_no_collective(spmd) -> None:
    before = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    after = spmd.run(body_two_layer_fsdpv2, steps=STEPS, double_temp=True, fresh=True)
    assert_same_numbers(before, after)
    assert before.shardings == after.shardings, "the change must leave every recorded sharding as it was"
    graph_before, graph_after = signature_of(before)["graphs"]["step0"], signature_of(after)["graphs"]["step0"]
    hidden = "so the build's own change (the other failures of this run name it) hides what the self-test plants"
    assert graph_before["collectives"] == graph_after["collectives"], (
        f"the planted change (a block computing eight copies of each row) should move no collective; on this build "
        f"step0's collectives differ between the two loops, {hidden}"
    )
    temps = f"{costs.kib(graph_before['memory']['temp'])} -> {costs.kib(graph_after['memory']['temp'])} per device"
    assert graph_after["memory"]["temp"] > 1.5 * graph_before["memory"]["temp"], (
        f"the planted change (a block computing eight copies of each row) should almost double step0's temp memory; "
        f"on this build it went {temps}, {hidden}"
    )
    base = CostBaseline(
        None, "cpu", 0, "2.9.0", {"case": {costs.DEFAULT_LABEL: costs.comparable(signature_of(before))}}
    )  # type: ignore[arg-type]  # no file: only compare() is used
    lines = [str(c) for c in base.compare("case", {costs.DEFAULT_LABEL: signature_of(after)})]
    temp = f"temp {costs.kib(graph_before['memory']['temp'])} -> {costs.kib(graph_after['memory']['temp'])} per device"
    graph_lines = [line for line in lines if temp in line]
    assert len(graph_lines) == 1 and graph_lines[0].startswith("step0: "), lines
    assert not any(kind in line for line in lines for kind in COLLECTIVE_OPCODES), lines
    # Every step's peak as the device holds it (the program of the graph it runs, and the other live buffers) grows with it.
    peaks = [line for line in lines if line not in graph_lines]
    assert [line.split(":")[0] for line in peaks] == [f"step{i}" for i in range(STEPS)], lines
    assert all(costs.HELD_PEAK_NAME in line for line in peaks), lines


def test_a_body_that_resets_the_counters_is_refused(spmd) -> None:
    """Every step compiles a new graph (the rotating input sharding) and clears the counters: it
    must not read as 'no compiles after the warm-up'."""
    result = spmd.run(
        body_two_layer_fsdpv2, steps=STEPS, rotate_input_sharding=True, clear_counters=True, fresh=True, check=False
    )
    assert result.exception is not None, "a step whose counters were reset must not pass"
    assert result.exception.type == "harness.costs.CountersReset", result.exception
    assert "step0: torch_xla's counters or metrics were reset during the measured step" in result.exception.message
