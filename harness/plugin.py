"""The pytest plugin (entry point `pytest11: spmd_harness`).

Wiring only: each hook hands its work to the module whose job it is. It adds the options
(harness.config), keeps one HarnessSession per pytest process (harness.run.session), resolves
what each case needs at run time (never at import), gives tests the `spmd` fixture that runs
bodies in child processes (harness.isolation), has each case judged (the known-bug registry, then
the sharding and the cost baselines, then the base build's run: harness.judges) and writes one
CaseRecord per SPMD case to the results folder (harness.run.writing). The pytest process itself
never imports torch or torch_xla.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.baselinefile import BaselineSession
from harness.config import activation, options
from harness.config.backends import make_backend
from harness.config.requirements import unmet_needs
from harness.errors import HarnessError, RegistryError
from harness.isolation import files, processes, runservers
from harness.isolation.case import SpmdRunner
from harness.isolation.evidence import headline
from harness.judges import basecheck, costcheck, registrycheck, shardingcheck
from harness.judges.registrycheck import ENTRIES_KEY, RUNNER_KEY, JudgedCase
from harness.records import results, runfolder
from harness.registry import get_entry
from harness.run import caseuser, checkoutwatch, writing
from harness.run.dumproot import remove_dump_root
from harness.run.failedlines import WholeFailedLines
from harness.run.findings import Findings
from harness.run.session import (
    EARLY_KEY,
    PYTEST_SESSION_KEY,
    RUN_FOLDER_KEY,
    RUN_SERVERS_KEY,
    SESSION_KEY,
    WORKERINPUT_ACTIVE_KEY,
    WORKERINPUT_RUN_KEY,
    HarnessSession,
    fork_server_wanted,
    load_inputs,
    share_dump_root,
)

# Options that make pytest print something and stop: the plugin then writes and starts nothing.
INFORMATION_ONLY_OPTIONS = ("help", "version", "collectonly", "markers", "showfixtures", "show_fixtures_per_test")

MARKERS = (
    activation.SPMD_MARKER_LINE,
    "needs(backend=None, devices=0, jax=False, multislice=False, xla=True, reason=''): what a case needs from the backend; unmet needs skip with the numbers",
    "known_bug(entry_id): judge this case against a known-bug registry entry; several markers: the entry whose carried_by holds the child's torch_xla judges it",
    "no_sharding_baseline(reason): keep this case out of the sharding baseline (its recorded tensors vary by design)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def _looks_like_xdist_worker() -> bool:
    """Before config.workerinput exists (it is set after the early hooks), a worker shows as an
    execnet process (`python -c ...`) with xdist's variable set. The variable alone is not enough:
    a pytest started from inside a worker (pytester, a subprocess) inherits it. A wrong guess
    costs the early start only; identity proper comes from config.workerinput (harness.run.session)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and sys.argv[:1] == ["-c"]


def _information_only(options: Any) -> bool:
    return any(getattr(options, name, False) for name in INFORMATION_ONLY_OPTIONS)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Before conftests and test modules load: start the run's fork servers (harness.isolation.runservers),
    so torch_xla's import overlaps pytest's own start-up. Only for a run that may hold SPMD cases
    and will run them: `--help` or `--collect-only` write and start nothing."""
    if _looks_like_xdist_worker():
        return  # only the controlling process starts servers; workers get their addresses
    namespace = early_config.known_args_namespace
    if activation.project_owns_spmd_marker(early_config):
        return  # its items marked spmd are its own: nothing starts early (nor late: activation.is_spmd)
    if _information_only(namespace) or not activation.selects_spmd_early(
        namespace, early_config.rootpath, early_config.getini("testpaths")
    ):
        return  # a run that may hold no SPMD case decides after collection (pytest_collection_finish)
    early_config.stash[EARLY_KEY] = True
    try:

        def value(name: str) -> Any:
            return options.value(early_config, name, namespace)

        backend = make_backend(value("spmd_backend"), value("spmd_devices"))
        wanted = fork_server_wanted(value("spmd_fork_server"), backend)
        run = runfolder.RunFolder.new(options.results_dir(early_config, namespace), value("spmd_run_id"))
    except (pytest.UsageError, HarnessError, AttributeError, ValueError, TypeError):
        return  # pytest_configure reports a bad option as a usage error
    early_config.stash[RUN_FOLDER_KEY] = run
    if not (wanted and runservers.servers_can_start(backend)):
        return
    try:
        share_dump_root(run.claim())
    except (HarnessError, OSError):
        return  # pytest_configure or the first case reports it
    servers = runservers.RunServers()
    early_config.stash[RUN_SERVERS_KEY] = servers
    now, after_collection = runservers.specs_to_start(backend, options.xdist_distributes(namespace))
    servers.start(now, run.path / runfolder.LOGS_DIR / "main", after_collection=after_collection)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """One line that says what the run uses: which backend and devices, which torch_xla stack,
    where its results go (the run folder is made when the first SPMD case has something to write)."""
    harness = config.stash.get(SESSION_KEY, None)
    if harness is None or harness.worker != "main" or not harness.active:
        return None  # a run that selects SPMD cases only after collection: pytest_report_collectionfinish
    harness.header_shown = True
    return harness.header_lines(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    """The header of a run that turned out to select SPMD cases at collection."""
    harness = config.stash.get(SESSION_KEY, None)
    if harness is None or harness.worker != "main" or not harness.active or harness.header_shown:
        return None
    harness.header_shown = True
    return harness.header_lines(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller, for each worker it starts: the run's folder and its fork servers' addresses."""
    harness = node.config.stash[SESSION_KEY]
    node.workerinput[WORKERINPUT_RUN_KEY] = harness.run.to_workerinput()
    node.workerinput[WORKERINPUT_ACTIVE_KEY] = harness.active
    base = basecheck.to_workerinput(node.config)
    if base is not None:
        node.workerinput[basecheck.WORKERINPUT_KEY] = base
    servers = node.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        node.workerinput[runservers.WORKERINPUT_KEY] = runservers.addresses_to_workerinput(servers.addresses())
        servers.worker_started()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist controller: once every worker has collected, the servers waiting for it start."""
    servers = node.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        servers.worker_collected()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker that went down collects nothing more: nothing may wait for it."""
    servers = node.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        servers.start_waiting_imports()


def pytest_configure(config: pytest.Config) -> None:
    _register_markers(config)
    caseuser.configure(config)  # before any child starts
    config.pluginmanager.register(_JunitGuard(), "spmd_junit_guard")
    session = HarnessSession(config)
    config.stash[SESSION_KEY] = session
    _check_bug_option(config, session.registry_path)  # before xdist's workers would each refuse it
    shardingcheck.configure(config, session.backend)
    costcheck.configure(config, session.backend, load=False)
    workerinput = getattr(config, "workerinput", None)
    if config.stash.get(EARLY_KEY, False) or (workerinput or {}).get(WORKERINPUT_ACTIVE_KEY):
        session.activate(config)
    elif (_names_input_files(config) or _distributes(config, workerinput)) and not getattr(
        config.option, "help", False
    ):
        # A file the user named is checked now, in the xdist controller too; so is a default file
        # the workers would read: a worker's usage error ends the run as "no tests ran", naming nothing.
        load_inputs(session, config)
        if _distributes(config, workerinput):
            config.stash[costcheck.SESSION_KEY].read_unless_probed()
    basecheck.configure(config, session.backend, session.run.path)  # only with --spmd-compare
    if workerinput is None:
        checkoutwatch.take(config)  # a case that rewrites the harness fails the run (harness.run.checkoutwatch)
        config.pluginmanager.register(WholeFailedLines(), "spmd_whole_failed_lines")
        config.pluginmanager.register(Findings(), "spmd_findings")


def _distributes(config: pytest.Config, workerinput: Any) -> bool:
    """This process is the controller of xdist workers."""
    return workerinput is None and options.xdist_distributes(config.option)


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
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.pool.close()
    servers = config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        servers.close()  # after the pool: its children are ended first
    if getattr(config, "workerinput", None) is not None:
        processes.continue_if_stopped(os.getppid())  # the controller, if a case stopped it (SIGSTOP)
    if session is not None and session.worker == "main":
        writing.recheck_run(config, session)
        remove_dump_root(session.run.path)
    if getattr(config, "workerinput", None) is None and _refused(config):
        run = session.run if session is not None else config.stash.get(RUN_FOLDER_KEY, None)
        if run is not None:
            run.retire()  # a run refused before any case leaves no folder, and `latest` keeps the last real run


def _refused(config: pytest.Config) -> bool:
    """The run stopped on a usage error (a bad option, base run or registry), collected nothing, or
    stopped before its session began: it ran no case, and leaves nothing behind."""
    session = config.stash.get(PYTEST_SESSION_KEY, None)
    return session is None or session.exitstatus in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED)


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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse unknown or overlapping known_bug entries before any case runs (exit 4, usage error),
    each problem once with the cases that share it (a misspelt id on a parametrised case is one
    mistake); then keep only the cases of --spmd-bug's entry."""
    problems: dict[str, list[str]] = {}
    registry_path = config.stash[SESSION_KEY].registry_path
    for item in items:
        if not activation.is_spmd(item):
            continue  # a foreign test's known_bug marker is its own
        try:
            item.stash[ENTRIES_KEY] = registrycheck.entries_of(item, registry_path)
        except RegistryError as exc:
            problems.setdefault(str(exc), []).append(item.nodeid)
    if problems:
        raise pytest.UsageError(
            "known-bug registry:\n  "
            + "\n  ".join(f"{_cases_named(nodeids)}: {problem}" for problem, nodeids in problems.items())
        )
    bug = options.value(config, "spmd_bug")
    if bug:
        _select_bug(config, items, bug, registry_path)


def _cases_named(nodeids: list[str]) -> str:
    shown = ", ".join(nodeids[:3])
    return shown + (f" and {len(nodeids) - 3} more case(s)" if len(nodeids) > 3 else "")


def _check_bug_option(config: pytest.Config, registry_path: Path) -> None:
    """--spmd-bug=ID names an entry of the registry, or the run is refused (exit 4). At configure
    time: under xdist a worker's refusal at collection ended the run as an INTERNALERROR."""
    bug = options.value(config, "spmd_bug")
    if not bug or getattr(config.option, "help", False):
        return
    try:
        get_entry(bug, registry_path)
    except RegistryError as exc:
        raise pytest.UsageError(f"--spmd-bug={bug}: {exc}") from None


def _select_bug(config: pytest.Config, items: list[pytest.Item], bug: str, registry_path: Path) -> None:
    """--spmd-bug=ID: the SPMD cases whose known_bug markers name registry entry ID, and nothing else."""
    _check_bug_option(config, registry_path)
    keep = [item for item in items if activation.is_spmd(item) and bug in {e.id for e in item.stash[ENTRIES_KEY]}]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


class _JunitGuard:
    """pytest's junitxml opens its file with a plain open() at the session's end: a named pipe a
    case put there (results/junit.xml is the case's to write) would hang the run. Runs first."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        harness = session.config.stash.get(SESSION_KEY, None)
        xmlpath = getattr(session.config.option, "xmlpath", None)
        if harness is not None and xmlpath and (harness.active or harness.run.exists()):
            with contextlib.suppress(OSError):
                files.clear_for_writer(xmlpath)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    harness = session.config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    if not harness.active:
        if harness.worker == "main" and harness.run.exists():
            writing.close_run(session, harness)  # an xdist controller whose workers found SPMD cases
        return
    for fault in harness.pool.idle_deaths():
        harness.charge_late_fault(fault)
    for check in _baseline_checks(session.config):
        check.finish(session)
    if harness.late_faults and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if harness.worker == "main":
        writing.close_run(session, harness)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """xdist controller: a worker died while running `crashitem`. The worker could not write that
    case's record, so the controller does: a started case always leaves a failed record."""
    worker_node = getattr(report, "node", None)  # xdist's WorkerController for the dead worker
    harness = worker_node.config.stash.get(SESSION_KEY, None) if worker_node is not None else None
    if harness is None or worker_node is None or not (harness.active or harness.run.exists()):
        return  # a foreign project's crash: not the harness's to record
    worker = getattr(getattr(worker_node, "gateway", None), "id", "?")
    reason = f"xdist worker {worker} crashed while running this case (the worker process died; see the pytest output)"
    writing.write_crash_record(harness, worker_node.config, crashitem, reason, str(report.longrepr))


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[PYTEST_SESSION_KEY] = session
    servers = session.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None and not session.config.pluginmanager.has_plugin("dsession"):
        # The command line asked for workers, but xdist started none (-n auto with --pdb or on
        # one core, --dist no): nobody will collect, so the servers waiting for that import now.
        servers.start_waiting_imports()


# tryfirst: a run that found its SPMD cases only in xdist workers prints its header here, and the
# header comes before what other parts of the harness summarise (the base comparison's section).
@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    harness = config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    hint = _no_case_hint(config) if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED else None
    if hint:
        terminalreporter.write_line(hint, yellow=True)
    if not harness.active:
        if harness.worker == "main" and harness.run.exists():  # xdist workers found SPMD cases
            for line in harness.header_lines(config):
                terminalreporter.write_line(line)
        return
    for check in _baseline_checks(config):
        check.summarise(terminalreporter)
    if not harness.late_faults:
        return
    terminalreporter.section("faults after a case's verdict (charged to that case)", red=True)
    for fault in harness.late_faults:
        terminalreporter.line(f"FAULT {fault.case}: {headline(fault.evidence)}", red=True)
        terminalreporter.line(fault.log_tail)


def pytest_itemcollected(item: pytest.Item) -> None:
    """At the first SPMD case collected, start the import (a fork server's): it overlaps collection.
    A run whose options may still deselect that case waits for the end of collection."""
    harness = item.config.stash[SESSION_KEY]
    if harness.early_start_done or not activation.is_spmd(item) or item.config.option.collectonly:
        return
    if not harness.active and activation.may_be_deselected(item):
        return
    harness.early_start_done = True
    harness.activate(item.config)
    if harness.pool.fork and not harness.backend.exclusive_device and harness.backend.capabilities().has_xla:
        harness.claim_run_folder()
        runner = SpmdRunner(harness.pool, harness.backend, harness.case_timeout, "prewarm")
        harness.pool.prewarm(runner.spec(functionalization=True))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the first child while pytest gets going: torch_xla's import overlaps the rest.

    capabilities() comes first on purpose: on a TPU host its probe process must have released
    the chips before the warm child takes them.
    """
    harness = session.config.stash[SESSION_KEY]
    spmd_items = [item for item in session.items if activation.is_spmd(item)]
    if session.config.option.collectonly or not spmd_items:
        return
    harness.activate(session.config)
    if not harness.backend.capabilities().has_xla:
        return
    shardingcheck.session_of(
        session.config
    ).baseline()  # read at configure time, except a TPU's (see session.load_inputs)
    runner = SpmdRunner(harness.pool, harness.backend, harness.case_timeout, "prewarm")
    # Cases parametrized over `functionalization` say which modes this selection needs. Only one
    # child is prewarmed where the cores are already busy (xdist) or the device is exclusive (TPU):
    # there a second import would only delay the first verdict.
    modes = [m for m in (True, False) if any(_functionalization_of(item) == m for item in spmd_items)]
    if harness.worker != "main" or harness.backend.exclusive_device:
        modes = modes[:1]
    if modes:
        harness.claim_run_folder()
    for mode in modes:
        harness.pool.prewarm(runner.spec(functionalization=mode))


def _functionalization_of(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("functionalization", True) if callspec else True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not activation.is_spmd(item):
        return  # a foreign test's needs marker is its own
    harness = item.config.stash[SESSION_KEY]
    reason = unmet_needs(item, harness.backend)
    if reason:
        # Reported at the case (its file and line), as a skip marker would be, not at this hook.
        raise pytest.skip.Exception(reason, _use_item_location=True)


@pytest.fixture
def spmd(request: pytest.FixtureRequest) -> Iterator[SpmdRunner]:
    """Runs case bodies in child processes; see harness.isolation.case.SpmdRunner.run."""
    if activation.project_owns_spmd_marker(request.config):
        pytest.fail(activation.OWNED_MARKER_ERROR, pytrace=False)  # rather than a case half-judged
    harness = request.config.stash[SESSION_KEY]
    harness.activate(request.config)  # a test that asks for the fixture is an SPMD case, marked or not
    journal = harness.claim_run_folder() / runfolder.requests_name(harness.worker)
    runner = SpmdRunner(
        harness.pool,
        harness.backend,
        harness.case_timeout,
        results.item_case_id(request.node),
        journal,
        late_faults=harness.charge_late_fault,
    )
    request.node.stash[RUNNER_KEY] = runner
    yield runner


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    case_id = results.item_case_id(item)
    if call.when == "setup" and activation.is_spmd(item) and case_id != item.nodeid:
        item.user_properties.append((writing.CASE_ID_PROPERTY, case_id))  # before the report copies them
    report: pytest.TestReport = yield
    spmd = activation.is_spmd(item)
    if call.when == "call":
        case = JudgedCase.of(item)
        registrycheck.judge(item, call, report, case)
        case.sharding_changes = shardingcheck.judge(
            item, report, case.case_id, case.shardings, case.torch_xla, case.runner
        )
        costcheck.judge(item, report, case.runner, case.torch_xla, call.excinfo is None)
        basecheck.judge(item, report, case.case_id, case.shardings, case.torch_xla, call.excinfo is None)
        if spmd:
            writing.write_case_record(item, call, report, case)
        if not report.passed:
            _settle_updates(item, passed=False)
    elif call.when == "setup" and not report.passed and spmd:
        writing.write_case_record(item, call, report, JudgedCase.of(item))
    elif call.when == "teardown":
        _settle_updates(item, passed=report.passed)
    return report


def _settle_updates(item: pytest.Item, passed: bool) -> None:
    """An update run writes a case only once pytest reported it passed in set-up, call and teardown."""
    for check in _baseline_checks(item.config):
        check.updates.settle(item.nodeid, passed)


def _baseline_checks(config: pytest.Config) -> list[BaselineSession[Any]]:
    """The sharding and the cost check, in the order they judge (either is missing before configure)."""
    sessions = (config.stash.get(shardingcheck.SESSION_KEY, None), config.stash.get(costcheck.SESSION_KEY, None))
    return [s for s in sessions if s is not None]
