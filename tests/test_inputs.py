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

from tests.conftest import REPO

pytestmark = pytest.mark.selftest


# --------------------------------------------------------------------------------------------
# Item 4: a malformed registry (--spmd-known-bugs=PATH points the plugin at a registry file)
# --------------------------------------------------------------------------------------------

ENTRY = """
[[bug]]
id = "list-spec"
title = "a list spec is unhashable"
upstream_issue = "pytorch/xla#8522"
status = "open"
carried_by = ">=2.4"
signatures = ["TypeError: unhashable type: 'list'"]
"""

JUDGED_CASE = """
import pytest
pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_unrelated(ctx):
    raise RuntimeError("an unrelated failure")

@pytest.mark.known_bug("list-spec")
def test_judged(spmd):
    spmd.run(body_unrelated)
"""


def run_with_registry(pytester, monkeypatch, registry: str, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.6.0")  # a release the entry carries
    pytester.makepyfile(test_judged=JUDGED_CASE)
    (pytester.path / "bugs.toml").write_text(registry)
    return pytester.runpytest_subprocess(
        "--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-known-bugs=bugs.toml", *args, timeout=120
    )


def assert_refused_before_any_case(result: pytest.RunResult, pytester, *fragments: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    message = result.stderr.str()
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert "INTERNALERROR" not in message + result.stdout.str()
    assert not list((pytester.path / "results").glob("verdicts-*.jsonl")), "a case ran"


def test_a_well_formed_registry_judges_the_case(pytester, monkeypatch):
    # The control for the tests below: the same case and entry, a sound file.
    result = run_with_registry(pytester, monkeypatch, ENTRY, "-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*carries list-spec, but this failure matches none of its signatures*"])


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_signatures_written_as_a_string_are_refused_not_matched_letter_by_letter(pytester, monkeypatch, xdist):
    # Before: each letter of the string was a signature, 'T' matched "RuntimeError" and the run exited 0.
    registry = ENTRY.replace("signatures = [\"TypeError: unhashable type: 'list'\"]", 'signatures = "TypeError"')
    result = run_with_registry(pytester, monkeypatch, registry, *xdist)
    assert_refused_before_any_case(
        result, pytester, "bugs.toml", "'list-spec'", "signatures", 'signatures = ["TypeError"]'
    )


@pytest.mark.parametrize(
    "registry, fragments",
    [
        # A regex that does not compile names the pattern and the regex error.
        pytest.param(
            ENTRY.replace("signatures = [", 'signatures = ["ok", "Check failed: (", '),
            ["'list-spec'", "signatures[1]", '"Check failed: ("', "not a regular expression"],
            id="bad-regex",
        ),
        # A TOML syntax error names the line.
        pytest.param(
            ENTRY.replace('status = "open"', 'status = "open'),
            ["bugs.toml", "not valid TOML", "line"],
            id="toml-syntax",
        ),
        # carried_by written as a number.
        pytest.param(
            ENTRY.replace('carried_by = ">=2.4"', "carried_by = 2.6"),
            ["'list-spec'", "carried_by", "2.6", 'carried_by = "<2.7"'],
            id="carried-by-number",
        ),
        # carried_by a string that is not a specifier set.
        pytest.param(
            ENTRY.replace('carried_by = ">=2.4"', 'carried_by = "2.6 or later"'),
            ["'list-spec'", "carried_by", "PEP 440 specifier set"],
            id="carried-by-words",
        ),
        # status outside the allowed values.
        pytest.param(
            ENTRY.replace('status = "open"', 'status = "closed"'),
            ["'list-spec'", "status", "'fixed', 'open' or 'not-reproduced'"],
            id="status",
        ),
        # A misspelt key is refused with the closest known key.
        pytest.param(
            ENTRY.replace("upstream_issue", "upstream_isue"),
            ["'list-spec'", "'upstream_isue'", "did you mean 'upstream_issue'"],
            id="unknown-key",
        ),
        # A required field missing.
        pytest.param(
            ENTRY.replace('title = "a list spec is unhashable"\n', ""), ["'list-spec'", "title"], id="no-title"
        ),
        # An empty signature would match every failure.
        pytest.param(
            ENTRY.replace("signatures = [", 'signatures = ["", '),
            ["'list-spec'", "signatures[0]", "empty"],
            id="empty-signature",
        ),
    ],
)
def test_a_malformed_registry_is_a_usage_error_naming_file_entry_and_field(pytester, monkeypatch, registry, fragments):
    result = run_with_registry(pytester, monkeypatch, registry)
    assert_refused_before_any_case(result, pytester, "bugs.toml", *fragments)


def test_a_malformed_registry_is_refused_by_the_controller_under_xdist(pytester, monkeypatch):
    result = run_with_registry(pytester, monkeypatch, ENTRY.replace("signatures = [", 'signatures = ["(", '), "-n", "2")
    assert_refused_before_any_case(result, pytester, "bugs.toml", "'list-spec'", "signatures[0]")


# --------------------------------------------------------------------------------------------
# Item 8: baselines
# --------------------------------------------------------------------------------------------

RECORDING_CASE = """
import pytest
pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_records(ctx):
    ctx.record_sharding("w", "{devices=[4,1]0,1,2,3}")

def test_block(spmd):
    spmd.run(body_records)
"""
GOOD_BASELINE = {
    "backend": "fake",
    "devices": 4,
    "torch_xla": "2.9.0",
    "cases": {"test_block.py::test_block": {"w": "{devices=[4,1]0,1,2,3}"}},
}


def run_with_baseline(pytester, monkeypatch, baseline: dict | str, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    pytester.makepyfile(test_block=RECORDING_CASE)
    text = baseline if isinstance(baseline, str) else json.dumps(baseline)
    (pytester.path / "baseline.json").write_text(text)
    return pytester.runpytest_subprocess(
        "--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-shardings-baseline=baseline.json", *args, timeout=120
    )


def test_a_matching_baseline_is_used(pytester, monkeypatch):
    run_with_baseline(pytester, monkeypatch, GOOD_BASELINE).assert_outcomes(passed=1)


def test_a_truncated_baseline_under_xdist_is_a_usage_error_naming_the_file(pytester, monkeypatch):
    result = run_with_baseline(pytester, monkeypatch, json.dumps(GOOD_BASELINE)[:40], "-n", "2")
    assert_refused_before_any_case(result, pytester, "baseline.json", "not valid JSON", "--spmd-update-shardings")


@pytest.mark.parametrize(
    "change, fragments",
    [
        # Taken on another backend: its shardings say nothing about this one.
        pytest.param(
            {"backend": "cpu"},
            [
                "backend",
                "'cpu'",
                "this run uses backend fake with 4 devices",
                "--spmd-shardings-baseline",
                "--spmd-update-shardings",
            ],
            id="other-backend",
        ),
        # Taken with another device count.
        pytest.param({"devices": 8}, ["devices", "8", "this run uses backend fake with 4 devices"], id="other-devices"),
        # A torch_xla version that is not PEP 440 would switch the drift check off.
        pytest.param({"torch_xla": "nightly-latest"}, ["torch_xla", "'nightly-latest'", "PEP 440"], id="version"),
        # Fields of the wrong type name the case and the tensor.
        pytest.param(
            {"cases": {"test_block.py::test_block": {"w": 4}}},
            ["'test_block.py::test_block'", "'w'", "sharding text"],
            id="tensor-not-text",
        ),
        pytest.param({"devices": "4"}, ["devices", "whole number"], id="devices-text"),
        # A misspelt key is refused with the closest known one.
        pytest.param({"torch-xla": "2.9.0"}, ["'torch-xla'", "did you mean 'torch_xla'"], id="unknown-key"),
    ],
)
def test_a_baseline_that_does_not_fit_this_run_is_refused(pytester, monkeypatch, change, fragments):
    result = run_with_baseline(pytester, monkeypatch, {**GOOD_BASELINE, **change})
    assert_refused_before_any_case(result, pytester, "baseline.json", *fragments)


def test_a_baseline_of_another_device_count_is_refused_by_the_controller_under_xdist(pytester, monkeypatch):
    result = run_with_baseline(pytester, monkeypatch, {**GOOD_BASELINE, "devices": 8}, "-n", "2")
    assert_refused_before_any_case(result, pytester, "baseline.json", "devices")


# --------------------------------------------------------------------------------------------
# Item 9: damaged results and odd numbers
# --------------------------------------------------------------------------------------------

RECORD = {
    "nodeid": "cases/test_scalar_specs.py::test_wrap",
    "family": "scalar_specs",
    "outcome": "passed",
    "known_bug": "fsdpv2-scalar-param-spec",
    "known_bugs": ["fsdpv2-scalar-param-spec"],
    "registry_verdict": "passed",
    "torch_xla": "2.9.0",
    "backend": "cpu",
    "devices": 4,
}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )


def results_folder(path: Path, *lines: str) -> Path:
    path.mkdir(parents=True)
    (path / "verdicts-main.jsonl").write_text("".join(line + "\n" for line in lines))
    return path


def test_compare_on_a_verdicts_file_cut_by_a_crash_does_not_exit_1(tmp_path: Path):
    good = results_folder(tmp_path / "good", json.dumps(RECORD))
    # The last line was cut mid-write.
    bad = results_folder(tmp_path / "bad", json.dumps(RECORD), json.dumps({**RECORD, "nodeid": "x::y"})[:30])
    proc = cli(
        "-m",
        "harness.matrix",
        "compare",
        "--good",
        str(good),
        "--bad",
        str(bad),
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 125, proc.stderr  # git bisect run: skip this commit, it could not be judged
    assert f"{bad / 'verdicts-main.jsonl'}:2" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "damaged",
    [
        pytest.param({**RECORD, "outcome": 5}, id="outcome-not-text"),
        pytest.param({**RECORD, "family": 7}, id="family-not-text"),
        pytest.param({k: v for k, v in RECORD.items() if k != "nodeid"}, id="no-nodeid"),
        pytest.param({**RECORD, "reason": ["a", "list"]}, id="reason-a-list"),
        pytest.param({**RECORD, "shardings": ["w"]}, id="shardings-a-list"),
        pytest.param({**RECORD, "devices": "four"}, id="devices-text"),
        pytest.param([1, 2], id="a-list"),
        pytest.param("a string", id="a-string"),
        pytest.param({"amends": RECORD["nodeid"], "late_fault": 3}, id="amendment-not-text"),
    ],
)
def test_the_report_names_and_counts_a_record_of_the_wrong_shape(tmp_path: Path, damaged):
    folder = results_folder(tmp_path / "results", json.dumps({**RECORD, "outcome": "failed"}), json.dumps(damaged))
    proc = cli("-m", "harness.report", str(folder), cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr  # the readable record is a failed case
    assert "verdicts-main.jsonl:2" in proc.stderr
    summary = (folder / "summary.md").read_text()
    assert "1 unreadable record line(s): verdicts-main.jsonl:2" in summary
    assert "**Totals:** 1 cases" in summary


def test_the_matrix_counts_damaged_lines_of_a_results_column_as_a_problem(tmp_path: Path):
    folder = results_folder(tmp_path / "results", json.dumps(RECORD), json.dumps({**RECORD, "outcome": None}))
    proc = cli(
        "-m",
        "harness.matrix",
        "--results",
        f"2.9.0={folder}",
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"1 damaged record line(s): {folder / 'verdicts-main.jsonl'}:2" in proc.stdout + proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "soon"])
def test_the_matrix_refuses_a_suite_timeout_that_is_not_a_positive_finite_number(tmp_path: Path, value):
    # A results column: nothing would be built or run if the value were (wrongly) accepted.
    folder = results_folder(tmp_path / "results", json.dumps(RECORD))
    proc = cli(
        "-m",
        "harness.matrix",
        "--results",
        f"2.9.0={folder}",
        f"--suite-timeout={value}",
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"--suite-timeout: {value!r} is not a positive, finite number of seconds" in proc.stderr


def test_pytest_says_in_plain_words_what_a_case_timeout_must_be(pytester):
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-case-timeout=nan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-case-timeout: 'nan' is not a positive, finite number of seconds*"])
    assert "_positive" not in result.stderr.str()
