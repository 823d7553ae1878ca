"""What a maintainer meets on the way (black-box pytest runs on the fake backend): selecting the
cases of one bug, a misspelt known_bug id said once, results anchored at the project root
wherever pytest starts, a hint when no case was collected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_results_folder import run

pytestmark = pytest.mark.selftest

BUGS = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    pass

@pytest.mark.known_bug("mark-sharding-list-spec")
@pytest.mark.parametrize("n", [1, 2])
def test_list_spec(spmd, n):
    spmd.run(body)

@pytest.mark.known_bug("fsdpv2-params-left-replicated")
def test_replicated(spmd):
    spmd.run(body)

def test_unmarked(spmd):
    spmd.run(body)
"""

MISSPELT = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

@pytest.mark.known_bug("mark-sharding-lst-spec")
@pytest.mark.parametrize("n", range(6))
def test_list_spec(spmd, n):
    pass
"""


def test_spmd_bug_selects_the_cases_of_one_registry_entry(pytester: pytest.Pytester):
    pytester.makepyfile(test_bugs=BUGS)
    result = run(pytester, "--spmd-bug=mark-sharding-list-spec", "-v")
    result.stdout.fnmatch_lines(["*collected 4 items / 2 deselected / 2 selected*"])
    assert "test_list_spec[1]" in result.stdout.str() and "test_replicated" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.OK


def test_spmd_bug_with_an_id_the_registry_lacks_is_refused_under_xdist_too(pytester: pytest.Pytester):
    """Checked before xdist's workers start: a worker's refusal at collection was an INTERNALERROR (exit 3)."""
    pytester.makepyfile(test_bugs=BUGS)
    result = run(pytester, "-n", "2", "--spmd-bug=../../etc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    assert "--spmd-bug=../../etc: no known-bug entry" in result.stderr.str()
    assert not (pytester.path / "results").exists()


def test_spmd_bug_with_an_id_the_registry_lacks_is_refused_with_the_closest(pytester: pytest.Pytester):
    pytester.makepyfile(test_bugs=BUGS)
    result = run(pytester, "--spmd-bug=mark-sharding-lst-spec")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--spmd-bug=mark-sharding-lst-spec: no known-bug entry" in result.stderr.str()
    assert "did you mean mark-sharding-list-spec" in result.stderr.str()  # the closest first


def test_a_misspelt_known_bug_id_is_reported_once_for_all_its_parametrised_cases(pytester: pytest.Pytester):
    pytester.makepyfile(test_bugs=MISSPELT)
    result = run(pytester, "-m", "spmd")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    error = result.stderr.str()
    assert error.count("no known-bug entry 'mark-sharding-lst-spec'") == 1, error
    assert (
        "test_bugs.py::test_list_spec[0], test_bugs.py::test_list_spec[1], test_bugs.py::test_list_spec[2] and 3 more"
        in error
    )


def test_results_land_at_the_project_root_wherever_pytest_starts(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\n")
    cases = pytester.mkdir("cases")
    (cases / "test_sub.py").write_text(BUGS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider", "test_sub.py"],
        cwd=cases,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (cases / "results").exists()
    assert (pytester.path / "results" / "latest").is_dir()
    assert f"results {pytester.path / 'results'}/run-" in done.stdout


def test_no_case_collected_gives_a_hint_and_leaves_no_results_folder(pytester: pytest.Pytester):
    elsewhere = pytester.mkdir("elsewhere")
    pytester.chdir()
    os.chdir(elsewhere)
    result = run(pytester, "-m", "spmd", "--spmd-fork-server=on")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["spmd harness: no SPMD case was collected under *; the cases live in *"])
    assert not (Path.cwd() / "results").exists(), sorted(p.name for p in Path.cwd().rglob("*"))


LONG_REASON = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    raise AssertionError("step0: compiles 1 -> 4, executions 1 -> 4 " + "x" * 80 + " END-OF-REASON")

def test_long(spmd):
    spmd.run(body)
"""


def test_piped_failed_lines_lead_with_their_cause_within_120_columns(pytester: pytest.Pytester, monkeypatch):
    pytester.makepyfile(test_long=LONG_REASON)
    monkeypatch.delenv("CI", raising=False)  # pytest prints whole lines on CI anyway
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    result = run(pytester, "-m", "spmd")  # pytester's output is a pipe, as `pytest | tee` is
    result.assert_outcomes(failed=1)
    (line,) = [line for line in result.stdout.lines if line.startswith("FAILED test_long.py::test_long - ")]
    assert "step0: compiles 1 -> 4" in line and len(line) <= 120 and line.endswith("..."), line
    assert "END-OF-REASON" in result.stdout.str()  # whole in the failure above the summary
    # the findings, before the short summary, read the whole message, not the FAILED line's cut
    result.stdout.fnmatch_lines(
        ["  e.g. test_long.py::test_long: *step0: compiles 1 -> 4, executions 1 -> 4 " + "x" * 40 + "*"]
    )


CONTROL_REASON = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    raise AssertionError("boom \\x1b[2J\\x1b[31m cleared END-OF-REASON")

def test_control(spmd):
    spmd.run(body)
"""


def test_piped_failed_lines_escape_the_control_characters_of_the_reason(pytester: pytest.Pytester, monkeypatch):
    """The whole reason is the code under test's text: it cannot clear the screen or colour the log."""
    pytester.makepyfile(test_control=CONTROL_REASON)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    result = run(pytester, "-m", "spmd")
    result.assert_outcomes(failed=1)
    failed = [line for line in result.stdout.lines if line.startswith("FAILED test_control.py")]
    assert failed and "\x1b" not in failed[0], failed
    assert "\\x1b[2J" in failed[0] and "END-OF-REASON" in failed[0], failed


def test_an_option_value_pytest_takes_for_a_test_path_is_refused(pytester: pytest.Pytester, tmp_path_factory):
    """`--spmd-results-dir /elsewhere` (two words) names an existing folder outside the project:
    pytest chose that folder as its rootdir, without the project's ini file, before it knew the
    option, and the baseline checks ran against a baselines/ that is not the project's (0 held).
    The `=` form is read after rootdir selection and holds the cases to the project's baseline."""
    pytester.makepyfile(test_bugs=BUGS)
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nmarkers = ["selftest: x"]\n')
    elsewhere = tmp_path_factory.mktemp("results-elsewhere")
    refused = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--spmd-backend", "fake", "--spmd-results-dir", str(elsewhere), timeout=120
    )
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        [
            f"*--spmd-results-dir {elsewhere}: pytest took {elsewhere} for a test path*Write --spmd-results-dir={elsewhere}"
        ]
    )
    assert not list(elsewhere.iterdir()), "a refused run wrote into the folder"
    accepted = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--spmd-backend=fake", f"--spmd-results-dir={elsewhere}", timeout=120
    )
    accepted.assert_outcomes(passed=4)
    (pytester.path / "results").mkdir(exist_ok=True)
    inside = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--spmd-backend", "fake", "--spmd-results-dir", "results", timeout=120
    )
    inside.assert_outcomes(passed=4)  # a folder inside the project: pytest still finds its ini file
