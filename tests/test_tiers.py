"""The two tiers (docs/tiers.md): a `nightly` case is skipped in the PR tier, naming how to run it,
and runs in the nightly tier; the tier reaches the case as `spmd.tier` and the header names it."""

from __future__ import annotations

import pytest

CASES = """
import pytest

def body_steps(ctx, steps):
    ctx.record("steps", steps)

@pytest.mark.spmd
@pytest.mark.needs(xla=False)
def test_sized(spmd):
    result = spmd.run(body_steps, steps=20 if spmd.tier == "nightly" else 5)
    assert result.values["steps"] == (20 if spmd.tier == "nightly" else 5)
    print("TIER", spmd.tier, result.values["steps"])

@pytest.mark.spmd
@pytest.mark.nightly
@pytest.mark.needs(xla=False)
def test_nightly_only(spmd):
    spmd.run(body_steps, steps=1)
"""


def test_the_pr_tier_skips_nightly_cases_naming_the_option(pytester):
    pytester.makepyfile(test_tiers=CASES)
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "-rs", "-s")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "spmd harness *: backend fake, 4 devices, pr tier; *",
            "*TIER pr 5",
            "SKIPPED ?1? test_tiers.py:*: nightly tier only: run with --spmd-tier=nightly*",
        ]
    )


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_nightly_tier_runs_everything_at_its_size(pytester, monkeypatch, how):
    pytester.makepyfile(test_tiers=CASES)
    args = ["--spmd-backend=fake", "-p", "no:cacheprovider", "-s"]
    if how == "option":
        args.append("--spmd-tier=nightly")
    else:
        monkeypatch.setenv("SPMD_TIER", "nightly")
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["spmd harness *: backend fake, 4 devices, nightly tier; *", "*TIER nightly 20"])


def test_an_unknown_tier_is_a_usage_error(pytester):
    pytester.makepyfile(test_tiers=CASES)
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-tier=weekly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-tier*weekly*"])
