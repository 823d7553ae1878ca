"""harness.report: the CI job summary and GitHub annotations, built from results folders
written with the real CaseRecord contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import report
from harness.records import escaping
from harness.records.results import CaseRecord, write_record
from tests.conftest import REPO, run_fake, spmd_report

pytestmark = pytest.mark.selftest


def record(nodeid: str, outcome: str, **fields) -> CaseRecord:
    family = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    defaults = dict(torch_xla="2.9.0", backend="cpu", devices=4)
    return CaseRecord(nodeid=nodeid, family=family, outcome=outcome, **{**defaults, **fields})


@pytest.fixture
def mixed_run(tmp_path: Path) -> Path:
    """Two xdist workers, two families, every outcome."""
    results = tmp_path / "results"
    write_record(results, record("cases/test_scalar_specs.py::test_wrap[func-on]", "passed"), "gw0")
    write_record(
        results,
        record(
            "cases/test_scalar_specs.py::test_wrap[func-off]",
            "failed",
            reason="spec lost on scalar",
            evidence="AssertionError: '' != '{replicated}'",
        ),
        "gw0",
    )
    write_record(
        results,
        record(
            "cases/test_dtensor_linear.py::test_parallelize_forward",
            "xfailed",
            known_bug="dtensor-linear-shard",
            reason="reproduced known bug",
        ),
        "gw1",
    )
    write_record(
        results, record("cases/test_dtensor_linear.py::test_multislice", "skipped", reason="requires multislice"), "gw1"
    )
    return results


def table_rows(summary: str) -> list[str]:
    return [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| Case")]


def cell_count(row: str) -> int:
    # A row `| a | b |` has 2 cells; escaped pipes (`\|`) stay inside their cell.
    return len(re.split(r"(?<!\\)\|", row)) - 2


# --- reading -------------------------------------------------------------------------------------


def test_load_results_reads_every_worker_file(mixed_run: Path):
    assert len(report.load_results(mixed_run).records) == 4


def test_load_results_finds_per_host_folders_of_a_gke_run(tmp_path: Path):
    for slice_id in (0, 1):
        write_record(
            tmp_path / f"{slice_id}-0",
            record("cases/test_megascale.py::test_trace", "passed", slice_id=slice_id, host_id=0),
        )
    assert len(report.load_results(tmp_path).records) == 2


def test_a_damaged_line_is_counted_not_raised(mixed_run: Path):
    with (mixed_run / "verdicts-gw0.jsonl").open("a") as fh:
        fh.write('{"nodeid": "cases/test_x.py::cut mid-wr\n')
    results = report.load_results(mixed_run)
    assert len(results.records) == 4
    assert results.unreadable == ["verdicts-gw0.jsonl:3"]
    assert "1 unreadable record line(s)" in report.render_summary(results)


# --- the Markdown summary ------------------------------------------------------------------------


def test_summary_has_one_section_per_family_and_a_totals_line(mixed_run: Path):
    summary = report.render_summary(report.load_results(mixed_run))
    assert "### `dtensor_linear` (0 passed, 0 failed, 1 xfailed, 1 skipped)" in summary
    assert "### `scalar_specs` (1 passed, 1 failed, 0 xfailed, 0 skipped)" in summary
    assert summary.rstrip().endswith("**Totals:** 4 cases: 1 passed, 1 failed, 1 xfailed, 1 skipped")
    assert "torch_xla 2.9.0 · backend cpu · 4 devices" in summary


def test_summary_rows_show_verdict_registry_entry_and_evidence(mixed_run: Path):
    rows = table_rows(report.render_summary(report.load_results(mixed_run)))
    known = next(r for r in rows if "test\\_parallelize\\_forward" in r)
    assert "⚠️ known bug" in known and "dtensor-linear-shard" in known
    failed = next(r for r in rows if "func-off" in r)
    assert "❌ failed" in failed and "AssertionError: '' != '{replicated}'" in failed


def test_failures_come_first_within_a_family(mixed_run: Path):
    rows = table_rows(report.render_summary(report.load_results(mixed_run)))
    scalar_rows = [r for r in rows if "test\\_wrap" in r]
    assert ["❌ failed" in r for r in scalar_rows] == [True, False]


@pytest.mark.parametrize(
    "evidence, must_contain",
    [
        # A pipe would end the cell early.
        ("a | b", r"a \| b"),
        # Newlines would end the row.
        ("line one\nline two\r\nline three", "line one<br>line two<br>line three"),
        # HLO iota shardings and `<lambda>` would be read as HTML tags.
        ("{devices=[4,1]<=[4]} in <lambda>", "{devices=\\[4,1\\]&lt;=\\[4\\]} in &lt;lambda&gt;"),
        # A stray backtick or star would restyle the rest of the cell.
        ("`x` * y", r"\`x\` \* y"),
    ],
)
def test_evidence_is_escaped_for_a_table_cell(tmp_path: Path, evidence: str, must_contain: str):
    write_record(tmp_path, record("cases/test_a.py::test_b", "failed", evidence=evidence))
    summary = report.render_summary(report.load_results(tmp_path))
    (row,) = table_rows(summary)
    assert must_contain in row
    assert cell_count(row) == 5


def test_long_evidence_keeps_head_and_tail(tmp_path: Path):
    log_tail = "Traceback (most recent call last):\n" + "frame\n" * 2000 + "SIGSEGV in mark_step"
    write_record(tmp_path, record("cases/test_a.py::test_b", "failed", evidence=log_tail))
    (row,) = table_rows(report.render_summary(report.load_results(tmp_path)))
    assert "Traceback" in row and "SIGSEGV in mark\\_step" in row and "chars cut" in row
    assert len(row) < 3 * report.EVIDENCE_LIMIT


def test_hosts_column_appears_only_for_multihost_results(tmp_path: Path):
    write_record(tmp_path, record("cases/test_megascale.py::test_trace", "failed", slice_id=1, host_id=0))
    summary = report.render_summary(report.load_results(tmp_path))
    assert "| Case | Where |" in summary and "slice 1, host 0" in summary


def test_empty_run_summary_says_so(tmp_path: Path):
    summary = report.render_summary(report.load_results(tmp_path))
    assert "the run executed nothing" in summary and "**Totals:** 0 cases" in summary


# --- GitHub workflow commands --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, data, prop",
    [
        ("plain", "plain", "plain"),
        # % first, so the escapes themselves are not escaped twice.
        ("100%", "100%25", "100%25"),
        ("a\r\nb", "a%0D%0Ab", "a%0D%0Ab"),
        # `:` and `,` only matter inside properties (they delimit `key=value` pairs and `::`).
        ("cases/t.py::test[a,b]", "cases/t.py::test[a,b]", "cases/t.py%3A%3Atest[a%2Cb]"),
    ],
)
def test_workflow_command_escaping(text: str, data: str, prop: str):
    assert escaping.command_data(text) == data
    assert escaping.command_property(text) == prop


def test_one_error_annotation_per_failure(mixed_run: Path):
    (line,) = report.github_annotations(report.load_results(mixed_run))
    assert line.startswith("::error title=SPMD regression%3A cases/test_scalar_specs.py%3A%3Atest_wrap[func-off]::")
    assert "spec lost on scalar%0AAssertionError" in line
    assert "\n" not in line


def test_annotations_stay_within_githubs_per_step_limit(tmp_path: Path):
    for i in range(25):
        write_record(tmp_path, record(f"cases/test_a.py::test_{i:02}", "failed"))
    lines = report.github_annotations(report.load_results(tmp_path))
    assert len(lines) == report.MAX_ERROR_ANNOTATIONS
    assert "16 more failed case(s)" in lines[-1]


def test_unknown_outcomes_count_as_failures(tmp_path: Path):
    write_record(tmp_path, record("cases/test_a.py::test_b", "error", reason="worker crashed"))
    (line,) = report.github_annotations(report.load_results(tmp_path))
    assert line.startswith("::error ") and "worker crashed" in line


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_writes_summary_and_appends_to_step_summary(mixed_run: Path, tmp_path: Path, capsys):
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    assert report.main([str(mixed_run), "--step-summary", str(step_summary), "--annotate"]) == report.EXIT_CASES_FAILED
    written = (mixed_run / "summary.md").read_text()
    assert "### `scalar_specs`" in written
    assert step_summary.read_text() == "earlier step\n" + written
    assert capsys.readouterr().out.startswith("::error title=")


def test_cli_without_annotate_prints_a_plain_failure_list(mixed_run: Path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert report.main([str(mixed_run)]) == report.EXIT_CASES_FAILED
    out, err = capsys.readouterr()
    assert out == (
        "FAILED cases/test_scalar_specs.py::test_wrap[func-off]: spec lost on scalar\n"
        f"harness.report {mixed_run}: 4 cases: 1 passed, 1 failed, 1 xfailed, 1 skipped\n"
    )
    assert "1 case(s) failed in the run reported" in err


def test_the_exit_status_follows_the_run_unless_told_not_to(mixed_run: Path, tmp_path: Path, capsys):
    assert report.main([str(mixed_run), "--exit-zero-on-failures"]) == 0
    write_record(tmp_path, record("cases/test_x.py::test_a", "passed"))
    assert report.main([str(tmp_path)]) == 0, "a run whose cases passed exits 0"


def test_cli_fails_when_the_run_produced_no_records(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (tmp_path / "results").mkdir()
    assert report.main([str(tmp_path / "results"), "--annotate"]) == report.EXIT_NO_RECORDS
    out, err = capsys.readouterr()
    assert "executed nothing" in err and out.startswith("::error title=SPMD regression%3A empty run::")
    assert "executed nothing" in (tmp_path / "results" / "summary.md").read_text()


def test_cli_fails_when_the_results_folder_is_missing(tmp_path: Path, capsys):
    assert report.main([str(tmp_path / "nowhere")]) == report.EXIT_NO_RECORDS
    assert "does not exist" in capsys.readouterr().err


def test_module_runs_as_a_script(mixed_run: Path):
    proc = spmd_report(
        str(mixed_run), "--summary", str(mixed_run / "out.md"), env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == report.EXIT_CASES_FAILED, proc.stderr  # the run has a failed case
    assert (mixed_run / "out.md").read_text().startswith("## SPMD regression results")


def test_a_run_where_every_case_skipped_is_not_green(tmp_path, capsys):
    write_record(tmp_path, record("cases/test_x.py::test_a", "skipped", reason="needs backend tpu"))
    assert report.main([str(tmp_path)]) == 2
    assert "were skipped (first reason: needs backend tpu)" in capsys.readouterr().err


# --- what an annotation carries, from real runs (#29 item 4) -------------------------------------

ANNOTATED_CASES = """
import json, os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_records(ctx, shardings):
    for name, spec in shardings.items():
        ctx.record_sharding(name, spec)

def test_block(spmd):
    spmd.run(body_records, shardings=json.loads(os.environ["CASE_SHARDINGS"]))

def test_plain_assertion(spmd):
    spmd.run(body_records, shardings={})
    assert os.environ["CASE_SHARDINGS"] == "", "the plain message"
"""


def test_an_annotation_carries_the_drifted_tensor_and_a_plain_message_once(pytester, monkeypatch):
    pytester.makepyfile(test_annotated=ANNOTATED_CASES)

    def run(shardings: str, version: str, *args: str) -> None:
        monkeypatch.setenv("CASE_SHARDINGS", shardings)
        monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
        pytester.runpytest_subprocess(
            "--spmd-backend=fake", "-p", "no:cacheprovider", "--spmd-shardings-baseline=b.json", *args, timeout=120
        )

    run('{"w": "{devices=[4,1]0,1,2,3}"}', "2.9.0", "-k", "block", "--spmd-update-shardings")
    run('{"w": "{replicated}"}', "2.9.1")
    proc = spmd_report(str(pytester.path / "results"), "--annotate")
    errors = {line.split("::", 2)[1]: line for line in proc.stdout.splitlines() if line.startswith("::error ")}
    drift = errors["error title=SPMD regression%3A test_annotated.py%3A%3Atest_block"]
    assert "sharding drift: 1 tensor(s) differ from b.json" in drift
    assert "%0A  w: {devices=[4,1]0,1,2,3} -> {replicated}" in drift, drift
    plain = errors["error title=SPMD regression%3A test_annotated.py%3A%3Atest_plain_assertion"]
    assert plain.count("the plain message") == 1, plain


# --- exit codes (#29 item 5) ----------------------------------------------------------------------


def test_a_run_folder_without_case_records_exits_2_even_when_pytest_saw_failures(pytester):
    """A non-SPMD test failed, no case ran: the report lists that failure and still says the run
    executed no case (exit 2, as --help says), instead of exit 0."""
    pytester.makepyfile(
        test_plain="def test_plain_fails():\n    assert False\n",
        test_cases="""
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def test_not_this_time(spmd):
    pytest.skip("no case runs in this run")
""",
    )
    pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", timeout=120)
    run = next((pytester.path / "results").glob("run-*"))
    (run / "verdicts-main.jsonl").unlink()  # the skipped case's record: now no case record at all
    proc = spmd_report(str(pytester.path / "results"))
    assert proc.returncode == report.EXIT_NO_RECORDS, proc.stdout + proc.stderr
    assert "FAILED test_plain.py::test_plain_fails" in proc.stdout
    assert "error: no case records" in proc.stderr
    assert "2 no case record was read" in " ".join(report.__doc__.split())


def test_a_comparison_where_a_known_bug_is_newly_failing_is_not_a_green_check():
    from harness.judges.basecompare import Comparison

    newly = Comparison(base="/base", base_torch_xla="2.9.0", this_torch_xla=["2.6.0"], compared=10)
    newly.registry = [
        "newly failing in this build: fsdpv2-scalar-output-spec (t.py::t: base passed -> this build reproduced)"
    ]
    assert report.comparison_section(newly)[0] == "### ⚠️ Compared with the base build"
    newly.registry = []
    assert report.comparison_section(newly)[0] == "### ✅ Compared with the base build"


def test_a_results_folder_holding_several_runs_says_which_one_it_reports(pytester):
    """Two venvs, one results folder: the report of the folder is its latest run, and says the
    folder holds others and how to name one; a run's own folder is reported without the note."""
    pytester.makepyfile(
        test_cases="""
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def test_one(spmd):
    pass
"""
    )
    for _ in range(2):
        run_fake(pytester).assert_outcomes(passed=1)
    runs = sorted(p for p in (pytester.path / "results").glob("run-*") if not p.is_symlink())
    assert len(runs) == 2
    latest = (pytester.path / "results" / "latest").resolve()
    folder = spmd_report(str(pytester.path / "results"))
    assert folder.returncode == 0, folder.stdout + folder.stderr
    assert f"holds 2 runs; this report is of {latest.name}; name a run's folder to report another" in folder.stdout
    own = spmd_report(str(runs[0]))
    assert own.returncode == 0 and "holds 2 runs" not in own.stdout
