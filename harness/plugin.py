"""The pytest plugin (entry point `pytest11: spmd_harness`).

Wiring only: each hook hands its work to the module whose job it is. It adds the options
(harness.config), keeps one HarnessSession per pytest process (harness.run.session), resolves
what each case needs at run time (never at import), gives tests the `spmd` fixture that runs
bodies in child processes (harness.isolation), has each case judged by the session's judges in
turn (harness.judges.judging) and writes one CaseRecord per SPMD case from the judged case
(harness.run.writing). The hooks of the process that owns the run (the header, xdist's
controller, the end-of-run sections, the manifest) are harness.run.controller's, registered
only there (harness.run.role). The pytest process itself never imports torch or torch_xla.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator

import pytest

from harness.config import activation, jobsize, options
from harness.config.requirements import tier_skip_reason, unmet_needs
from harness.errors import CaseError
from harness.isolation.parent.case import SpmdRunner, hold_sources
from harness.isolation.system import files, processes
from harness.judges import registrycheck
from harness.judges.judging import RUNNER_KEY, JudgedCase, judge_case
from harness.records import results, runfolder
from harness.run import caseuser, checkoutwatch, controller, earlystart, writing
from harness.run.dumproot import remove_dump_root
from harness.run.role import Role, role_of
from harness.run.session import (
    EARLY_KEY,
    PYTEST_SESSION_KEY,
    RUN_FOLDER_KEY,
    RUN_SERVERS_KEY,
    SESSION_KEY,
    WORKERINPUT_ACTIVE_KEY,
    HarnessSession,
    load_inputs,
)

MARKERS = (
    activation.SPMD_MARKER_LINE,
    "needs(backend=None, devices=0, jax=False, multislice=False, xla=True, reason=''): what a case needs from the backend; unmet needs skip with the numbers",
    "known_bug(entry_id): judge this case against a known-bug registry entry; several markers: the entry whose carried_by holds the child's torch_xla judges it",
    "no_sharding_baseline(reason): keep this case out of the sharding baseline (its recorded tensors vary by design)",
    "nightly: a case only the nightly tier runs (--spmd-tier=nightly); the PR tier skips it naming the tier",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    earlystart.start_servers(early_config)


def pytest_configure(config: pytest.Config) -> None:
    _register_markers(config)
    options.check_not_taken_for_a_test_path(config)
    caseuser.configure(config)  # before any child starts
    config.pluginmanager.register(_JunitGuard(), "spmd_junit_guard")
    jobsize.configure(config)  # read once: the header, run.json and the case ids say the same size
    config.pluginmanager.register(jobsize, "spmd_job_size")  # the spmd_job_size fixture and its ids
    harness_session = HarnessSession(config)
    config.stash[SESSION_KEY] = harness_session
    registrycheck.check_bug_option(config, harness_session.registry_path)  # before xdist's workers would each refuse it
    workerinput = getattr(config, "workerinput", None)
    controls_workers = harness_session.role is Role.CONTROLLER
    if config.stash.get(EARLY_KEY, False) or (workerinput or {}).get(WORKERINPUT_ACTIVE_KEY):
        harness_session.activate(config)
    elif (_names_input_files(config) or controls_workers) and not getattr(config.option, "help", False):
        # A file the user named is checked now, in the xdist controller too; so is a default file
        # the workers would read: a worker's usage error ends the run as "no tests ran", naming nothing.
        load_inputs(harness_session, config)
        if controls_workers:
            harness_session.cost_judge.read_unless_probed()
    harness_session.configure_compare(config)  # only with --spmd-compare
    if harness_session.role.owns_run:
        checkoutwatch.take(config)  # a case that rewrites the harness fails the run (harness.run.checkoutwatch)
        controller.register(config)


def _names_input_files(config: pytest.Config) -> bool:
    """The command line or ini names a registry or a baseline: the user means this plugin."""
    return any(
        options.value(config, name) for name in ("spmd_known_bugs", "spmd_shardings_baseline", "spmd_costs_baseline")
    )


def _register_markers(config: pytest.Config) -> None:
    """The plugin's markers, except a name the project registers itself (its own `needs`, say):
    `--markers` then lists it once, as the project wrote it."""
    own = {str(line).split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    for line in MARKERS:
        if line.split(":", 1)[0].split("(", 1)[0] not in own:
            config.addinivalue_line("markers", line)


def pytest_unconfigure(config: pytest.Config) -> None:
    harness_session = config.stash.get(SESSION_KEY, None)
    if harness_session is not None:
        harness_session.pool.close()
    servers = config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        servers.close()  # after the pool: its children are ended first
    if role_of(config) is Role.WORKER:
        processes.continue_if_stopped(os.getppid())  # the controller, if a case stopped it (SIGSTOP)
    if harness_session is not None and harness_session.role.owns_run:
        writing.recheck_run(config, harness_session)
        remove_dump_root(harness_session.run_folder.path)
    if role_of(config).owns_run and _refused(config):
        run = harness_session.run_folder if harness_session is not None else config.stash.get(RUN_FOLDER_KEY, None)
        if run is not None:
            run.retire()  # a run refused before any case leaves no folder, and `latest` keeps the last real run


def _refused(config: pytest.Config) -> bool:
    """The run stopped on a usage error (a bad option, base run or registry), collected nothing, or
    stopped before its session began: it ran no case, and leaves nothing behind."""
    session = config.stash.get(PYTEST_SESSION_KEY, None)
    return session is None or session.exitstatus in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The entries each SPMD case names (a bad one refuses the run), then --spmd-bug's selection."""
    registrycheck.read_entries(config, items, config.stash[SESSION_KEY].registry_path)


class _JunitGuard:
    """pytest's junitxml opens its file with a plain open() at the session's end: a named pipe a
    case put there (results/junit.xml is the case's to write) would hang the run. Runs first."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        harness_session = session.config.stash.get(SESSION_KEY, None)
        xmlpath = getattr(session.config.option, "xmlpath", None)
        if harness_session is not None and xmlpath and (harness_session.active or harness_session.run_folder.exists()):
            with contextlib.suppress(OSError):
                files.clear_for_writer(xmlpath)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The judges' end of the run; the run manifest's end is the run owner's (harness.run.controller)."""
    harness_session = session.config.stash.get(SESSION_KEY, None)
    if harness_session is None:
        return
    for judge in harness_session.judges:  # the xdist controller's too, which ran no case: the base run's comparison
        judge.finish(session)
    if not harness_session.active:
        return
    for fault in harness_session.pool.idle_deaths():
        harness_session.charge_late_fault(fault)
    if harness_session.late_faults and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[PYTEST_SESSION_KEY] = session
    servers = session.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None and not session.config.pluginmanager.has_plugin("dsession"):
        # The command line asked for workers, but xdist started none (-n auto with --pdb or on
        # one core, --dist no): nobody will collect, so the servers waiting for that import now.
        servers.start_waiting_imports()


def pytest_itemcollected(item: pytest.Item) -> None:
    """At the first SPMD case collected, start the import (a fork server's): it overlaps collection.
    A run whose options may still deselect that case waits for the end of collection."""
    harness_session = item.config.stash[SESSION_KEY]
    if harness_session.early_start_done or not activation.is_spmd(item) or item.config.option.collectonly:
        return
    if not harness_session.active and activation.may_be_deselected(item):
        return
    harness_session.early_start_done = True
    harness_session.activate(item.config)
    if (
        harness_session.pool.fork
        and not harness_session.backend.exclusive_device
        and harness_session.backend.capabilities().has_xla
    ):
        harness_session.claim_run_folder()
        runner = SpmdRunner(harness_session.pool, harness_session.backend, harness_session.case_timeout, "prewarm")
        harness_session.pool.prewarm(runner.spec(functionalization=True))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the first child while pytest gets going: torch_xla's import overlaps the rest.

    capabilities() comes first on purpose: on a TPU host its probe process must have released
    the chips before the warm child takes them.
    """
    harness_session = session.config.stash[SESSION_KEY]
    spmd_items = [item for item in session.items if activation.is_spmd(item)]
    if session.config.option.collectonly or not spmd_items:
        return
    harness_session.activate(session.config)
    hold_sources({item.path.parent for item in spmd_items})  # before any case: what their children import
    if not harness_session.backend.capabilities().has_xla:
        return
    harness_session.sharding_judge.baseline()  # read at configure time, except a TPU's (see session.load_inputs)
    runner = SpmdRunner(harness_session.pool, harness_session.backend, harness_session.case_timeout, "prewarm")
    # Cases parametrized over `functionalization` say which modes this selection needs. Only one
    # child is prewarmed where the cores are already busy (xdist) or the device is exclusive (TPU):
    # there a second import would only delay the first verdict.
    modes = [m for m in (True, False) if any(_functionalization_of(item) == m for item in spmd_items)]
    if not harness_session.role.owns_run or harness_session.backend.exclusive_device:
        modes = modes[:1]
    if modes:
        harness_session.claim_run_folder()
    for mode in modes:
        harness_session.pool.prewarm(runner.spec(functionalization=mode))


def _functionalization_of(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("functionalization", True) if callspec else True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not activation.is_spmd(item):
        return  # a foreign test's needs marker is its own
    harness_session = item.config.stash[SESSION_KEY]
    reason = unmet_needs(item, harness_session.backend) or tier_skip_reason(item, harness_session.tier)
    if reason:
        # Reported at the case (its file and line), as a skip marker would be, not at this hook.
        raise pytest.skip.Exception(reason, _use_item_location=True)


@pytest.fixture
def spmd(request: pytest.FixtureRequest) -> Iterator[SpmdRunner]:
    """Runs case bodies in child processes; see harness.isolation.parent.case.SpmdRunner.run."""
    if activation.project_owns_spmd_marker(request.config):
        pytest.fail(activation.OWNED_MARKER_ERROR, pytrace=False)  # rather than a case half-judged
    harness_session = request.config.stash[SESSION_KEY]
    harness_session.activate(request.config)  # a test that asks for the fixture is an SPMD case, marked or not
    journal = harness_session.claim_run_folder() / runfolder.requests_name(harness_session.worker)
    runner = SpmdRunner(
        harness_session.pool,
        harness_session.backend,
        harness_session.case_timeout,
        results.item_case_id(request.node),
        journal,
        late_faults=harness_session.charge_late_fault,
        tier=harness_session.tier,
    )
    request.node.stash[RUNNER_KEY] = runner
    yield runner


def _short_test_side_traceback(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """A case that failed in its child: the test function's side of the traceback (its source,
    `spmd = <SpmdRunner ...>`, the fixture's frames) is pytest's short style, one line a frame; the
    child's own traceback and log follow whole in the message. Only under pytest's default
    traceback style: a style asked for (--tb=long, native, ...) is left as it is."""
    if not (report.failed and call.excinfo is not None and isinstance(call.excinfo.value, CaseError)):
        return
    if item.config.option.tbstyle != "auto" or not isinstance(item, pytest.Function):
        return
    item.config.option.tbstyle = "short"
    try:
        report.longrepr = item.repr_failure(call.excinfo)
    finally:
        item.config.option.tbstyle = "auto"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    case_id = results.item_case_id(item)
    if call.when == "setup" and activation.is_spmd(item) and case_id != item.nodeid:
        item.user_properties.append((writing.CASE_ID_PROPERTY, case_id))  # before the report copies them
    report: pytest.TestReport = yield
    harness_session = item.config.stash[SESSION_KEY]
    spmd = activation.is_spmd(item)
    if call.when == "call":
        _short_test_side_traceback(item, call, report)
        case = judge_case(harness_session.judges, item, call, report)
        if spmd:
            writing.write_case_record(case, report)
        if not report.passed and not hasattr(report, "wasxfail"):  # a reproduced known bug may update (costcheck)
            harness_session.settle_updates(item.nodeid, passed=False)
    elif call.when == "setup" and not report.passed and spmd:
        writing.write_case_record(JudgedCase.of(item, call), report)
    elif call.when == "teardown":
        harness_session.settle_updates(item.nodeid, passed=report.passed)
    return report
