"""Which run --spmd-compare holds this one to (harness.judges.basecompare.find_run), through real
pytest runs on the fake backend (the fixtures of tests/test_basecompare.py): the base run is
chosen by what it is, never the PR's own earlier comparison run, and one version label on both
sides is a warning."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests import test_basecompare
from tests.test_basecompare import BASE_BUILD, PR_BUILD, TILED, only_run, refused
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

suite = test_basecompare.suite  # the fixture: a case file run as the base build, then as the PR's


def test_a_comparison_run_in_the_same_folder_is_never_taken_for_the_base(suite, pytester):
    """One results folder for the base run and the PR's runs: rerunning the PR compares with the
    base build again, not with its own previous comparison run (which would agree with anything)."""
    suite(version=BASE_BUILD, results="shared")
    first = suite("--spmd-compare=shared", results="shared", costs=signature(all_gather=5))
    first.assert_outcomes(failed=1, passed=1, xfailed=1)
    again = suite("--spmd-compare=shared", results="shared", costs=signature(all_gather=5))
    again.assert_outcomes(failed=1, passed=1, xfailed=1)
    again.stdout.fnmatch_lines(["*compared with base run*(torch_xla 2.10.0+git1111111, 3 case records)*"])


def test_the_same_version_label_on_both_sides_is_a_warning_in_the_header_and_the_summary(suite, pytester):
    suite(version=PR_BUILD, results="base")
    result = suite("--spmd-compare=base", version=PR_BUILD)
    result.assert_outcomes(passed=2, xfailed=1)
    warning = "WARNING: the base run and this build are both torch_xla 2.10.0+git2222222*"
    result.stdout.fnmatch_lines(["*compared with base run*", warning, "*compared with the base run*", warning])
    assert pytester.run(sys.executable, "-m", "harness.report", "pr").ret == 0
    summary = (only_run(pytester.path / "pr") / "summary.md").read_text()
    assert "WARNING: the base run and this build are both torch\\_xla 2.10.0+git2222222" in summary


def test_an_older_run_of_this_device_count_is_chosen_over_a_newer_one_of_another(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    matching = only_run(pytester.path / "base")
    suite("--spmd-devices=8", version=BASE_BUILD, results="base")  # newer, another device count
    result = suite("--spmd-compare=base", costs=signature(all_gather=5))
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    result.stdout.fnmatch_lines([f"*compared with base run {matching} (*"])


def test_no_fitting_base_run_is_refused_naming_each_candidate(suite, pytester):
    suite(version=BASE_BUILD, results="shared", shardings={"w": TILED})
    base = only_run(pytester.path / "shared")
    suite("--spmd-compare=shared", results="shared")
    compared = next(p for p in (pytester.path / "shared").glob("run-*") if p != base)
    shutil.rmtree(base)
    result = suite("--spmd-compare=shared", results="pr")
    refused(
        result,
        f"--spmd-compare={pytester.path / 'shared'} holds no finished run folder",
        f"{compared.name} is itself a comparison",
    )
    refused(suite(f"--spmd-compare={compared}"), f"base run {compared} is itself a comparison")
