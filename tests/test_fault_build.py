"""scripts/run-with-fault.sh: the regular cases run on a torch_xla that carries one of the job's
faults (cases/faults.py) in every process that imports it, and go red naming it (docs/training-job.md)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from tests.conftest import REPO

# Found, not imported: the pytest process never imports torch_xla.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="the fault is put into torch_xla: needs torch_xla installed"
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "run-with-fault.sh"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_regular_case_goes_red_on_a_build_that_stopped_rematerializing(tmp_path):
    result = _run(
        "checkpoint-without-remat",
        "-m",
        "spmd",
        "cases/test_training_job.py::test_the_job_trains_like_the_cpu_reference[fsdp]",
        "-p",
        "no:cacheprovider",
        f"--spmd-results-dir={tmp_path}",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert failed and "activation checkpoint" in failed[0], result.stdout
    assert "the checkpoint wrapper no longer rematerializes" in result.stdout


def test_an_unknown_fault_is_refused_naming_the_known_ones():
    result = _run("no-such-fault", "-m", "spmd")
    assert result.returncode == 2
    assert "unknown fault 'no-such-fault'" in result.stderr
    assert _run().stderr.count("checkpoint-without-remat") == 1
