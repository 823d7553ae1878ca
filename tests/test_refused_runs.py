"""A run refused before any case (a base run that cannot judge, a registry that does not parse, a
known_bug id the registry lacks: pytest usage errors, exit 4) leaves no run folder behind and
never moves `latest`: `spmd-report results` and `spmd-replay` still see the previous real run.
Black-box pytest runs on the fake backend, with the fork servers on so the run folder is made
before pytest reads the options (as a `pytest -m spmd` on the cpu backend does)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.test_results_folder import CASES, run

pytestmark = pytest.mark.selftest

UNKNOWN_ID = """
import pytest

@pytest.mark.spmd
@pytest.mark.known_bug("no-such-entry")
def test_named(spmd):
    pass
"""

REFUSALS = {
    "bad-comparison": (["--spmd-compare=nowhere"], "--spmd-compare="),
    "registry-does-not-parse": (["--spmd-known-bugs=broken.toml"], "known-bug registry"),
    "unknown-known-bug-id": (["test_unknown.py"], "no-such-entry"),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_refused_run_leaves_no_run_folder_and_latest_keeps_the_real_run(pytester: pytest.Pytester, refusal):
    pytester.makepyfile(test_cases=CASES, test_unknown=UNKNOWN_ID)
    (pytester.path / "broken.toml").write_text("[[bug]\nid = \n")
    first = run(pytester, "-m", "spmd", "--spmd-fork-server=on", "test_cases.py")
    first.assert_outcomes(passed=1, skipped=1)
    results = pytester.path / "results"
    real = os.readlink(results / "latest")
    args, named = REFUSALS[refusal]
    refused = run(
        pytester, "-m", "spmd", "--spmd-fork-server=on", *(args if "test_" in args[0] else ["test_cases.py", *args])
    )
    assert refused.ret == pytest.ExitCode.USAGE_ERROR, refused.stdout.str() + refused.stderr.str()
    assert named in refused.stderr.str() + refused.stdout.str()
    assert sorted(p.name for p in results.glob("run-*")) == [real]
    assert os.readlink(results / "latest") == real
    report = pytester.run(sys.executable, "-m", "harness.report", "results")
    assert report.ret == 0, report.stdout.str() + report.stderr.str()
    report.stdout.fnmatch_lines([f"harness.report *{real}: 2 cases: 1 passed, 0 failed, 0 xfailed, 1 skipped"])
    replay = pytester.run(
        sys.executable, "-m", "harness.replay", "--results-dir=results", "--case", "test_ok", "--print-commands"
    )
    assert replay.ret == 0, replay.stdout.str() + replay.stderr.str()


def test_a_refused_first_run_leaves_no_results_folder_content(pytester: pytest.Pytester):
    pytester.makepyfile(test_cases=CASES)
    refused = run(pytester, "-m", "spmd", "--spmd-fork-server=on", "--spmd-compare=nowhere")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    results = pytester.path / "results"
    assert not list(results.glob("run-*")) and not os.path.lexists(results / "latest")
