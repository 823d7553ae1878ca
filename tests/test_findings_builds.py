"""Findings that name a torch_xla change from the records of two real runs (CPU backend, the small
FSDPv2 loop of tests/test_memory.py): a build whose step stops donating its parameters
(torch_xla's XLA_ENABLE_PARAM_ALIASING=0 in the child, build A of issue #49) is diagnosed from
the step modules' aliasing the base run kept, not only from bytes."""

from __future__ import annotations

import importlib.util
import re

import pytest

from harness import costs
from tests import test_memory
from tests.conftest import only_run_folder

pytestmark = [
    pytest.mark.selftest,
    pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed here"),
]

suite = test_memory.suite  # the fixture: LOOP_CASE run on the CPU backend, its faults set by env


def test_a_build_that_stops_donating_is_diagnosed_from_the_base_runs_step_modules(suite, monkeypatch):
    suite("-k", "healthy and not long_loop", "--spmd-results-dir=base", hidden=512).assert_outcomes(passed=1)
    monkeypatch.setenv("NO_DONATION", "1")  # build A: the step no longer aliases parameters to outputs
    result = suite("-k", "healthy and not long_loop", "--spmd-compare=base", "--spmd-results-dir=pr", hidden=512)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    found = re.search(
        r"diagnosis: donation lost: the build's step module aliases 0 of (\d+) parameters \(base: (\d+)\)", text
    )
    assert found, text[-4000:]
    assert 0 < int(found.group(2)) <= int(found.group(1))


LEAK_PER_CALL = """
import pytest

pytestmark = [pytest.mark.spmd]


def body_marks(ctx, calls):
    import ctypes

    import torch
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.spmd.xla_sharding as xla_sharding

    from harness import stepcosts, xla

    # build B: every xs.mark_sharding keeps 256 KiB of native memory (malloc'd, written, never freed)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    marked = xla_sharding.mark_sharding

    def leaking_mark_sharding(*args, **kwargs):
        ctypes.memset(libc.malloc(256 << 10), 1, 256 << 10)
        return marked(*args, **kwargs)

    xs.mark_sharding = xla_sharding.mark_sharding = leaking_mark_sharding
    n = xla.num_devices()
    mesh = xla.mesh((n, 1), ("fsdp", "model"))
    weight = torch.zeros(16, 8).to(xla.device())
    xs.mark_sharding(weight, mesh, ("fsdp", None))
    meter = stepcosts.StepMeter(ctx, parameters=[weight])
    for step in range(6):
        with meter.step():
            for _ in range(calls):
                x = torch.randn(4 * n, 16).to(xla.device())
                xs.mark_sharding(x, mesh, ("fsdp", None))
                weight.data = weight.data + (x.T @ x)[:, :8] * 1e-6
            xla.sync()


@pytest.mark.parametrize("calls", [1, 4])
def test_marks(spmd, calls):
    spmd.run(body_marks, calls=calls, fresh=True)
"""


def test_a_native_leak_per_mark_sharding_call_is_said_per_call(pytester):
    from tests.conftest import run_cpu

    pytester.makepyfile(test_marks=LEAK_PER_CALL)
    result = run_cpu(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "2 case(s): native memory per step grew",
            "  diagnosis: native memory kept on every step, +2* KiB to +1.0 MiB per step across 2 loop(s), "
            "1 to 4 mark_sharding calls per step: ~2??.? KiB per call",
        ]
    )
    # memray's share first, and its capture kept in the run folder (the line says where)
    result.stdout.fnmatch_lines(["*; memray saw *% of this growth: the rest is allocated where it does not track; *"])
    result.stdout.fnmatch_lines(
        ["*memray's capture: the run folder's memray/[*]__train_step3.memray, if the case fails*"]
    )
    kept = sorted(p.name for p in only_run_folder(pytester).glob("memray/*.memray"))
    assert kept == [
        "test_marks.py__test_marks[1]__train_step3.memray",
        "test_marks.py__test_marks[4]__train_step3.memray",
    ] or (len(kept) == 2 and all(name.endswith("__train_step3.memray") for name in kept)), kept
    assert all(p.stat().st_size > 0 for p in only_run_folder(pytester).glob("memray/*.memray"))


@pytest.mark.parametrize(
    "captures",
    [
        {"../escape": "AAAA"},  # a name that is not a plain name
        {"train_step3": "not base64!"},
        {"train_step3": "A" * (costs.MAX_CAPTURE_BYTES * 2)},  # over the bound
        {f"train_step{i}": "AAAA" for i in range(costs.MAX_CAPTURES + 1)},
        ["AAAA"],
    ],
)
def test_memray_captures_from_a_child_are_checked_as_untrusted(captures):
    from harness.isolation.parent import observations

    assert "memray captures" in (observations.problem({"values": {costs.CAPTURES_VALUE: captures}}) or "")
    assert observations.problem({"values": {costs.CAPTURES_VALUE: {"train_step3": "AAAA"}}}) is None
