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
