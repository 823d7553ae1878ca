"""Trust at the edges (issue #18, items 4, 8, 9): the harness's inputs are checked before use.

The known-bug registry and the sharding baseline are refused at configure time, as a usage error
naming the file, the entry and the field, before any case runs (under -n 2 as well: in the
controller, not in a worker mid-run). A results folder is untrusted input to the report and the
release matrix: a damaged line or a record of the wrong shape is named and counted, never a
traceback. Every test here is a black-box run: pytest in a subprocess, or a CLI subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.selftest

REPO_ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Item 9: damaged results and odd numbers
# --------------------------------------------------------------------------------------------

RECORD = {"nodeid": "cases/test_scalar_specs.py::test_wrap", "family": "scalar_specs", "outcome": "passed",
          "known_bug": "fsdpv2-scalar-param-spec", "known_bugs": ["fsdpv2-scalar-param-spec"],
          "registry_verdict": "passed", "torch_xla": "2.9.0", "backend": "cpu", "devices": 4}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})


def results_folder(path: Path, *lines: str) -> Path:
    path.mkdir(parents=True)
    (path / "verdicts-main.jsonl").write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "soon"])
def test_the_matrix_refuses_a_suite_timeout_that_is_not_a_positive_finite_number(tmp_path: Path, value):
    # A results column: nothing would be built or run if the value were (wrongly) accepted.
    folder = results_folder(tmp_path / "results", json.dumps(RECORD))
    proc = cli("-m", "harness.matrix", "--results", f"2.9.0={folder}", f"--suite-timeout={value}", "--cache",
               str(tmp_path / "cache"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"--suite-timeout: {value!r} is not a positive, finite number of seconds" in proc.stderr


def test_pytest_says_in_plain_words_what_a_case_timeout_must_be(pytester):
    result = pytester.runpytest_subprocess("--backend=fake", "-p", "no:cacheprovider", "--case-timeout=nan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--case-timeout: 'nan' is not a positive, finite number of seconds*"])
    assert "_positive" not in result.stderr.str()
