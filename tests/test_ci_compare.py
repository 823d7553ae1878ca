"""scripts/ci-spmd.sh --base-wheels: the base build's run first, in a venv of its own, then the
PR's run compared with that exact run folder (stub pytest venvs, as tests/test_workflows.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_workflows import PASSED_CASE, executable, hermetic_env, jsonl, run_ci_script, stub_venv  # noqa: F401 (a fixture)

pytestmark = pytest.mark.selftest


@pytest.fixture
def base_venv(stub_venv: Path, tmp_path: Path) -> Path:  # noqa: F811 (the fixture imported above)
    """VENV-base, whose pytest records its arguments in a file of its own."""
    base = stub_venv.with_name(stub_venv.name + "-base")
    shutil.copytree(stub_venv, base)
    (base / "bin" / "pytest").rename(base / "bin" / "stub-pytest")
    executable(
        base / "bin" / "pytest",
        f'#!/bin/sh\nSTUB_ARGV_FILE="{tmp_path / "base-argv.json"}" exec "{base / "bin" / "stub-pytest"}" "$@"\n',
    )
    return base


def test_the_pr_run_is_compared_with_the_base_run_it_just_made(stub_venv, base_venv, tmp_path):  # noqa: F811
    results, summary = tmp_path / "results", tmp_path / "step-summary.md"
    (tmp_path / "base-wheels").mkdir()
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), GITHUB_STEP_SUMMARY=str(summary))
    proc = run_ci_script(
        stub_venv, env, "--skip-install", "--base-wheels", str(tmp_path / "base-wheels"), "--results-dir", str(results)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base_argv = json.loads((tmp_path / "base-argv.json").read_text())
    pr_argv = json.loads((tmp_path / "argv.json").read_text())
    assert f"--spmd-results-dir={results / 'base'}" in base_argv
    assert not any(a.startswith("--spmd-compare") for a in base_argv)
    (base_run,) = (results / "base").glob("run-*")
    assert f"--spmd-compare={base_run}" in pr_argv and f"--spmd-results-dir={results}" in pr_argv
    text = summary.read_text()
    assert text.index("## SPMD regression results: base build") < text.index("## SPMD regression results\n")


def test_a_base_run_that_did_not_finish_stops_the_job_before_the_pr_run(stub_venv, base_venv, tmp_path):  # noqa: F811
    (tmp_path / "base-wheels").mkdir()
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), STUB_EXIT="3")
    proc = run_ci_script(
        stub_venv,
        env,
        "--skip-install",
        "--base-wheels",
        str(tmp_path / "base-wheels"),
        "--results-dir",
        str(tmp_path / "r"),
    )
    assert proc.returncode == 2
    assert "the base build's suite ended with pytest exit 3: nothing to compare with" in proc.stderr
    assert not (tmp_path / "argv.json").exists(), "the PR's suite ran without a base to compare with"


def test_a_missing_base_wheels_folder_is_refused_before_anything_runs(stub_venv, tmp_path):  # noqa: F811
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path), "--skip-install", "--base-wheels", str(tmp_path / "none"))
    assert proc.returncode == 2 and "--base-wheels" in proc.stderr and "no such folder" in proc.stderr
