"""Self-tests of the cost detectors (harness.costs, harness.costcheck), in fresh children.

Each reintroduces a cost regression of the kind users report into a small FSDPv2 training loop
that keeps its numbers and its recorded shardings, and shows the detector that must catch it
does, naming what changed:

* steady state (pytorch/xla#9755's kind): the input batch's sharding annotation changes every
  step, so every step traces and compiles a new graph with the same numerics;
* the cost baseline: a wrapped block computes its output from two row halves of its weight,
  so the partitioner gathers the weight twice; nothing recorded moves, the losses match.
"""

from __future__ import annotations

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


def body_two_layer_fsdpv2(ctx, steps: int, rotate_input_sharding: bool = False, gather_twice: bool = False) -> None:
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
    for step in range(steps):
        with meter.step():
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
            xla.sync()
        losses.append(loss.item())
    ctx.record("losses", losses)
    recording.record_parameters(ctx, wrapped, suffix="@after-steps")


def signature_of(result) -> dict:
    return costs.check_signature(result.values[costs.SIGNATURES_KEY][costs.DEFAULT_LABEL], "the body's signature")


def assert_same_numbers(a, b) -> None:
    assert all(
        math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a.values["losses"], b.values["losses"])
    ), f"the change must keep the numbers: {a.values['losses']} vs {b.values['losses']}"


def test_steady_state_detector_catches_a_graph_per_step(spmd) -> None:
    healthy = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    retracing = spmd.run(body_two_layer_fsdpv2, steps=STEPS, rotate_input_sharding=True, fresh=True)
    assert_same_numbers(healthy, retracing)
    assert costs.steady_state_problems(signature_of(healthy)) == [], "a healthy loop must pass the detector"
    steps = signature_of(retracing)["steps"]
    assert [s["compiles"] for s in steps] == [1] * STEPS, f"the change must compile a graph every step: {steps}"
    problems = costs.steady_state_problems(signature_of(retracing))
    assert [p.split(" ", 1)[0] for p in problems] == [f"step{i}" for i in range(2, STEPS)], problems
    # What differs is named: the batch's input sharding, replicated at step 1, columns cut at step 2.
    assert "{replicated} -> " in problems[0] and "parameter(" in problems[0], problems[0]


def test_cost_baseline_catches_communication_that_changes_no_sharding(spmd) -> None:
    before = spmd.run(body_two_layer_fsdpv2, steps=STEPS, fresh=True)
    after = spmd.run(body_two_layer_fsdpv2, steps=STEPS, gather_twice=True, fresh=True)
    assert_same_numbers(before, after)
    assert before.shardings == after.shardings, "the change must leave every recorded sharding as it was"
    base = CostBaseline(
        None, "cpu", 0, "2.9.0", {"case": {costs.DEFAULT_LABEL: costs.comparable(signature_of(before))}}
    )  # type: ignore[arg-type]  # no file: only compare() is used
    assert base.compare("case", {costs.DEFAULT_LABEL: signature_of(before)}) == [], "no change, no line"
    lines = [str(c) for c in base.compare("case", {costs.DEFAULT_LABEL: signature_of(after)})]
    assert lines and all(line.startswith("step0: ") for line in lines), lines
    assert any(kind in line for line in lines for kind in COLLECTIVE_OPCODES), f"no collective named: {lines}"
