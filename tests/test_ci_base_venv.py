"""scripts/ci-spmd.sh --base-venv: two existing virtualenvs compared (the base build's and the PR's),
no wheel folder, nothing installed (stub pytest venvs, as tests/test_workflows.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_workflows import PASSED_CASE, executable, hermetic_env, jsonl, run_ci_script, stub_venv  # noqa: F401 (a fixture)

pytestmark = pytest.mark.selftest


def test_two_existing_venvs_are_compared(stub_venv, tmp_path):  # noqa: F811 (the fixture imported above)
    base = tmp_path / "xla-base-venv"  # any folder: not <venv>-base
    shutil.copytree(stub_venv, base)
    (base / "bin" / "pytest").rename(base / "bin" / "stub-pytest")
    executable(
        base / "bin" / "pytest",
        f'#!/bin/sh\nSTUB_ARGV_FILE="{tmp_path / "base-argv.json"}" exec "{base / "bin" / "stub-pytest"}" "$@"\n',
    )
    results = tmp_path / "results"
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE))
    proc = run_ci_script(stub_venv, env, "--skip-install", "--base-venv", str(base), "--results-dir", str(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--spmd-results-dir={results / 'base'}" in json.loads((tmp_path / "base-argv.json").read_text())
    (base_run,) = (results / "base").glob("run-*")
    assert f"--spmd-compare={base_run}" in json.loads((tmp_path / "argv.json").read_text())


def test_a_base_venv_that_is_no_venv_is_refused_before_anything_runs(stub_venv, tmp_path: Path):  # noqa: F811
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path), "--skip-install", "--base-venv", str(tmp_path))
    assert proc.returncode == 2 and "--base-venv" in proc.stderr and "no virtualenv there" in proc.stderr
