"""Loops that leak and try to come out green, as a hostile change or a torch_xla regression would.

The steady-state rule (harness.costs.steady_state_problems) looks for a figure that grows on each
judged step; the meter (harness.stepcosts) reads the collector and the native heap after each step.
Each test here is a way around one of them that once passed:

* a leak on every other step (the optimizer step of a 2-step gradient accumulation) grows on no
  two consecutive steps: judged over two-step spans where the loop has three of them;
* a longer warm-up judges fewer steps (a 5-step loop with a 4-step warm-up judges one, and native
  growth needs two): the warm-up is in the cost baseline and compared exactly;
* a body that replaces gc.get_objects or harness.metering.nativememory.now while its loop runs: the meter
  calls the functions it bound when it was imported;
* a body that freezes the collector (gc.freeze) after making a device tensor: the tensor stays in
  the loop's count and the device footprint (torch_xla needed).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from harness import costs
from tests.conftest import run_cpu, run_fake

pytestmark = pytest.mark.selftest


def loop(values: dict[str, list[int]], warmup: int = 2) -> dict:
    """A signature whose steps' live figures are `values` (field -> one value per step)."""
    count = len(next(iter(values.values())))
    return {
        "warmup": warmup,
        "steps": [
            {
                "compiles": 0,
                "cache_hits": 1,
                "executions": 1,
                "graphs": [],
                "live": {f: v[i] for f, v in values.items()},
            }
            for i in range(count)
        ],
        "graphs": {},
        "memory": {},
    }


def every_other(start: int, grow: int, steps: int, odd: bool) -> list[int]:
    """A figure that grows by `grow` on odd steps (odd=True: the optimizer step of a 2-step
    accumulation that zeroes on even steps) or on even ones."""
    values, value = [], start
    for step in range(steps):
        value += grow if step % 2 == (1 if odd else 0) else 0
        values.append(value)
    return values


@pytest.mark.parametrize("odd", [True, False], ids=["odd-steps", "even-steps"])
def test_a_leak_on_every_other_step_fails_a_six_step_loop_in_either_phase(odd):
    tensors = every_other(6, 1, 6, odd)
    problems = costs.steady_state_problems(
        loop({"tensors": tensors, "bytes_per_device": [4 * t for t in tensors], "host_objects": [200] * 6})
    )
    assert len(problems) == 1 and problems[0].startswith(
        "step3..step5 each left more alive than two steps before (a leak every other step): XLA tensors "
    ), problems
    host = costs.steady_state_problems(loop({"host_objects": every_other(300, 4, 6, odd)}))
    assert "a leak every other step): host objects" in host[0], host
    # 300 KiB malloc'd every other step: 150 KiB per step, above the 128 KiB a healthy step stays under
    native = loop({"heap_bytes": every_other(50 << 20, 300 << 10, 6, odd), "rss_bytes": [400 << 20] * 6})
    (line,) = costs.steady_state_problems(native)
    assert "native heap (malloc in use) +150 KiB per step" in line, line
    assert costs.native_growth(native)["heap_bytes"] == 150 << 10


@pytest.mark.parametrize(
    "tensors",
    [
        [1, 2, 3, 3, 3, 3],  # deque(maxlen=3) of the losses, full after step 2
        [1, 2, 3, 4, 4, 4],  # deque(maxlen=4): full after step 3
        [6, 6, 6, 6, 7, 7],  # a one-off at step 4 (a checkpoint's first save, a lazy import)
        [6, 6, 6, 7, 7, 7],  # a one-off at step 3
        [4, 5, 6, 7, 8, 8],  # a window of 5 from step 0, full after step 4: grows on steps in a row
    ],
)
def test_windows_and_one_offs_are_no_leak_every_other_step(tensors):
    assert costs.steady_state_problems(loop({"tensors": tensors, "bytes_per_device": [4 * t for t in tensors]})) == []


def test_a_healthy_loops_native_noise_is_no_leak_every_other_step():
    # the healthy per-step growths measured on 2.4.0 and 2.9.0 (docs/costs.md), alternating with none
    heap = [50 << 20]
    for grew in [659 << 10, 27 << 10, 0, 27 << 10, 0]:
        heap.append(heap[-1] + grew)
    rss = [400 << 20]
    for grew in [20 << 20, 252 << 10, 0, 252 << 10, 0]:
        rss.append(rss[-1] + grew)
    assert costs.steady_state_problems(loop({"heap_bytes": heap, "rss_bytes": rss})) == []


@pytest.mark.xfail(
    strict=True,
    reason="5 metered steps (the library's loops) judge three one-step spans and two two-step spans: a "
    "leak on steps 1 and 3 (2-step accumulation, optimizer on odd steps) grows on one judged step, as a "
    "one-off does. Telling them apart needs 6 metered steps (costs.METERED_STEPS, baselines rewritten)",
)
def test_a_five_step_loop_leaking_on_every_other_step_fails_steady_state():
    tensors = every_other(6, 1, 5, odd=True)
    assert costs.steady_state_problems(loop({"tensors": tensors, "bytes_per_device": [4 * t for t in tensors]}))


def test_a_longer_warm_up_is_a_cost_change_against_the_baseline():
    healthy = loop({"tensors": [6] * 5})
    longer = loop({"tensors": [6] * 5}, warmup=4)
    assert costs.comparable(healthy)["warmup"] == 2
    assert [str(c) for c in costs.compare(costs.comparable(healthy), costs.comparable(longer))] == [
        "warm-up: 2 -> 4 steps (steady state judges the steps after it)"
    ]
    # a baseline taken before the warm-up was kept compares nothing about it
    old = costs.comparable(healthy)
    del old["warmup"]
    assert costs.compare(old, costs.comparable(longer)) == []


# --- black-box: host-only loops on the fake backend ------------------------------------------------

HOSTILE_LOOP = """
import ctypes
import gc
import os

import pytest

from harness import stepcosts
from harness.metering import nativememory

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]


class Spec:
    pass


def body_loop(ctx, attack, warmup, steps):
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    meter = stepcosts.StepMeter(ctx, label="host", warmup=warmup, host_only=True)
    kept = []
    real_get_objects, real_now = gc.get_objects, nativememory.now
    for _ in range(steps):
        with meter.step():
            if attack == "slow_native":  # under the per-step threshold (128 KiB), for many steps: 800 KiB over 20
                ctypes.memset(libc.malloc(40 << 10), 1, 40 << 10)
            if attack in ("native", "hide_native"):  # a C++ block never freed: 300 KiB per step, written
                ctypes.memset(libc.malloc(300 << 10), 1, 300 << 10)
            if attack == "hide_native":
                nativememory.now = lambda: {}
            if attack == "hide_objects":
                kept.extend(Spec() for _ in range(4))
                gc.get_objects = lambda *args, **kwargs: [o for o in real_get_objects(*args, **kwargs) if type(o) is not Spec]
    gc.get_objects, nativememory.now = real_get_objects, real_now


def test_loop(spmd):
    # (read here: a child's environment is the harness's own, not the test's)
    attack, warmup, steps = os.environ.get("ATTACK", "none"), int(os.environ.get("WARMUP", "2")), int(os.environ.get("STEPS", "5"))
    spmd.run(body_loop, attack=attack, warmup=warmup, steps=steps, fresh=True)
"""


def test_a_native_leak_behind_a_longer_warm_up_fails_against_the_cost_baseline(pytester, monkeypatch):
    pytester.makepyfile(test_hostile=HOSTILE_LOOP)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")  # on the baseline's release line: drift fails
    run_fake(pytester, "--spmd-costs-baseline=costs.json", "--spmd-update-costs").assert_outcomes(passed=1)
    assert (
        json.loads((pytester.path / "costs.json").read_text())["cases"]["test_hostile.py::test_loop"]["host"]["warmup"]
        == 2
    )
    monkeypatch.setenv("ATTACK", "native")
    result = run_fake(pytester, "-rA", "--spmd-costs-baseline=costs.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*host/step2..step4 each left more alive than the step before: native heap*"])
    monkeypatch.setenv("WARMUP", "4")  # one judged step: native growth needs two, so nothing judged it
    result = run_fake(pytester, "-rA", "--spmd-costs-baseline=costs.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*cost drift: 1 item(s) differ from costs.json*", "*host/warm-up: 2 -> 4 steps (steady state judges*"]
    )


@pytest.mark.parametrize(
    "attack, named",
    [
        ("hide_objects", "*host/step2..step4 each left more alive than the step before: host objects*Spec +4*"),
        ("hide_native", "*host/step2..step4 each left more alive than the step before: native heap*"),
    ],
)
def test_a_body_that_replaces_what_the_meter_reads_does_not_blind_it(pytester, monkeypatch, attack, named):
    pytester.makepyfile(test_hostile=HOSTILE_LOOP)
    monkeypatch.setenv("ATTACK", attack)
    result = run_fake(pytester, "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([named])


def test_a_native_leak_under_the_per_step_threshold_fails_a_twenty_step_loop(pytester, monkeypatch):
    # the nightly tier's length: judged by the slope over the steps after the warm-up (costs.slow_leaks)
    pytester.makepyfile(test_hostile=HOSTILE_LOOP)
    monkeypatch.setenv("ATTACK", "slow_native")
    monkeypatch.setenv("STEPS", "5")  # the PR tier's length: under the per-step threshold, it passes
    run_fake(pytester, "-rA").assert_outcomes(passed=1)
    monkeypatch.setenv("STEPS", "20")
    result = run_fake(pytester, "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*step2..step19 (a slow leak): native heap (malloc in use) +4* KiB per step over 18 steps (least-squares*"]
    )


# --- real torch_xla: a device tensor hidden by gc.freeze() -----------------------------------------

FREEZE_LOOP = """
import gc
import os

import pytest

pytestmark = [pytest.mark.spmd]


def body_loop(ctx, mode):
    import collections

    import torch
    import torch.nn as nn

    from harness import stepcosts, xla

    torch.manual_seed(0)
    model = nn.Linear(16, 8).to(xla.device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = stepcosts.StepMeter(ctx, parameters=model.parameters(), optimizer=optimizer)
    held = []
    window = collections.deque(maxlen=4 if mode == "window4" else 3)  # a moving average's last losses
    for step in range(5):
        with meter.step():
            if mode == "hide" and step == 0:  # 256 KiB a device holds from the first step on, then frozen
                held.append(torch.zeros(65536).to(xla.device()))  # a transfer: no graph's output
                gc.freeze()
            optimizer.zero_grad()
            loss = model(torch.randn(8, 16).to(xla.device())).pow(2).mean()
            loss.backward()
            optimizer.step()
            if mode.startswith("window"):
                window.append(loss.detach())
            xla.sync()


def test_loop(spmd):
    spmd.run(body_loop, mode=os.environ.get("MODE", "healthy"), fresh=True)


@pytest.mark.parametrize("mode", ["window3", "window4"])
def test_window(spmd, mode):
    spmd.run(body_loop, mode=mode, fresh=True)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed here")
def test_a_device_tensor_frozen_by_the_body_stays_in_the_footprint(pytester, monkeypatch):
    pytester.makepyfile(test_freeze=FREEZE_LOOP)

    def run(*args: str) -> pytest.RunResult:
        return run_cpu(pytester, "--spmd-costs-baseline=costs.json", *args)

    run("--spmd-update-costs", "-k", "test_loop").assert_outcomes(passed=1)
    monkeypatch.setenv("MODE", "hide")
    result = run("-rA", "-k", "test_loop")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*cost drift: * item(s) differ from costs.json*",
            "*  step0: live after step: * -> * tensors (+256 KiB per device), device footprint * -> * per device "
            "(device buffers new: float32[[]65536[]] * +1)*",
        ]
    )


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed here")
def test_a_window_of_three_or_four_losses_passes_the_librarys_five_step_loop(pytester):
    """The window fills on step 2 or 3, after the warm-up: from the step after, the meter notes where
    XLA tensors are made, and its own recorder must not read as what the loop keeps."""
    pytester.makepyfile(test_freeze=FREEZE_LOOP)
    result = run_cpu(pytester, "-rA", "-k", "test_window")
    result.assert_outcomes(passed=2)


# --- what a newcomer's loop that compiles once after the warm-up reads -------------------------------


def test_a_graph_with_more_inputs_names_the_inputs_it_gained_not_shifted_positions():
    before = ["f32[16] {replicated}", "f32[8,16] {devices=[4,1]0,1,2,3}", "f32[] {replicated}"]
    after = [*before[:1], "f32[8,16] {devices=[4,1]0,1,2,3}", *before[1:], "f64[] {replicated}"]
    assert costs.input_differences(before, after) == [
        "3 -> 5 parameters (new: f32[8,16] {devices=[4,1]0,1,2,3}, f64[] {replicated})"
    ]
    assert costs.input_differences(after, before) == [
        "5 -> 3 parameters (gone: f32[8,16] {devices=[4,1]0,1,2,3}, f64[] {replicated})"
    ]


def test_a_graph_compiled_once_after_the_warm_up_says_how_to_warm_up_longer():
    # 2-step gradient accumulation with Adam: step 1 makes the optimizer state, step 3 reads it
    once = loop({"tensors": [6] * 5})
    for index, compiles in enumerate([1, 1, 0, 1, 0]):
        once["steps"][index]["compiles"] = compiles
    once["steps"][3]["differs"] = ["17 -> 25 parameters (new: f32[32,16] {devices=[4,1]0,1,2,3} x2)"]
    (line,) = costs.steady_state_problems(once)
    assert line.startswith("step3 compiled 1 new graph(s) after the 2-step warm-up: 17 -> 25 parameters"), line
    assert "(once: the steps after it compiled nothing" in line and "StepMeter(ctx, warmup=...)" in line, line
    every = loop({"tensors": [6] * 5})
    for step in every["steps"]:
        step["compiles"] = 1
    assert not any("once:" in p for p in costs.steady_state_problems(every))
