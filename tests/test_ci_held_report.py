"""scripts/ci-spmd.sh without --report-later reports with code loaded before any case ran (#51 item
3): a case body that rewrites harness/report.py in the checkout (it runs as the same user) cannot
make the job green. Run on a copy of the checkout, with a stub pytest whose "case" does the rewrite
(as tests/test_workflows.py's stubs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_workflows import FAILED_CASE, PASSED_CASE, executable, hermetic_env, jsonl

pytestmark = pytest.mark.selftest

FORGED_REPORT = """
import os
def main(argv=None):
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as fh:
            fh.write("failed=0\\nregressed=0\\n")
    print("::add-mask::the-token")
    print("::notice title=SPMD regression::all green")
    return 0
if __name__ == "__main__":
    raise SystemExit(main())
"""

# The venv's pytest: writes the run as the plugin would (a failed case, exit 1), and, as a case body
# can, rewrites the checkout's harness/report.py and drops its bytecode.
REWRITING_PYTEST = """#!{python}
import json, os, pathlib, shutil, sys
from harness.records.runfolder import RunFolder
args = sys.argv[1:]
results = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-results-dir=")))
run = RunFolder.new(results, next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-run-id=")))
(run.claim() / "verdicts-gw0.jsonl").write_text(os.environ["STUB_RECORDS"])
pathlib.Path("harness/report.py").write_text(os.environ["FORGED_REPORT"])
shutil.rmtree("harness/__pycache__", ignore_errors=True)
run.finish(1, {{"failed": 1}}, [json.loads(os.environ["STUB_RECORDS"])["nodeid"]], None)
sys.exit(1)
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the repository's harness and scripts: the cases' own checkout, theirs to rewrite."""
    copy = tmp_path / "checkout"
    for folder in ("harness", "scripts"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_case_that_rewrites_the_report_cannot_make_the_ci_job_green(checkout: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "pytest", REWRITING_PYTEST.format(python=sys.executable))
    executable(venv / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    outputs, summary = tmp_path / "github-output", tmp_path / "step-summary.md"
    env = hermetic_env(
        tmp_path,
        GITHUB_ACTIONS="true",
        GITHUB_OUTPUT=str(outputs),
        GITHUB_STEP_SUMMARY=str(summary),
        STUB_RECORDS=jsonl(FAILED_CASE),
        FORGED_REPORT=FORGED_REPORT,
    )
    proc = subprocess.run(
        ["bash", str(checkout / "scripts" / "ci-spmd.sh"), "--venv", str(venv), "--skip-install"]
        + ["--results-dir", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 1, shown
    assert "def main(argv=None):" in (checkout / "harness" / "report.py").read_text(), "the rewrite did not happen"
    lines = outputs.read_text().splitlines()
    assert "failed=0" not in lines and "failed=1" in lines, lines
    assert "::add-mask::" not in proc.stdout and "all green" not in proc.stdout, shown
    assert "::error title=SPMD regression%3A cases/test_scalar_specs.py%3A%3Atest_wrap[off]::spec lost" in proc.stdout
    assert "❌ failed" in summary.read_text()


# The venv's pytest: a passing run, whose "case" first kills the report process its script holds.
KILLING_PYTEST = """#!{python}
import os, pathlib, signal, sys
from harness.records.runfolder import RunFolder
script = os.getppid()
for entry in pathlib.Path("/proc").iterdir():
    try:
        held = entry.name.isdigit() and b"harness.heldreport" in (entry / "cmdline").read_bytes()
        if held and f" {{script}} " in (entry / "stat").read_text().split(")")[-1][:40]:
            os.kill(int(entry.name), signal.SIGKILL)
    except OSError:
        pass
args = sys.argv[1:]
results = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-results-dir=")))
run = RunFolder.new(results, next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-run-id=")))
(run.claim() / "verdicts-gw0.jsonl").write_text(os.environ["STUB_RECORDS"])
run.finish(0, {{"passed": 1}}, [], None)
"""


def test_a_killed_report_process_is_no_pass(checkout: Path, tmp_path: Path):
    """The held report is a process a case (as the same user) can kill: then nothing is reported,
    and the job fails saying why, though pytest passed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "pytest", KILLING_PYTEST.format(python=sys.executable))
    executable(venv / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    proc = subprocess.run(
        ["bash", str(checkout / "scripts" / "ci-spmd.sh"), "--venv", str(venv), "--skip-install"]
        + ["--results-dir", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        env=hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE)),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ended without reporting (killed?): not a pass" in proc.stderr
