"""harness.report against a results folder written by an attacker (#51 item 3): every field a case
body can write, one at a time, holding generated hostile text; a folder or link where the report
writes; text UTF-8 cannot hold; a run too big for GitHub's 1 MiB step summary.

What "survives" means here, checked on what the report wrote (never on how it wrote it):
the summary is valid UTF-8, has no HTML but its own `<br>`, no heading, table row or code span it
did not make; every line of its stdout is its own (a workflow command on one line, properties
escaped); $GITHUB_OUTPUT holds `name=integer` lines only, and failed is never 0.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import report
from harness.judges.basecompare import Comparison
from harness.records import escaping, runfolder
from harness.records.results import CaseRecord
from tests.conftest import only_run_folder, run_fake, spmd_report

pytestmark = pytest.mark.selftest

ATOMS = [
    "<!--",
    "-->",
    "<b>x</b>",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "::error::forged",
    "::add-mask::secret",
    "::stop-commands::tok",
    "##[error]forged",
    "\n",
    "\r\n",
    "\r",
    "\n# INJECTED\n",
    "\n| INJECTED | row |\n",
    "\n::error::INJECTED\n",
    "%0A::error::x",
    "%25",
    "%",
    "`",
    "```",
    "|",
    "\\",
    "*",
    "_",
    "[link](http://e.invalid)",
    "&lt;!--",
    ":",
    ",",
    "\ud800",
    "\udcff",
    "\udfff",
    "\x1b[31m",
    "\u2028",
    "\x85",
    "\x00",
    "é漢🙂",
]
hostile = st.lists(st.one_of(st.sampled_from(ATOMS), st.text(max_size=12)), min_size=1, max_size=8).map("".join)
LONG_REPEATS = 20_000  # a field of ~2 MB: the hostile text, padded to 100 characters, this many times

FAILED = "cases/test_a.py::test_fails"
PASSED = "cases/test_a.py::test_passes"
RUN_ID = "run-20260101-000000-p1"

RECORD_TEXTS = [
    "nodeid",
    "family",
    "outcome",
    "reason",
    "known_bug",
    "registry_verdict",
    "signature",
    "evidence",
    "torch_xla",
    "backend",
    "late_fault",
    "torch",
    "jax",
    "harness",
]
RECORD_LISTS = ["known_bugs", "sharding_changes", "cost_changes"]
MANIFEST_FIELDS = ["run_id", "host", "started", "counts key", "failed_ids", "problems", "argv"]
COMPARISON_FIELDS = ["base", "base_torch_xla", "this_torch_xla", "differ", "new", "not_compared", "registry", "moved"]
EVERY_FIELD = (
    [f"record.{f}" for f in RECORD_TEXTS + RECORD_LISTS + ["shardings"]]
    + [f"manifest.{f}" for f in MANIFEST_FIELDS]
    + [f"comparison.{f}" for f in COMPARISON_FIELDS]
    + ["amendment.late_fault"]
)


def write_run(folder: Path, field: str, text: str) -> Path:
    """A finished run with one failed and one passed case, `text` in `field` (one of EVERY_FIELD)."""
    run = folder / RUN_ID
    run.mkdir(parents=True)
    kind, _, name = field.partition(".")
    failed: dict[str, Any] = dataclasses.asdict(CaseRecord(FAILED, "a", "failed", reason="boom"))
    passed = dataclasses.asdict(CaseRecord(PASSED, "a", "passed"))
    manifest: dict[str, Any] = dataclasses.asdict(
        runfolder.Manifest(RUN_ID, 1, "host", "2026-01-01T00:00:00+00:00", ["pytest"], status="finished")
    )
    manifest.update(exitstatus=1, counts={"failed": 1, "passed": 1}, failed_ids=[FAILED])
    lines = []
    if kind == "record":
        failed[name] = [text] if name in RECORD_LISTS else {text: text} if name == "shardings" else text
        if name == "nodeid":
            manifest["failed_ids"] = [text]
    elif kind == "manifest":
        key = "counts" if name == "counts key" else name
        manifest[key] = {text: 1} if key == "counts" else [text] if key in ("failed_ids", "problems", "argv") else text
    elif kind == "amendment":
        lines.append(json.dumps({"amends": PASSED, "late_fault": text}))
    else:
        write_comparison(run, name, text)
    records = [json.dumps(failed), json.dumps(passed), *lines]
    (run / "verdicts-gw0.jsonl").write_text("".join(line + "\n" for line in records))
    (run / runfolder.MANIFEST_NAME).write_text(json.dumps(manifest))
    return run


def write_comparison(run: Path, name: str, text: str) -> None:
    values: dict[str, Any] = {
        "base": text,
        "base_torch_xla": text,
        "this_torch_xla": [text],
        "differ": {text: [text]},
        "new": {text: [text]},
        "not_compared": {text: text},
        "registry": [text],
        "moved": {text: [text]},
    }
    field = {"moved": "bytes_listed"}.get(name, name)  # the file's `moved`
    comparison = Comparison(**{"base": "base", "base_torch_xla": "2.9.0", "compared": 1, field: values[name]})
    (run / runfolder.COMPARISON_NAME).write_text(comparison.to_json())


def report_of(run: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str, str]:
    """(exit code, summary.md, stdout, $GITHUB_OUTPUT) of the report CI runs on `run`."""
    outputs, step = run.parent / "github-output", run.parent / "step-summary.md"
    code = report.main(
        [str(run), "--pytest-exit-status", "1", "--annotate", "--github-output", str(outputs)]
        + ["--step-summary", str(step), *extra]
    )
    stdout = capsys.readouterr().out
    summary = step.read_text(encoding="utf-8") if step.is_file() else ""
    return code, summary, stdout, outputs.read_text(encoding="utf-8") if outputs.is_file() else ""


OWN_HEADING = re.compile(
    r"## SPMD regression results|### `[\w.?-]*` \((?:[^`\\]|\\.)*\)|### (✅|⚠️|❌) Compared with the base build"
)
COMMAND = re.compile(r"::(error|warning)( title=[^\r\n:,]*)?::[^\r\n]*")
UNESCAPED = r"(?<!\\)(?:\\\\)*"  # preceded by an even number of backslashes


def assert_inert_summary(summary: str) -> None:
    summary.encode("utf-8")  # strict: no lone surrogate
    assert len(summary.encode("utf-8")) < 1024 * 1024
    assert re.findall(r"<(?!br>)", summary) == [], "HTML from a record reached the summary"
    for line in summary.splitlines():
        assert not line.startswith("#") or OWN_HEADING.fullmatch(line), f"a heading the report did not make: {line!r}"
        pipes = re.findall(UNESCAPED + r"\|", line)
        if re.fullmatch(r"\|(---\|){5,6}", line):
            continue  # a table's separator row
        if line.startswith("| "):
            assert len(pipes) - 1 in (5, 6), f"a table row with {len(pipes) - 1} cells: {line[:300]!r}"
        else:
            assert pipes == [], f"a table row the report did not make: {line[:300]!r}"
        ticks = re.findall(UNESCAPED + "`", line)
        assert len(ticks) == (2 if line.startswith("### `") else 0), f"a code span from a record: {line[:300]!r}"


def assert_inert_stdout(stdout: str) -> None:
    for line in re.split(r"\r\n|\r|\n", stdout.removesuffix("\n")):  # the runner's lines
        if line.startswith("::"):
            assert COMMAND.fullmatch(line), f"not one well-formed workflow command: {line[:300]!r}"
            message = line.split("::", 2)[2]
            assert re.findall(r"%(?!25|0A|0D|23)", message) == [], f"an unescaped % in {message[:300]!r}"
        else:
            assert line.startswith(("harness.report ", "(")), f"a line the report did not print: {line[:300]!r}"
        assert "##[" not in line


def assert_inert_outputs(outputs: str) -> None:
    lines = outputs.splitlines()
    assert lines and all(re.fullmatch(r"[a-z-]+=\d+", line) for line in lines), outputs[:500]
    assert dict(line.split("=") for line in lines)["failed"] != "0"


@pytest.mark.parametrize("field", EVERY_FIELD)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile, long=st.booleans())
def test_hostile_text_in_any_field_reaches_no_output_unescaped(field: str, text: str, long: bool, capsys):
    if long:
        text = (text + "x" * 100)[:100] * LONG_REPEATS
    with tempfile.TemporaryDirectory() as folder:
        run = write_run(Path(folder), field, text)
        code, summary, stdout, outputs = report_of(run, capsys)
        assert code in (0, 1)
        assert_inert_summary(summary)
        assert summary == (run / runfolder.SUMMARY_NAME).read_text(encoding="utf-8")
        assert_inert_stdout(stdout)
        assert_inert_outputs(outputs)


# --- where the report writes: a folder or a link put there, and the order of what it writes ------


def test_a_folder_at_summary_md_is_refused_and_the_run_still_reported(tmp_path: Path, capsys):
    run = write_run(tmp_path, "record.reason", "boom")
    (run / runfolder.SUMMARY_NAME).mkdir()  # what a case body can do to its own run folder
    code, summary, stdout, outputs = report_of(run, capsys)
    assert code == report.EXIT_RUN_PROBLEM
    assert "summary.md is a folder, not a summary file (put there by a case?): refused" in summary
    assert "::error title=SPMD regression%3A cases/test_a.py%3A%3Atest_fails::boom" in stdout
    assert "title=SPMD regression%3A incomplete run::" in stdout and "summary.md is a folder" in stdout
    assert_inert_outputs(outputs)
    assert "failed=1" in outputs


@pytest.mark.parametrize("target", ["--github-output", "--step-summary"])
def test_a_link_where_the_report_appends_is_not_written_through(tmp_path: Path, capsys, target: str):
    run = write_run(tmp_path, "record.reason", "boom")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched\n")
    name = {"--github-output": "github-output", "--step-summary": "step-summary.md"}[target]
    (tmp_path / name).symlink_to(elsewhere)
    code, summary, stdout, outputs = report_of(run, capsys)
    assert code == report.EXIT_RUN_PROBLEM
    assert elsewhere.read_text() == "untouched\n", "the report wrote through a link"
    said = f"{target} {tmp_path / name} is a link, not a file: refused, nothing written through it"
    assert escaping.markdown_cell(said) in (run / runfolder.SUMMARY_NAME).read_text()
    assert f"incomplete run::{escaping.command_data(said)}" in stdout


def test_outputs_and_annotations_are_written_before_the_summary(tmp_path: Path, capsys, monkeypatch):
    """A summary write that fails anyway (the disk, a race with a case) takes nothing else with it."""
    run = write_run(tmp_path, "record.reason", "boom")

    def fails(path: Path, text: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runfolder, "replace_file", fails)
    code, _, stdout, outputs = report_of(run, capsys)
    assert code == report.EXIT_RUN_PROBLEM
    assert "::error title=SPMD regression%3A cases/test_a.py%3A%3Atest_fails::boom" in stdout
    assert "failed=1" in outputs


# --- a run too big for one step's summary --------------------------------------------------------


def test_three_thousand_records_make_a_summary_under_one_mib_that_says_what_it_left_out(tmp_path: Path, capsys):
    run = write_run(tmp_path, "record.evidence", "E" * 8000)
    evidence = "AssertionError: " + "x" * 8000
    lines = [
        CaseRecord(
            f"cases/test_f{i % 30}.py::test_{i}",
            f"f{i % 30}",
            "passed" if i % 10 else "failed",
            reason="r" * 500,
            evidence=evidence,
        ).to_json()
        for i in range(3000)
    ]
    (run / "verdicts-gw1.jsonl").write_text("\n".join(lines) + "\n")
    code, summary, stdout, outputs = report_of(run, capsys)
    assert len(summary.encode("utf-8")) < 1024 * 1024
    assert re.search(r"⚠️ \*\*\d+ of 3002 case rows left out \(\d+ passed\) to keep this summary under", summary)
    assert "test\\_fails" in summary and "test\\_10 " in summary, "a failure was left out before the passes"
    assert summary.rstrip().endswith("run problem(s)") or "**Totals:** 3002 cases" in summary
    assert_inert_summary(summary)


# --- a record rewritten after its case ended -------------------------------------------------------

REWRITES_AN_EARLIER_RECORD = """
import json, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def body_rewrites_the_earlier_record(ctx, results):
    for path in pathlib.Path(results).glob("run-*/verdicts-*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for record in lines:
            if record.get("nodeid", "").endswith("test_a_fails"):
                record.update(reason="runner lost (infrastructure), not a regression", evidence="")
        path.write_text("".join(json.dumps(record) + "\\n" for record in lines))

def test_a_fails(spmd):
    spmd.run(body_ok)
    assert False, "the real failure"

def test_b_rewrites(spmd):
    spmd.run(body_rewrites_the_earlier_record, results=str(pathlib.Path("results").absolute()))
"""


@pytest.mark.parametrize("workers", [(), ("-n", "1")], ids=["serial", "xdist"])
def test_a_record_a_later_case_rewrote_is_named_and_the_run_is_red(pytester, workers):
    """The digest of each record reaches the controlling pytest process with its case's report
    (from an xdist worker too), and its manifest holds the run's records to it."""
    pytester.makepyfile(test_rewriter=REWRITES_AN_EARLIER_RECORD)
    assert run_fake(pytester, "--spmd-results-dir=results", *workers).ret == 1
    run = only_run_folder(pytester)
    assert "runner lost (infrastructure)" in "".join(p.read_text() for p in run.glob("verdicts-*")), "no rewrite"
    proc = spmd_report(str(run), "--pytest-exit-status", "1", "--annotate")
    assert proc.returncode == report.EXIT_RUN_PROBLEM, proc.stdout + proc.stderr
    said = "the record of test_rewriter.py::test_a_fails was rewritten after its case ended (by a later case?)"
    assert said in proc.stdout, proc.stdout
    assert "the record of test_rewriter.py::test_b_rewrites" not in proc.stdout  # its own record is as written
