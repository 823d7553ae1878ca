"""The plugin's side of --spmd-compare (harness.judges.basecompare): load the base run, judge each
case, list what changed at the end of the run and leave it in the run's folder.

The last judge (harness.judges.judging), after the registry and the committed baselines: a case whose body
passed, or that reproduced its known bug as the base run did, is compared with its record in the base run, and fails (or, when
a committed baseline failed it already, gets a section) with one line per item that differs.

Under xdist the controller loads the base run once, at configure time (a bad base is a usage
error before any worker starts), and hands it to each worker it starts, a restarted one too: no
worker reads the base's files, which a case may have edited meanwhile. Each worker's finding travels to the
controller on the test's report (a user property), as pytest's own reports do, so the controller
prints the end-of-run listing and writes `comparison.json` whatever worker judged a case, and a
crashed worker loses only its own case.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness import costs
from harness.config import activation, options
from harness.errors import HarnessError
from harness.isolation.wire import protocol
from harness.judges import basecompare
from harness.judges.basecompare import BaseRun, Comparison
from harness.judges.judging import BESIDES, Judge, JudgedCase, fail_besides, is_xfail, reproduced_bug
from harness.records import buildid, runfolder, versions
from harness.records.results import CaseRecord

WORKERINPUT_KEY = "spmd_base_run"  # the base run the controller read, handed to each xdist worker
PROPERTY = "spmd_base_compare"  # a report's user property: this case against the base (JSON)


class BaseRunJudge(Judge):
    """The base run this process holds cases to, and (the process that owns the run) what the run
    found, from every case's report, the xdist workers' included."""

    CHECKED = "base run"

    def __init__(self, base: BaseRun, own_run: Path, owns_run: bool, backend_name: str = "") -> None:
        self.backend_name = backend_name
        self.base = base
        self.own_run = own_run
        self.owns_run = owns_run
        self.comparison = Comparison(str(base.path), base.torch_xla)

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        judge(self, case, report)

    def collect(self, report: pytest.TestReport) -> None:
        collect(self, report)

    def summarise(self, terminalreporter: Any) -> None:
        summarise(self, terminalreporter)

    def finish(self, pytest_session: pytest.Session) -> None:
        if self.owns_run:
            finish(self)


def configure(config: pytest.Config, backend: Any, own_run: Path, owns_run: bool) -> BaseRunJudge | None:
    """Load and validate the base run now (every process): a bad one is a usage error (exit 4).
    None: the run compares with no base run."""
    path = options.value(config, "spmd_compare")
    if not path or getattr(config.option, "help", False):
        return None
    handed = (getattr(config, "workerinput", None) or {}).get(WORKERINPUT_KEY)
    if handed is not None:  # an xdist worker: the base as the controller read it, never the files again
        base = from_workerinput(handed)
    else:
        try:
            base = BaseRun.load(Path(path), backend.name, backend.capabilities().devices, own_run)
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
    return BaseRunJudge(base, own_run, owns_run, backend.name)


def to_workerinput(base_judge: BaseRunJudge | None) -> dict[str, Any] | None:
    """The base run as the controller read and checked it, for each worker it starts (a worker
    xdist restarts too): the base's files are writable by the code under test, so a case that
    edits them must not change what a later worker holds its cases to."""
    if base_judge is None:
        return None
    base = base_judge.base
    return {
        "path": str(base.path),
        "torch_xla": base.torch_xla,
        "backend": base.backend,
        "devices": base.devices,
        "records": {case: dataclasses.asdict(record) for case, record in base.records.items()},
    }


def from_workerinput(data: dict[str, Any]) -> BaseRun:
    return BaseRun(
        path=Path(data["path"]),
        torch_xla=data["torch_xla"],
        backend=data["backend"],
        devices=data["devices"],
        records={case: CaseRecord.from_dict(record) for case, record in data["records"].items()},
    )


def report_header(base_judge: BaseRunJudge | None, this_build: dict[str, Any] | None = None) -> str | None:
    """The base run, its build, and (once, here) how the two builds relate where their labels agree."""
    if base_judge is None:
        return None
    base = base_judge.base
    base_build = buildid.read(base.path)
    base_judge.comparison.base_build = base_build.get("id") if base_build else None
    base_judge.comparison.this_build = this_build.get("id") if this_build else None
    line = (
        f"compared with base run {base.path} (torch_xla {base.torch_xla or '?'}, "
        + (f"{buildid.describe(base_build)}, " if base_build else "")
        + f"{len(base.records)} case records)"
    )
    if base.chosen:
        line += f"\n  chosen as {base.chosen}"
    relation = buildid.relation(base_build, this_build)
    if relation is not None:
        line += "\n" + relation
    elif base.torch_xla is not None and base.torch_xla == _this_build(base_judge.backend_name):
        line += "\n" + basecompare.same_build_warning(base.torch_xla)
    return line


def _this_build(backend_name: str) -> str | None:
    """The torch_xla this run's children will report, as far as the pytest process knows it."""
    if backend_name == "fake":
        return os.environ.get(protocol.FAKE_VERSION_ENV)
    return versions.installed("torch_xla")


def judge(base_judge: BaseRunJudge, case: JudgedCase, report: pytest.TestReport) -> None:
    """Hold one case to its base record; its finding goes on the report for the process that owns
    the run (collect)."""
    if not activation.is_spmd(case.item):
        return
    judgement = case.judgement
    finding: dict[str, Any] = {
        "case": case.case_id,
        "version": case.torch_xla,
        "known_bug": (judgement.entry or case.entries[0].id) if judgement and case.entries else None,
        "registry_verdict": judgement.kind.value if judgement else None,
    }
    entry = reproduced_bug(case, report)
    if (case.body_passed and not is_xfail(report) and not report.skipped) or entry is not None:
        signatures = None if case.has_marker("no_cost_check") else case.recorded_costs()
        judged = None if case.has_marker("no_sharding_baseline") else case.shardings
        comparison = basecompare.compare_case(base_judge.base, case.case_id, judged, signatures, entry)
        if comparison.not_compared is None:
            base_judge.held(report)
        finding.update(
            compared=comparison.not_compared is None,
            differences=comparison.differences,
            new=comparison.new,
            bytes_listed=comparison.bytes_listed,
        )
        if comparison.not_compared:
            finding["not_compared"] = comparison.not_compared
        if comparison.differences and entry is not None:  # the bug excuses its own failure, not these
            fail_besides(case, report, entry, comparison.differences, f"the base run {base_judge.base.path}")
            finding["failure"] = [f"{BESIDES} known bug {entry}: {line}" for line in comparison.differences]
        elif comparison.differences:
            finding["failure"] = _fail(
                case, report, basecompare.failure_text(base_judge.base, case.torch_xla, comparison)
            )
            case.reported_superseded = True  # the committed baselines' reported changes: the same, against older
        if comparison.new:
            case.show("new in this build (the base run lacks them; listed, not failed)", "\n".join(comparison.new))
        if comparison.bytes_listed:
            case.show(
                f"bytes moved from the base run within the band ({costs.band_text()}) or down (listed, not failed)",
                "\n".join(comparison.bytes_listed),
            )
    report.user_properties.append((PROPERTY, json.dumps(finding, sort_keys=True)))


def _fail(case: JudgedCase, report: pytest.TestReport, message: str) -> list[str]:
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:  # a committed baseline failed it already: this finding is shown next to that one
        case.show("compared with the base run", message)
    return message.splitlines()[:-1]


def collect(base_judge: BaseRunJudge, report: pytest.TestReport) -> None:
    """The process that owns the run adds each case's finding to the run's comparison."""
    if report.when != "call":
        return
    properties = dict(report.user_properties)
    if PROPERTY not in properties:
        return
    finding = json.loads(str(properties[PROPERTY]))
    case, comparison = finding["case"], base_judge.comparison
    if finding.get("version") and finding["version"] not in comparison.this_torch_xla:
        comparison.this_torch_xla.append(finding["version"])
    if finding.get("compared"):
        comparison.compared += 1
    if finding.get("failure"):
        comparison.differ[case] = finding["failure"]
    if finding.get("new"):
        comparison.new[case] = finding["new"]
    if finding.get("bytes_listed"):
        comparison.bytes_listed[case] = finding["bytes_listed"]
    if finding.get("not_compared"):
        comparison.not_compared[case] = finding["not_compared"]
    base_record = base_judge.base.records.get(case)
    entry = finding.get("known_bug")
    if base_record is not None and entry:
        line = basecompare.registry_change(
            str(entry), case, base_record.registry_verdict, finding.get("registry_verdict")
        )
        if line:
            comparison.registry.append(basecompare.printable(line))


def summarise(base_judge: BaseRunJudge, terminalreporter: Any) -> None:
    comparison = base_judge.comparison
    terminalreporter.section(f"compared with the base run {base_judge.base.path}", red=bool(comparison.differ))
    for line in comparison.lines():
        terminalreporter.line(line, red=line.startswith(("differs", "newly failing", "WARNING")))


def finish(base_judge: BaseRunJudge) -> None:
    """The process that owns the run leaves the comparison in the run's folder, for harness.report."""
    if not runfolder.is_run_folder(base_judge.own_run):
        return
    runfolder.replace_file(base_judge.own_run / runfolder.COMPARISON_NAME, base_judge.comparison.to_json())


def planted_comparison(base_judge: BaseRunJudge | None, own_run: Path) -> list[str]:
    """A run without --spmd-compare makes no comparison.json: one in its folder was written by a
    case, a forged "none differ" the report would show as a green check, so the run fails."""
    if base_judge is not None or not os.path.lexists(own_run / runfolder.COMPARISON_NAME):
        return []
    return [
        f"{runfolder.COMPARISON_NAME} in {own_run.name} was not made by this run (it ran without --spmd-compare; "
        "written by a case?); the run fails"
    ]
