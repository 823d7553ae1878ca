"""Findings that name a torch_xla change from the records of two real runs (CPU backend, the small
FSDPv2 loop of tests/test_memory.py): a build whose step stops donating its parameters
(torch_xla's XLA_ENABLE_PARAM_ALIASING=0 in the child, build A of issue #49) is diagnosed from
the step modules' aliasing the base run kept, not only from bytes."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests import test_memory

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
