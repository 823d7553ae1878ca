"""The hooks of the process that owns the run (harness.run.role: a run without xdist, or xdist's
controller), registered only there, as pytest-xdist registers its own controller plugin: the
header, the workers' start (the run folder, the base run and the fork servers they share), each
case's report as the judges collect it, a dead worker's record, the end-of-run sections and the
run manifest's end. Its sections at the end of the run come from harness.run.findings,
harness.run.failedlines and harness.run.samecause, registered beside it."""

from __future__ import annotations

from typing import Any

import pytest

from harness.config import activation
from harness.isolation.parent import runservers
from harness.isolation.parent.evidence import headline
from harness.judges import basecheck
from harness.run import checkoutwatch, writing
from harness.run.failedlines import WholeFailedLines
from harness.run.findings import Findings
from harness.run.samecause import SameCauseShownOnce
from harness.run.session import (
    EARLY_KEY,
    RUN_SERVERS_KEY,
    SESSION_KEY,
    WORKERINPUT_ACTIVE_KEY,
    WORKERINPUT_RUN_KEY,
    HarnessSession,
)


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(RunOwner(config), "spmd_run_owner")
    whole_failed_lines = WholeFailedLines()
    config.pluginmanager.register(whole_failed_lines, "spmd_whole_failed_lines")
    config.pluginmanager.register(SameCauseShownOnce(whole_failed_lines), "spmd_same_cause_shown_once")
    config.pluginmanager.register(Findings(), "spmd_findings")


def _harness_session(config: pytest.Config) -> HarnessSession | None:
    return config.stash.get(SESSION_KEY, None)


class RunOwner:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        """One line that says what the run uses: which backend and devices, which torch_xla stack,
        where its results go (the run folder is made when the first SPMD case has something to write)."""
        harness_session = _harness_session(config)
        if harness_session is None or not harness_session.active:
            return None  # a run that selects SPMD cases only after collection: pytest_report_collectionfinish
        harness_session.header_shown = True
        return harness_session.header_lines(config)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str] | None:
        """The header of a run that turned out to select SPMD cases at collection."""
        harness_session = _harness_session(config)
        if harness_session is None or not harness_session.active or harness_session.header_shown:
            return None
        harness_session.header_shown = True
        return harness_session.header_lines(config)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller, for each worker it starts (a restarted one too): the run's folder, the
        base run as this process read it, and the fork servers' addresses."""
        harness_session = node.config.stash[SESSION_KEY]
        node.workerinput[WORKERINPUT_RUN_KEY] = harness_session.run_folder.to_workerinput()
        node.workerinput[WORKERINPUT_ACTIVE_KEY] = harness_session.active
        base = basecheck.to_workerinput(harness_session.base_run_judge)
        if base is not None:
            node.workerinput[basecheck.WORKERINPUT_KEY] = base
        servers = node.config.stash.get(RUN_SERVERS_KEY, None)
        if servers is not None:
            node.workerinput[runservers.WORKERINPUT_KEY] = runservers.addresses_to_workerinput(servers.addresses())
            servers.worker_started()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist controller: once every worker has collected, the servers waiting for it start."""
        servers = node.config.stash.get(RUN_SERVERS_KEY, None)
        if servers is not None:
            servers.worker_collected()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker that went down collects nothing more: nothing may wait for it."""
        servers = node.config.stash.get(RUN_SERVERS_KEY, None)
        if servers is not None:
            servers.start_waiting_imports()

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """xdist controller: a worker died while running `crashitem`. The worker could not write
        that case's record, so the controller does: a started case always leaves a failed record."""
        worker_node = getattr(report, "node", None)  # xdist's WorkerController for the dead worker
        harness_session = _harness_session(worker_node.config) if worker_node is not None else None
        if (
            harness_session is None
            or worker_node is None
            or not (harness_session.active or harness_session.run_folder.exists())
        ):
            return  # a foreign project's crash: not the harness's to record
        worker = getattr(getattr(worker_node, "gateway", None), "id", "?")
        reason = (
            f"xdist worker {worker} crashed while running this case (the worker process died; see the pytest output)"
        )
        writing.write_crash_record(harness_session, worker_node.config, crashitem, reason, str(report.longrepr))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each case's report, whichever process judged it: what its judges sent along."""
        harness_session = _harness_session(self.config)
        if harness_session is not None:
            for judge in harness_session.judges:
                judge.collect(report)
        if report.when == "teardown":
            checkoutwatch.note(self.config)

    # tryfirst: a run that found its SPMD cases only in xdist workers prints its header here, and
    # the header comes before what the judges summarise.
    @pytest.hookimpl(tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        harness_session = _harness_session(config)
        if harness_session is None:
            return
        hint = _no_case_hint(config) if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED else None
        if hint:
            terminalreporter.write_line(hint, yellow=True)
        if not harness_session.active and harness_session.run_folder.exists():  # xdist workers found SPMD cases
            for line in harness_session.header_lines(config):
                terminalreporter.write_line(line)
        for judge in harness_session.judges:  # the xdist controller's too, which ran no case: the base run's comparison
            judge.summarise(terminalreporter)
        if not harness_session.late_faults:
            return
        terminalreporter.section("faults after a case's verdict (charged to that case)", red=True)
        for fault in harness_session.late_faults:
            terminalreporter.line(f"FAULT {fault.case}: {headline(fault.evidence)}", red=True)
            terminalreporter.line(fault.log_tail)

    # trylast: after the plugin's own end of the run (the judges' finish, the late faults' verdict).
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        harness_session = _harness_session(session.config)
        if harness_session is not None and (harness_session.active or harness_session.run_folder.exists()):
            writing.close_run(session, harness_session)


def _no_case_hint(config: pytest.Config) -> str | None:
    """A run that asked for SPMD cases and collected none: say where they are looked for."""
    if not (
        config.stash.get(EARLY_KEY, False) or activation.marker_expression_selects_spmd(config.option.markexpr or "")
    ):
        return None
    return (
        f"spmd harness: no SPMD case was collected under {config.rootpath}; the cases live in the harness "
        "checkout's cases/ folder: run pytest there (pytest -m spmd), or name it (pytest <checkout>/cases -m spmd)"
    )
