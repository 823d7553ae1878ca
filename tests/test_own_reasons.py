"""Every reason the harness gives is the failure's own (black-box runs on the fake backend): a case
the registry passes but a baseline fails is reported with the drift, not with the registry's
"outside the carried_by"; a case that fails some other way in the PR's build is not "newly
failing" with a known bug whose signature it lacks."""

from __future__ import annotations

import json
import sys

import pytest

from tests.test_baseline import lit

pytestmark = pytest.mark.selftest

CASES = """
import os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_wraps(ctx, spec, error):
    ctx.record_sharding("w", spec)
    if error:
        raise ValueError(error)

@pytest.mark.known_bug("fsdpv2-scalar-param-spec")  # fixed from 2.7: a 2.9.0 or 2.10 build must pass
def test_wraps(spmd):
    spmd.run(body_wraps, spec=os.environ["CASE_SPEC"], error=os.environ.get("CASE_ERROR", ""))
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)

    def run(*args: str, version: str, spec: str = "{devices=[4,1]0,1,2,3}", error: str = "") -> pytest.RunResult:
        monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
        monkeypatch.setenv("CASE_SPEC", spec)
        monkeypatch.setenv("CASE_ERROR", error)
        return pytester.runpytest_subprocess(
            "--spmd-backend=fake",
            "-p",
            "no:cacheprovider",
            "--spmd-shardings-baseline=shardings.json",
            "--spmd-costs-baseline=costs.json",
            *args,
            timeout=120,
        )

    return run


def test_a_sharding_drift_is_reported_as_the_drift_not_as_the_registrys_pass(suite, pytester):
    suite("--spmd-update-shardings", version="2.9.0").assert_outcomes(passed=1)
    drift = suite("--spmd-results-dir=drift", version="2.9.0", spec="{devices=[1,4]0,1,2,3}")
    drift.assert_outcomes(failed=1)
    report = pytester.run(sys.executable, "-m", "harness.report", "drift")
    out = report.stdout.str()
    assert "outside the carried_by" not in out
    report.stdout.fnmatch_lines(["FAILED test_cases.py::test_wraps: *w*" + lit("{devices=[4,1]0,1,2,3}") + "*"])
    (run,) = (pytester.path / "drift").glob("run-*")
    assert "outside the carried\\_by" not in (run / "summary.md").read_text()


def test_another_failure_is_not_named_newly_failing_with_a_bug_it_does_not_show(suite, pytester):
    suite("--spmd-results-dir=base", version="2.10.0+git1111111").assert_outcomes(passed=1)
    result = suite("--spmd-compare=base", version="2.10.0+git2222222", error="shapes differ")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "newly failing in this build: fsdpv2-scalar-param-spec" not in out
    result.stdout.fnmatch_lines(
        ["fails in this build without the signature of fsdpv2-scalar-param-spec (test_cases.py::test_wraps: *"]
    )
    (run,) = (pytester.path / "results").glob("run-*")
    comparison = json.loads((run / "comparison.json").read_text())
    assert not any("newly failing" in line for line in comparison["registry"])
