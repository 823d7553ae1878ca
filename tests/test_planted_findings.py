"""A findings.txt a case body planted in its own run folder (harness.run.findings writes the real
one only when a case failed in its call): spmd-report's summary leads with the findings, so a
planted one would put the case's words at the top of the summary of a run it did not judge."""

from __future__ import annotations

import pytest

from harness import report
from tests.conftest import only_run_folder, run_fake, spmd_report

pytestmark = pytest.mark.selftest

PLANTS_FINDINGS = """
import pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_plants(ctx, results, kind):
    for run in pathlib.Path(results).glob("run-*"):
        if run.is_symlink():
            continue
        target = run / "findings.txt"
        if kind == "file":
            target.write_text("0 regression(s): every failure below is infrastructure, retry the job\\n")
        else:
            target.mkdir()

def test_plants(spmd):
    spmd.run(body_plants, results=str(pathlib.Path("results").absolute()), kind=KIND)
"""


@pytest.mark.parametrize("outcome", ["passed", "errored"])
def test_a_planted_findings_file_is_not_the_summarys_findings(pytester, outcome):
    source = PLANTS_FINDINGS.replace("KIND", '"file"')
    if outcome == "errored":  # a failure outside a case's call: no finding by cause is written
        source += "\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup broke')\n\n"
        source += "def test_errors(spmd, broken):\n    pass\n"
    pytester.makepyfile(test_planter=source)
    result = run_fake(pytester, "--spmd-results-dir=results")
    run = only_run_folder(pytester)
    proc = spmd_report(str(run), "--pytest-exit-status", str(int(result.ret)))
    summary = (run / "summary.md").read_text()
    assert "every failure below is infrastructure" not in summary, summary
    assert "every failure below is infrastructure" not in proc.stdout + proc.stderr
    assert proc.returncode == (0 if outcome == "passed" else report.EXIT_CASES_FAILED), proc.stdout + proc.stderr


REWRITES_A_FAILED_RECORD = """
import json, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def body_rewrites(ctx, results):
    for path in pathlib.Path(results).glob("run-*/verdicts-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            if record.get("nodeid", "").endswith("test_a_fails"):
                record["cost_changes"] = ["step0: compiles 1 -> 9 per step (forged by a later case)"]
        path.write_text("".join(json.dumps(record) + "\\n" for record in records))

def test_a_fails(spmd):
    spmd.run(body_ok)
    assert False, "the real failure"

def test_b_rewrites(spmd):
    spmd.run(body_rewrites, results=str(pathlib.Path("results").absolute()))
"""


def test_the_findings_are_not_drawn_from_a_record_a_later_case_rewrote(pytester):
    """The run's end groups failures by cause from their records: a record not as its case's
    process wrote it (its digest, carried by the case's report) gives the findings nothing."""
    pytester.makepyfile(test_rewriter=REWRITES_A_FAILED_RECORD)
    result = run_fake(pytester, "--spmd-results-dir=results")
    assert result.ret == 1
    run = only_run_folder(pytester)
    assert "forged by a later case" in "".join(p.read_text() for p in run.glob("verdicts-*")), "no rewrite"
    findings = result.stdout.str().split("spmd findings", 1)[1]
    assert "forged" not in findings and "compilations per step" not in findings, findings
    assert "1 case(s): AssertionError: the real failure" in findings, findings
