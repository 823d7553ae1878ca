"""Failures of one cause are shown whole once (harness.run.samecause): a black-box run on the fake
backend with seven cases that fail alike and one that fails otherwise."""

from __future__ import annotations

import pytest

from tests.conftest import run_fake

pytestmark = pytest.mark.selftest

CASES = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def deep(n):
    if n:
        return deep(n - 1)
    raise RuntimeError("Check failed: tensor_data:")

def body_alike(ctx):
    deep(12)

def body_other(ctx):
    raise ValueError("another cause altogether")

@pytest.mark.parametrize("i", range(7))
def test_alike(spmd, i):
    spmd.run(body_alike)

def test_other(spmd):
    spmd.run(body_other)
"""


def test_seven_failures_of_one_cause_show_the_first_whole_and_the_rest_by_their_first_lines(pytester):
    pytester.makepyfile(test_cases=CASES)
    result = run_fake(pytester, "-p", "no:randomly")
    result.assert_outcomes(failed=8)
    out = result.stdout.str()
    failures = out.split("= FAILURES =", 1)[1].split("spmd findings", 1)[0]
    # the child's traceback: once for the first of the seven, once for the other cause
    assert failures.count("Traceback (most recent call last)") == 2, failures
    assert failures.count("the same cause as test_cases.py::test_alike[0]") == 6, failures
    assert "ValueError: another cause altogether" in failures
    result.stdout.fnmatch_lines(
        [
            "*_ test_alike[[]3[]] _*",
            "*RuntimeError: Check failed: tensor_data:",
            "test_cases.py:*: the same cause as test_cases.py::test_alike[[]0[]] (the same first line), shown whole above;*",
        ]
    )
    # the findings and the FAILED lines say what they say of whole failures
    # (a first line ending in ':' once read the repeat's own next line: 6 and 1 case(s), two findings)
    result.stdout.fnmatch_lines(["7 case(s): RuntimeError: Check failed: tensor_data:", "*e.g.*", "*cases:*"])
    result.stdout.fnmatch_lines(["*spmd findings: 8 failed case(s), 2 finding(s) by cause*"])
    result.stdout.fnmatch_lines(["FAILED test_cases.py::test_alike[[]6[]] - RuntimeError: Check failed: tensor_data*"])
    # a style asked for: every failure whole
    whole = run_fake(pytester, "-p", "no:randomly", "--tb=long").stdout.str()
    assert "the same cause as" not in whole
    assert whole.split("= FAILURES =", 1)[1].count("Traceback (most recent call last)") == 8


def test_under_xdist_a_repeat_drops_the_worker_line_its_first_shows(pytester):
    """xdist prints "[gw0] linux -- Python ... <venv>" before every failure: 24 lines of a 437-line
    run (one extra sync per FSDPv2 block). A repeat shows none; each first of a cause keeps its own."""
    import re

    pytester.makepyfile(test_cases=CASES)
    result = run_fake(pytester, "-p", "no:randomly", "-n", "2")
    result.assert_outcomes(failed=8)
    failures = result.stdout.str().split("= FAILURES =", 1)[1].split("spmd findings", 1)[0]
    assert len(re.findall(r"^\[gw\d+\] ", failures, re.MULTILINE)) == 2, failures
    whole = run_fake(pytester, "-p", "no:randomly", "-n", "2", "--tb=long").stdout.str()
    assert len(re.findall(r"^\[gw\d+\] ", whole.split("= FAILURES =", 1)[1], re.MULTILINE)) == 8
