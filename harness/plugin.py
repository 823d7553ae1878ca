"""The pytest plugin (entry point `pytest11: spmd_harness`).

It adds the options, resolves what each case needs at run time (never at import), gives tests
the `spmd` fixture that runs bodies in child processes, has each case judged (the known-bug
registry, then the sharding and the cost baselines, each by its own module) and writes one
CaseRecord per SPMD case to the results folder. The pytest process itself never imports torch or
torch_xla.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from _pytest._code.code import ReprEntryNative  # pytest's own printable traceback entry

from harness.baselinefile import BaselineSession
from harness.config import activation, options
from harness.config.backends import make_backend
from harness.config.requirements import unmet_needs
from harness.errors import CaseError, HarnessError, RegistryError
from harness.isolation import runservers
from harness.isolation.backend import Backend
from harness.isolation.case import CaseResult, SpmdRunner
from harness.isolation.child_process import LateFault
from harness.isolation.evidence import headline
from harness.isolation.pool import ChildPool
from harness.isolation.processes import signal_name
from harness.isolation.protocol import XLA_DUMP_ROOT_ENV
from harness.judges import basecheck, costcheck, shardingcheck
from harness.records import results, runfolder, versions
from harness.registry import (
    REGISTRY_PATH,
    Judgement,
    JudgementKind,
    KnownBug,
    check_disjoint,
    get_entry,
    judge,
    load_registry,
)

SESSION_KEY = pytest.StashKey["HarnessSession"]()
RUNNER_KEY = pytest.StashKey[SpmdRunner]()
ENTRIES_KEY = pytest.StashKey[list[KnownBug]]()
RUN_SERVERS_KEY = pytest.StashKey[runservers.RunServers]()
RUN_FOLDER_KEY = pytest.StashKey[runfolder.RunFolder]()
PYTEST_SESSION_KEY = pytest.StashKey[pytest.Session]()
EARLY_KEY = pytest.StashKey[bool]()  # the command line selects SPMD cases (harness.config.activation)
WORKERINPUT_RUN_KEY = "spmd_harness_run"
WORKERINPUT_ACTIVE_KEY = "spmd_harness_active"
CASE_ID_PROPERTY = "spmd_case_id"  # a report's user property: the case's stable name (results.case_id)
# Options that make pytest print something and stop: the plugin then writes and starts nothing.
INFORMATION_ONLY_OPTIONS = ("help", "version", "collectonly", "markers", "showfixtures", "show_fixtures_per_test")
# A write into the results folder that fails with one of these cannot succeed for the next case
# either: the run stops with a message instead of an INTERNALERROR.
RESULTS_WRITE_FATAL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
# Evidence kept in a record: the cause leads, so the head is kept (tails are bounded already).
RECORD_EVIDENCE_LIMIT = 8000

MARKERS = (
    activation.SPMD_MARKER_LINE,
    "needs(backend=None, devices=0, jax=False, multislice=False, xla=True, reason=''): what a case needs from the backend; unmet needs skip with the numbers",
    "known_bug(entry_id): judge this case against a known-bug registry entry; several markers: the entry whose carried_by holds the child's torch_xla judges it",
    "no_sharding_baseline(reason): keep this case out of the sharding baseline (its recorded tensors vary by design)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


class HarnessSession:
    """Per-pytest-process state: one backend, one pool of warm children, one results folder."""

    def __init__(self, config: pytest.Config) -> None:
        self.backend: Backend = make_backend(
            options.value(config, "spmd_backend"), options.value(config, "spmd_devices")
        )
        self.case_timeout: float = options.value(config, "spmd_case_timeout")
        workerinput = getattr(config, "workerinput", None)
        self.worker = _worker_name(config)
        self.run = _run_folder(config)
        self.results_dir = self.run.path  # made only when the run has something to write (claim)
        # The run's shared fork servers: this process's own (started early), or the controller's.
        if workerinput is not None:
            shared = runservers.addresses_from_workerinput(workerinput.get(runservers.WORKERINPUT_KEY))
        else:
            run_servers = config.stash.get(RUN_SERVERS_KEY, None)
            shared = run_servers.addresses() if run_servers else {}
        # Under xdist every core already runs a worker: spare children would only compete.
        self.pool = ChildPool(
            self.results_dir / runfolder.LOGS_DIR / self.worker,
            startup_timeout=self.case_timeout,
            exclusive=self.backend.exclusive_device,
            spares=self.worker == "main",
            fork=_fork_server_wanted(options.value(config, "spmd_fork_server"), self.backend),
            servers=shared,
        )
        self.registry_path = Path(options.value(config, "spmd_known_bugs") or REGISTRY_PATH).resolve()
        self.late_faults: list[LateFault] = []
        self.early_start_done = False
        # Inert until the run selects an SPMD case (harness.config.activation): no process, file, line.
        self.active = False
        self.header_shown = False

    def claim_run_folder(self) -> Path:
        """The run folder, made with its manifest the first time this run has something to write."""
        try:
            folder = self.run.claim()
        except HarnessError as exc:
            raise pytest.UsageError(f"results folder: {exc}") from None
        _share_dump_root(folder)
        return folder

    def activate(self, config: pytest.Config) -> None:
        """The run selects SPMD cases: read the inputs (a bad file stops it now) and take SIGTERM."""
        if self.active:
            return
        self.active = True
        if not getattr(config.option, "help", False):  # --help must work whatever state the files are in
            _load_inputs(self, config)
            config.stash[costcheck.SESSION_KEY].read_unless_probed()
        _stop_on_sigterm(config)

    def header_lines(self, config: pytest.Config) -> list[str]:
        """What the run uses: backend and devices, the torch_xla stack, where results go, the base run."""
        count = getattr(self.backend, "devices", None)  # a TPU host's chips are probed at the first case
        devices = f"{count} devices" if count else "this host's chips"
        compared = basecheck.report_header(config)
        return [
            f"spmd harness {versions.harness()}: backend {self.backend.name}, {devices}; "
            f"{versions.describe(versions.stack())}; results {self.run.path}"
        ] + ([compared] if compared else [])

    def charge_late_fault(self, fault: LateFault) -> None:
        """A child misbehaved after a case's verdict: that case's record says so, and the run fails."""
        self.late_faults.append(fault)
        self.claim_run_folder()
        results.write_amendment(self.results_dir, fault.case, _bounded(fault.evidence), self.worker)


def _worker_name(config: pytest.Config) -> str:
    """xdist's own worker id (gw0, ...), else "main". Not $PYTEST_XDIST_WORKER: a pytest started
    from inside a worker (pytester, a subprocess) inherits that variable without being a worker."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput is not None else "main"


def _run_folder(config: pytest.Config) -> runfolder.RunFolder:
    """This run's folder: the controller's (xdist workers), the early hook's, or a new one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKERINPUT_RUN_KEY in workerinput:
        return runfolder.RunFolder.from_workerinput(workerinput[WORKERINPUT_RUN_KEY])
    early = config.stash.get(RUN_FOLDER_KEY, None)
    if early is not None:
        return early
    try:
        return runfolder.RunFolder.new(
            Path(options.value(config, "spmd_results_dir")), options.value(config, "spmd_run_id")
        )
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None


def _looks_like_xdist_worker() -> bool:
    """Before config.workerinput exists (it is set after the early hooks), a worker shows as an
    execnet process (`python -c ...`) with xdist's variable set. The variable alone is not enough:
    a pytest started from inside a worker (pytester, a subprocess) inherits it. A wrong guess
    costs the early start only; identity proper comes from config.workerinput (_worker_name)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and sys.argv[:1] == ["-c"]


def _information_only(options: Any) -> bool:
    return any(getattr(options, name, False) for name in INFORMATION_ONLY_OPTIONS)


def _fork_server_wanted(option: str | None, backend: Backend) -> bool:
    choice = option or "auto"
    return choice == "on" or (choice == "auto" and backend.name == "cpu")


def _bounded(text: str, limit: int = RECORD_EVIDENCE_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters in the child log ...]"


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
        wanted = _fork_server_wanted(value("spmd_fork_server"), backend)
        run = runfolder.RunFolder.new(Path(value("spmd_results_dir")), value("spmd_run_id"))
    except (pytest.UsageError, HarnessError, AttributeError, ValueError, TypeError):
        return  # pytest_configure reports a bad option as a usage error
    early_config.stash[RUN_FOLDER_KEY] = run
    if not (wanted and runservers.servers_can_start(backend)):
        return
    try:
        _share_dump_root(run.claim())
    except (HarnessError, OSError):
        return  # pytest_configure or the first case reports it
    servers = runservers.RunServers()
    early_config.stash[RUN_SERVERS_KEY] = servers
    servers.start(runservers.specs_to_start(backend), run.path / runfolder.LOGS_DIR / "main")


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
    servers = node.config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        node.workerinput[runservers.WORKERINPUT_KEY] = runservers.addresses_to_workerinput(servers.addresses())


def pytest_configure(config: pytest.Config) -> None:
    _register_markers(config)
    session = HarnessSession(config)
    config.stash[SESSION_KEY] = session
    shardingcheck.configure(config, session.backend)
    costcheck.configure(config, session.backend, load=False)
    workerinput = getattr(config, "workerinput", None)
    if config.stash.get(EARLY_KEY, False) or (workerinput or {}).get(WORKERINPUT_ACTIVE_KEY):
        session.activate(config)
    elif _names_input_files(config) and not getattr(config.option, "help", False):
        _load_inputs(session, config)  # a file the user named is checked now, in the xdist controller too
    basecheck.configure(config, session.backend, session.run.path)  # only with --spmd-compare


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


def _load_inputs(session: HarnessSession, config: pytest.Config) -> None:
    """Read the registry (and the baseline) now, at configure time, in the xdist controller too:
    a malformed file is a usage error naming it before any case runs, not an INTERNALERROR in a
    worker, nor a wrong judgement."""
    try:
        load_registry(session.registry_path)
    except RegistryError as exc:
        raise pytest.UsageError(f"known-bug registry: {exc}") from None
    # A TPU's default baseline is named by its device count, which takes a probe of the chips:
    # that one is read at the end of collection, still before any case runs.
    shardingcheck.session_of(config).read_unless_probed()


def _stop_on_sigterm(config: pytest.Config) -> None:
    """SIGTERM ends the run like Ctrl-C: children are ended, finished cases keep their records and JUnit."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # someone else (xdist, a wrapper) handles it

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"pytest received {signal_name(signum)}")

    def restore_sigterm() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, interrupt)
    config.add_cleanup(restore_sigterm)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.pool.close()
    servers = config.stash.get(RUN_SERVERS_KEY, None)
    if servers is not None:
        servers.close()  # after the pool: its children are ended first
    if session is not None and session.worker == "main":
        _recheck_run(config, session)
        # The children's XLA dumps (a failing case kept its own in its record's folder already).
        shutil.rmtree(session.run.path / runfolder.XLA_DUMPS_DIR, ignore_errors=True)


def _share_dump_root(run_path: Path) -> None:
    """Children (and servers started from now on) put their XLA dumps under the run's folder."""
    if not os.environ.get(XLA_DUMP_ROOT_ENV):
        root = run_path / runfolder.XLA_DUMPS_DIR
        root.mkdir(exist_ok=True)
        os.environ[XLA_DUMP_ROOT_ENV] = str(root)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse unknown or overlapping known_bug entries before any case runs (exit 4, usage error)."""
    problems = []
    registry_path = config.stash[SESSION_KEY].registry_path
    for item in items:
        if not activation.is_spmd(item):
            continue  # a foreign test's known_bug marker is its own
        try:
            item.stash[ENTRIES_KEY] = _entries_of(item, registry_path)
        except RegistryError as exc:
            problems.append(f"{item.nodeid}: {exc}")
    if problems:
        raise pytest.UsageError("known-bug registry:\n  " + "\n  ".join(dict.fromkeys(problems)))


def _entries_of(item: pytest.Item, registry_path: Path) -> list[KnownBug]:
    ids = []
    for marker in item.iter_markers("known_bug"):
        if len(marker.args) != 1 or not isinstance(marker.args[0], str):
            raise RegistryError(f"known_bug takes one entry id, got {marker.args!r}")
        if marker.args[0] not in ids:
            ids.append(marker.args[0])
    entries = [get_entry(entry_id, registry_path) for entry_id in ids]
    check_disjoint(entries)
    return entries


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    harness = session.config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
    if not harness.active:
        if harness.worker == "main" and harness.run.exists():
            _close_run(session, harness)  # an xdist controller whose workers found SPMD cases
        return
    for fault in harness.pool.idle_deaths():
        harness.charge_late_fault(fault)
    for check in _baseline_checks(session.config):
        check.finish(session)
    if harness.late_faults and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if harness.worker == "main":
        _close_run(session, harness)


def _close_run(session: pytest.Session, harness: HarnessSession) -> None:
    """The manifest says how the run ended and which tests pytest saw fail, so harness.report can
    tell a finished run from a killed one and find failures that have no case record."""
    stats = getattr(session.config.pluginmanager.get_plugin("terminalreporter"), "stats", {})
    counts = {
        key: len(reports)
        for key, reports in stats.items()
        if key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
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
    problems = harness.run.manifest_problems() + basecheck.planted_comparison(session.config, harness.run.path)
    for problem in problems:
        session.config.get_terminal_writer().line(f"spmd harness: {problem}", red=True)
    if problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    try:
        harness.run.finish(
            int(session.exitstatus),
            counts,
            failed_ids,
            str(Path(xmlpath).absolute()) if xmlpath else None,
            problems,
        )
    except (OSError, ValueError) as exc:
        session.config.get_terminal_writer().line(
            f"spmd harness: could not close the run manifest in {harness.run.path}: {exc}", red=True
        )


def _recheck_run(config: pytest.Config, harness: HarnessSession) -> None:
    """Every process of the run has ended: the manifest must still be the one pytest wrote."""
    try:
        problem = harness.run.recheck()
    except (OSError, ValueError) as exc:
        problem = f"could not check the run manifest in {harness.run.path}: {exc}"
    if problem is None:
        return
    config.get_terminal_writer().line(f"spmd harness: {problem}", red=True)
    session = config.stash.get(PYTEST_SESSION_KEY, None)
    if session is not None and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    record = results.CaseRecord(
        nodeid=crashitem,
        family=results.family_of(crashitem),
        outcome="failed",
        reason=reason,
        evidence=str(report.longrepr),
        backend=harness.backend.name,
        devices=harness.backend.capabilities().devices,
        **_stack_versions(),
    )
    _write_results(
        harness, worker_node.config, lambda: results.write_record(harness.claim_run_folder(), record, harness.worker)
    )


def _write_results(harness: HarnessSession, config: pytest.Config, write: Callable[[], None]) -> None:
    """Run one write into the results folder. A full disk (or a read-only or failing one) cannot
    serve the next case either: the run stops after this case with a message naming the folder,
    and every record written before stays as it was."""
    try:
        write()
    except OSError as exc:
        if exc.errno not in RESULTS_WRITE_FATAL:
            raise
        message = (
            f"the results folder {harness.results_dir} cannot be written ({exc.strerror}); "
            "the run stops here, records written so far are kept. Free space or use --spmd-results-dir"
        )
        config.get_terminal_writer().line(f"\nspmd harness: {message}", red=True)
        session = config.stash.get(PYTEST_SESSION_KEY, None)
        if session is not None:
            session.shouldstop = message


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[PYTEST_SESSION_KEY] = session


# tryfirst: a run that found its SPMD cases only in xdist workers prints its header here, and the
# header comes before what other parts of the harness summarise (the base comparison's section).
@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    harness = config.stash.get(SESSION_KEY, None)
    if harness is None:
        return
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
    shardingcheck.session_of(session.config).baseline()  # read at configure time, except a TPU's (see _load_inputs)
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
    if call.when == "setup" and activation.is_spmd(item) and results.item_case_id(item) != item.nodeid:
        item.user_properties.append((CASE_ID_PROPERTY, results.item_case_id(item)))  # before the report copies them
    report: pytest.TestReport = yield
    spmd = activation.is_spmd(item)
    if call.when == "call":
        case = JudgedCase.of(item)
        _apply_registry(item, call, report, case)
        case.sharding_changes = shardingcheck.judge(
            item, report, case.case_id, case.shardings, case.torch_xla, case.runner
        )
        costcheck.judge(item, report, case.runner, case.torch_xla, call.excinfo is None)
        basecheck.judge(item, report, case.case_id, case.shardings, case.torch_xla, call.excinfo is None)
        if spmd:
            _write_record(item, call, report, case)
        if not report.passed:
            _settle_updates(item, passed=False)
    elif call.when == "setup" and not report.passed and spmd:
        _write_record(item, call, report, JudgedCase.of(item))
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


@dataclasses.dataclass
class JudgedCase:
    """One case as the plugin judges it, gathered once (after its call, or at a failed set-up):
    the registry and the baselines read it and add what they found, and its record is written
    from it."""

    case_id: str  # the stable name records and baselines use (results.case_id)
    runner: SpmdRunner | None  # None: the case never reached the spmd fixture
    entries: list[KnownBug]  # the known_bug entries it names
    torch_xla: str | None  # what its children ran: the last body that reported a version
    shardings: dict[str, str]  # what its bodies recorded (a later body's tensor wins)
    judgement: Judgement | None = None  # the registry's, for a case that names entries
    sharding_changes: list[str] = dataclasses.field(default_factory=list)  # against its baseline entry

    @classmethod
    def of(cls, item: pytest.Item) -> JudgedCase:
        runner = item.stash.get(RUNNER_KEY, None)
        ran = runner.results if runner else []
        reported = [r.torch_xla for r in ran if r.torch_xla]
        shardings: dict[str, str] = {}
        for result in ran:
            shardings.update(result.shardings)
        return cls(
            case_id=results.item_case_id(item),
            runner=runner,
            entries=item.stash.get(ENTRIES_KEY, []),
            torch_xla=reported[-1] if reported else None,
            shardings=shardings,
        )

    @property
    def results(self) -> list[CaseResult]:
        return self.runner.results if self.runner else []


def _case_id_of_report(report: Any) -> str:
    """A report's case name; set by the worker that ran it (the xdist controller has no items)."""
    return dict(getattr(report, "user_properties", ())).get(CASE_ID_PROPERTY, report.nodeid)


def _evidence(call: pytest.CallInfo[None]) -> str | None:
    if call.excinfo is None:
        return None
    exc = call.excinfo.value
    if isinstance(exc, CaseError):
        return exc.evidence
    return call.excinfo.exconly()


def _apply_registry(
    item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport, case: JudgedCase
) -> None:
    if not case.entries or report.skipped:
        return
    judgement = case.judgement = judge(case.entries, case.torch_xla, _evidence(call))
    item.user_properties.append(("known_bug", judgement.entry or case.entries[0].id))
    item.user_properties.append(("registry_verdict", judgement.kind.value))
    if judgement.kind is JudgementKind.REPRODUCED:
        report.outcome = "skipped"
        report.wasxfail = judgement.message
    elif judgement.kind is JudgementKind.UNEXPECTED_PASS:
        report.outcome = "failed"
        report.longrepr = judgement.message
    elif judgement.kind is not JudgementKind.PASSED:
        _lead_with_judgement(report, judgement.message)


def _lead_with_judgement(report: pytest.TestReport, message: str) -> None:
    """Put the registry's judgement first: the first lines of the failure, the FAILED summary line
    and the JUnit message, ahead of the traceback (which stays, below it)."""
    longrepr = report.longrepr
    chain = getattr(longrepr, "chain", None)
    first = chain[0][0] if chain else getattr(longrepr, "reprtraceback", None)
    entries = getattr(first, "reprentries", None)
    if entries is None:
        report.longrepr = f"{message}\n\n{longrepr}"
        return
    # ReprEntryNative prints its lines as they are and survives xdist's report serialization.
    entries.insert(0, ReprEntryNative([f"{message}\n\n"]))
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        crash.message = message


def _outcome_of(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return report.outcome


def _write_record(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport, case: JudgedCase) -> None:
    harness = item.config.stash[SESSION_KEY]
    judgement, entries = case.judgement, case.entries
    record = results.CaseRecord(
        nodeid=case.case_id,
        family=results.family_of(case.case_id),
        outcome=_outcome_of(report),
        reason=_reason(report, judgement),
        known_bug=(judgement.entry if judgement and judgement.entry else entries[0].id if entries else None),
        known_bugs=[e.id for e in entries],
        registry_verdict=judgement.kind.value if judgement else None,
        signature=judgement.signature if judgement else None,
        evidence=_bounded(_evidence(call) or ""),
        torch_xla=case.torch_xla,
        backend=harness.backend.name,
        devices=harness.backend.capabilities().devices,
        duration_s=round(report.duration, 3),
        body_s=round(sum(r.duration_s for r in case.results), 3) if case.runner else 0.0,
        shardings=case.shardings,
        sharding_changes=case.sharding_changes,
        sharding_baseline=item.get_closest_marker("no_sharding_baseline") is None,
        **costcheck.record_fields(item),
        **_stack_versions(),
    )

    def write() -> None:
        folder = harness.claim_run_folder()
        for result in case.results:
            results.keep_texts(folder / runfolder.HLO_DIR, case.case_id, result.hlo, ".txt")
        costcheck.keep_dumps(folder, item, report.failed)
        results.write_record(folder, record, harness.worker)

    _write_results(harness, item.config, write)


class StackVersions(TypedDict):
    torch: str | None
    jax: str | None
    harness: str | None


def _stack_versions() -> StackVersions:
    """torch, jax and the harness as installed in this venv (the children run the same one)."""
    stack = versions.stack()
    return {"torch": stack["torch"], "jax": stack["jax"], "harness": versions.harness()}


def _reason(report: pytest.TestReport, judgement: Judgement | None) -> str:
    if judgement is not None:
        return judgement.message
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.failed and report.longrepr is not None:
        crash = getattr(report.longrepr, "reprcrash", None)
        return headline(crash.message if crash else str(report.longrepr), 500)
    return ""
