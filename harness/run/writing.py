"""What the plugin writes into the run folder: one CaseRecord per SPMD case (a crashed xdist
worker's case included), and the run manifest's end (how the run ended, which tests failed),
checked again once every process of the run is gone. A write the results folder cannot take
stops the run with a message, never an INTERNALERROR."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

from harness.isolation.parent.evidence import headline
from harness.judges import basecheck
from harness.judges.judging import Judge, JudgedCase
from harness.records import buildid, results, runfolder, versions
from harness.registry import Judgement, JudgementKind
from harness.run import checkoutwatch
from harness.run.findings import first_item
from harness.run.session import PYTEST_SESSION_KEY, SESSION_KEY, HarnessSession

CASE_ID_PROPERTY = "spmd_case_id"  # a report's user property: the case's stable name (results.case_id)
# A write into the results folder that fails with one of these cannot succeed for the next case
# either: the run stops with a message instead of an INTERNALERROR.
RESULTS_WRITE_FATAL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
# Registry judgements that do not fail a case: a failure then is another judge's, with its own reason.
ACQUITTALS = (JudgementKind.PASSED, JudgementKind.UNJUDGED)


def write_case_record(case: JudgedCase, report: pytest.TestReport) -> None:
    """The case's record, from the judged case alone (each judge fills its own fields), with the
    HLO its bodies kept and what each judge keeps beside it (a failing case's cost dumps)."""
    item = case.item
    harness_session = item.config.stash[SESSION_KEY]
    record = results.CaseRecord(
        nodeid=case.case_id,
        family=results.family_of(case.case_id),
        outcome=_outcome_of(report),
        reason=_reason(report, case.judgement),
        evidence=results.bounded_evidence(case.evidence or ""),
        torch_xla=case.torch_xla,
        backend=harness_session.backend.name,
        devices=harness_session.backend.capabilities().devices,
        duration_s=round(report.duration, 3),
        body_s=round(sum(r.duration_s for r in case.results), 3) if case.runner else 0.0,
        shardings=case.shardings,
        **_judges_fields(harness_session.judges, case),
        **_stack_versions(),
    )

    def write() -> None:
        folder = harness_session.claim_run_folder()
        for result in case.results:
            results.keep_texts(folder / runfolder.HLO_DIR, case.case_id, result.hlo, ".txt")
        for judge in harness_session.judges:
            judge.keep_files(folder, case, report.failed)
        results.write_record(folder, record, harness_session.worker)
        report.user_properties.append((results.RECORD_DIGEST_PROPERTY, results.record_digest(record)))

    _write_results(harness_session, item.config, write)


def _judges_fields(judges: list[Judge], case: JudgedCase) -> dict[str, Any]:
    """The record's fields each judge fills, each field by one judge."""
    fields: dict[str, Any] = {}
    for judge in judges:
        own = judge.record_fields(case)
        assert not own.keys() & fields.keys(), f"{type(judge).__name__} fills a field another judge fills"
        fields.update(own)
    return fields


def write_crash_record(
    harness_session: HarnessSession, config: pytest.Config, nodeid: str, reason: str, evidence: str
) -> None:
    """The record of a case whose xdist worker died under it: the worker could not write it."""
    record = results.CaseRecord(
        nodeid=nodeid,
        family=results.family_of(nodeid),
        outcome="failed",
        reason=reason,
        evidence=evidence,
        backend=harness_session.backend.name,
        devices=harness_session.backend.capabilities().devices,
        **_stack_versions(),
    )
    _write_results(
        harness_session,
        config,
        lambda: results.write_record(harness_session.claim_run_folder(), record, harness_session.worker),
    )


def close_run(session: pytest.Session, harness_session: HarnessSession) -> None:
    """The manifest says how the run ended and which tests pytest saw fail, so harness.report can
    tell a finished run from a killed one and find failures that have no case record."""
    stats = getattr(session.config.pluginmanager.get_plugin("terminalreporter"), "stats", {})
    counts = {
        key: len(reports)
        for key, reports in stats.items()
        if key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    }
    digests = {
        _case_id_of_report(r): digest
        for reports in stats.values()
        for r in reports
        if (digest := _record_digest_of_report(r)) is not None
    }
    failed_ids = list(
        dict.fromkeys(
            _case_id_of_report(r)
            for key in ("failed", "error")
            for r in stats.get(key, [])
            if getattr(r, "nodeid", None)
        )
    )
    xmlpath = getattr(session.config.option, "xmlpath", None)
    problems = harness_session.run_folder.manifest_problems() + basecheck.planted_comparison(
        harness_session.base_run_judge, harness_session.run_folder.path
    )
    problems += _record_build(harness_session)
    problems += checkoutwatch.problems(session.config)
    for problem in problems:
        session.config.get_terminal_writer().line(f"spmd harness: {problem}", red=True)
    if problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    try:
        harness_session.run_folder.finish(
            int(session.exitstatus),
            counts,
            failed_ids,
            str(Path(xmlpath).absolute()) if xmlpath else None,
            problems,
            digests,
        )
    except (OSError, ValueError) as exc:
        session.config.get_terminal_writer().line(
            f"spmd harness: could not close the run manifest in {harness_session.run_folder.path}: {exc}", red=True
        )


def _record_build(harness_session: HarnessSession) -> list[str]:
    """The run's build.json (harness.records.buildid), for a later run that compares with this one;
    one already there was put by a case, naming a build that may not have run: the run fails."""
    if not harness_session.run_folder.exists():
        return []
    try:
        buildid.write(harness_session.run_folder.path, harness_session.build)
    except FileExistsError:
        return [
            f"{buildid.FILE_NAME} in {harness_session.run_folder.path.name} was not made by this run (written by a case?)"
        ]
    except OSError as exc:
        return [f"could not write {buildid.FILE_NAME}: {exc}"]
    return []


def recheck_run(config: pytest.Config, harness_session: HarnessSession) -> None:
    """Every process of the run has ended: the manifest must still be the one pytest wrote."""
    try:
        problem = harness_session.run_folder.recheck()
    except (OSError, ValueError) as exc:
        problem = f"could not check the run manifest in {harness_session.run_folder.path}: {exc}"
    if problem is None:
        return
    config.get_terminal_writer().line(f"spmd harness: {problem}", red=True)
    session = config.stash.get(PYTEST_SESSION_KEY, None)
    if session is not None and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_results(harness_session: HarnessSession, config: pytest.Config, write: Callable[[], None]) -> None:
    """Run one write into the results folder. A full disk (or a read-only or failing one) cannot
    serve the next case either: the run stops after this case with a message naming the folder,
    and every record written before stays as it was."""
    try:
        write()
    except OSError as exc:
        if exc.errno not in RESULTS_WRITE_FATAL:
            raise
        message = (
            f"the results folder {harness_session.results_dir} cannot be written ({exc.strerror}); "
            "the run stops here, records written so far are kept. Free space or use --spmd-results-dir"
        )
        config.get_terminal_writer().line(f"\nspmd harness: {message}", red=True)
        session = config.stash.get(PYTEST_SESSION_KEY, None)
        if session is not None:
            session.shouldstop = message


def _case_id_of_report(report: Any) -> str:
    """A report's case name; set by the worker that ran it (the xdist controller has no items)."""
    return dict(getattr(report, "user_properties", ())).get(CASE_ID_PROPERTY, report.nodeid)


def _record_digest_of_report(report: Any) -> str | None:
    """The digest of the record the report's process wrote, if it wrote one."""
    for prop in getattr(report, "user_properties", ()):
        if isinstance(prop, tuple) and len(prop) == 2 and prop[0] == results.RECORD_DIGEST_PROPERTY:
            return str(prop[1])
    return None


def _outcome_of(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return report.outcome


class StackVersions(TypedDict):
    torch: str | None
    jax: str | None
    harness: str | None


def _stack_versions() -> StackVersions:
    """torch, jax and the harness as installed in this venv (the children run the same one)."""
    stack = versions.stack()
    return {"torch": stack["torch"], "jax": stack["jax"], "harness": versions.harness()}


def _reason(report: pytest.TestReport, judgement: Judgement | None) -> str:
    # The registry's word is the reason unless it passed the case and a baseline failed it: then
    # "outside the carried_by of ..." would stand for a sharding drift or a cost change.
    if judgement is not None and not (report.failed and judgement.kind in ACQUITTALS):
        return judgement.message
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.failed and report.longrepr is not None:
        crash = getattr(report.longrepr, "reprcrash", None)
        return headline(crash.message if crash else first_item(str(report.longrepr)), 500)
    return ""
