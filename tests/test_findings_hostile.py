"""harness.findings on what a failure's text can be: its first line is the code under test's
(an exception message), so a finding's headline is bounded however long it is, and an assertion
that failed is not offered the baselines' update command as if it were a figure that moved."""

from __future__ import annotations

import pytest

from harness import findings
from harness.findings import FailedCase

pytestmark = pytest.mark.selftest

HINT = "--spmd-update-costs"


def test_a_huge_failure_line_makes_a_headline_of_a_terminals_width():
    enormous = "AssertionError: " + "W" * 3_000_000 + " ::error::x"
    shown = findings.lines([FailedCase("a::t", [enormous]), FailedCase("b::t", ["RuntimeError: " + "V" * 10**6])])
    assert shown[0].startswith("1 case(s): AssertionError: WWW")
    assert max(len(line) for line in shown) <= 400, [len(line) for line in shown]


def test_failures_no_figure_explains_are_not_offered_the_baselines_update():
    shown = findings.lines([FailedCase("a::t", ["AssertionError: the loss is nan"])], HINT)
    assert not any(HINT in line for line in shown), shown
    grew = FailedCase("b::t", ["step0: outputs 36.5 KiB -> 55.2 KiB per device"])
    assert shown_hint(findings.lines([grew, FailedCase("a::t", ["AssertionError: nan"])], HINT))


def shown_hint(shown: list[str]) -> bool:
    return shown[-1].startswith("if these changes are intended (and only then): " + HINT)
