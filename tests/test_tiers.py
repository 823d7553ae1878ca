"""The two tiers (docs/tiers.md): a `nightly` case is skipped in the PR tier, naming how to run it,
and runs in the nightly tier; the tier reaches the case as `spmd.tier` and the header names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_the_header_names_a_job_size_other_than_tiny(pytester, monkeypatch):
    pytester.makepyfile(test_tiers=CASES)
    monkeypatch.setenv("SPMD_JOB_SIZE", "medium")
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "-s")
    result.stdout.fnmatch_lines(["spmd harness *: backend fake, 4 devices, pr tier, medium job; *"])


def test_an_unknown_tier_is_a_usage_error(pytester):
    pytester.makepyfile(test_tiers=CASES)
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-tier=weekly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-tier*weekly*"])


# --spmd-job-size: the training job's decoder. Its cases carry a size other than tiny in their ids,
# so the baselines (which hold the tiny job) have no entry for them and a base run compares like with like.
JOB_CASES = "cases/test_training_job.py"


def _collected(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", JOB_CASES, *args],
        cwd=root,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_job_cases_carry_a_larger_size_in_their_ids():
    plain = _collected().stdout
    assert "test_the_job_trains_like_the_cpu_reference[fsdp]" in plain and "job-" not in plain
    for sized in (_collected("--spmd-job-size=small").stdout, _collected(env={"SPMD_JOB_SIZE": "small"}).stdout):
        assert "test_the_job_trains_like_the_cpu_reference[job-small-fsdp]" in sized
        assert "test_the_job_with_adafactor_and_a_minibatch_loader_trains_like_the_cpu_reference[job-small]" in sized
        # the self-tests and the other job files keep the tiny job: their ids do not change
        assert "test_the_job_fails_naming_a_fault_put_back_into_torch_xla[checkpoint-without-remat]" in sized


def test_an_unknown_job_size_is_a_usage_error():
    result = _collected("--spmd-job-size=huge")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "huge" in result.stderr and "'tiny', 'small', 'medium'" in result.stderr
    bad_env = _collected(env={"SPMD_JOB_SIZE": "huge"})
    assert bad_env.returncode != 0 and "SPMD_JOB_SIZE" in bad_env.stdout + bad_env.stderr, (
        bad_env.stdout + bad_env.stderr
    )


def test_the_sizes_the_option_takes_are_the_sizes_the_cases_know():
    from cases import jobsize
    from harness.config.options import JOB_SIZES

    assert tuple(jobsize.SIZES) == JOB_SIZES and jobsize.DEFAULT == JOB_SIZES[0]


FOREIGN = """
import pytest

@pytest.fixture
def spmd_job_size():
    return "theirs"

def test_their_fixture(spmd_job_size):
    assert spmd_job_size == "theirs"

@pytest.mark.parametrize("spmd_job_size", ["a", "b"])
def test_their_parametrization(spmd_job_size):
    assert spmd_job_size in ("a", "b")
"""


def test_a_suite_with_its_own_spmd_job_size_keeps_it(pytester, monkeypatch):
    """Only the plugin's own fixture is parametrized with the run's size: a suite's fixture or
    parametrization of that name is left as written (it was replaced, or collection failed on a
    duplicate parametrization)."""
    pytester.makepyfile(test_foreign=FOREIGN)
    monkeypatch.setenv("SPMD_JOB_SIZE", "small")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.no_fnmatch_line("*job-small*")


SIZED = """
import pytest

@pytest.mark.spmd
@pytest.mark.needs(xla=False)
def test_sized(spmd, spmd_job_size):
    print("SIZE", spmd_job_size)
"""
SETS_THE_SIZE_AT_IMPORT = """
import os
os.environ["SPMD_JOB_SIZE"] = "medium"

def test_nothing():
    pass
"""


def test_the_size_is_read_once_and_a_module_cannot_change_it(pytester, monkeypatch):
    pytester.makepyfile(test_a_sets=SETS_THE_SIZE_AT_IMPORT, test_b_sized=SIZED)
    monkeypatch.delenv("SPMD_JOB_SIZE", raising=False)
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "-s", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["test_b_sized.py::test_sized SIZE tiny*"])
    result.stdout.no_fnmatch_line("*job-medium*")


def test_a_sized_id_is_told_from_the_default_one():
    from harness.config import jobsize

    assert jobsize.size_in_id("c.py::t[job-small-fsdp]") == "small"
    assert jobsize.size_in_id("c.py::t[fsdp]") is None
    assert jobsize.plain_id("c.py::t[job-small-fsdp]") == "c.py::t[fsdp]"
    assert jobsize.plain_id("c.py::t[job-medium]") == "c.py::t"
    assert jobsize.plain_id("c.py::t[job-huge-fsdp]") == "c.py::t[job-huge-fsdp]"  # not a size: not ours


def test_a_base_of_another_job_size_is_named_with_what_to_do():
    from harness.judges.basecompare import _other_job_size

    records = {"c.py::t[fsdp]": object(), "c.py::u[job-small]": object()}
    assert _other_job_size("c.py::t[job-small-fsdp]", records) == (
        ": the base ran the training job at size tiny (c.py::t[fsdp]), this run at small; "
        "run the base with --spmd-job-size=small"
    )
    assert "at size small (c.py::u[job-small]), this run at tiny" in _other_job_size("c.py::u", records)
    assert _other_job_size("c.py::v[job-small]", records) == ""
