"""What one pytest process of a run holds (HarnessSession): its role, its backend, its pool of
warm children, its run folder, the known-bug registry it reads, its judges in the order they
judge, the faults charged after a verdict, and whether the run is the harness's at all yet; the
stash keys the plugin keeps it under."""

from __future__ import annotations

import functools
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.config import jobsize, options
from harness.config.backends import make_backend
from harness.errors import HarnessError, RegistryError
from harness.isolation.backend import Backend
from harness.isolation.parent import runservers
from harness.isolation.parent.child_process import LateFault
from harness.isolation.parent.pool import ChildPool
from harness.isolation.system.processes import signal_name
from harness.judges import basecheck
from harness.judges.basecheck import BaseRunJudge
from harness.judges.costcheck import CostJudge
from harness.judges.judging import Judge
from harness.judges.registrycheck import RegistryJudge
from harness.judges.shardingcheck import ShardingJudge
from harness.records import buildid, results, runfolder, versions
from harness.registry import REGISTRY_PATH, load_registry
from harness.run import caseuser
from harness.run.dumproot import share_dump_root
from harness.run.role import Role, process_name, role_of

SESSION_KEY = pytest.StashKey["HarnessSession"]()
RUN_SERVERS_KEY = pytest.StashKey[runservers.RunServers]()
RUN_FOLDER_KEY = pytest.StashKey[runfolder.RunFolder]()
PYTEST_SESSION_KEY = pytest.StashKey[pytest.Session]()
EARLY_KEY = pytest.StashKey[bool]()  # the command line selects SPMD cases (harness.config.activation)
WORKERINPUT_RUN_KEY = "spmd_harness_run"
WORKERINPUT_ACTIVE_KEY = "spmd_harness_active"


# Every kind of judge, in the order they judge a case (HarnessSession.judges holds this run's).
JUDGE_ORDER: tuple[type[Judge], ...] = (RegistryJudge, ShardingJudge, CostJudge, BaseRunJudge)


def checked_labels() -> list[str]:
    """The references judges hold cases to, in their order, for the run's `spmd checked:` line
    (a run without a judge counts 0 for its reference: the line says what was not checked too)."""
    return [judge.CHECKED for judge in JUDGE_ORDER if judge.CHECKED]


class HarnessSession:
    """Per-pytest-process state: one backend, one pool of warm children, one results folder."""

    def __init__(self, config: pytest.Config) -> None:
        self.backend: Backend = make_backend(
            options.value(config, "spmd_backend"), options.value(config, "spmd_devices")
        )
        self.case_timeout: float = options.value(config, "spmd_case_timeout")
        self.tier: str = options.value(config, "spmd_tier")
        self.job_size: str = jobsize.size_of(config)
        workerinput = getattr(config, "workerinput", None)
        self.role: Role = role_of(config)
        self.worker = process_name(config)  # the name its logs and records go under
        self.run_folder = _run_folder(config)
        self.results_dir = self.run_folder.path  # made only when the run has something to write (claim)
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
            spares=self.role.owns_run,
            fork=fork_server_wanted(options.value(config, "spmd_fork_server"), self.backend),
            servers=shared,
        )
        self.registry_path = Path(options.value(config, "spmd_known_bugs") or REGISTRY_PATH).resolve()
        # The judges (harness.judges.judging); the base run's is made by configure_compare.
        self.registry_judge = RegistryJudge()
        self.sharding_judge = ShardingJudge(config, self.backend)
        self.cost_judge = CostJudge(config, self.backend)
        self.base_run_judge: BaseRunJudge | None = None
        self.late_faults: list[LateFault] = []
        self.early_start_done = False
        # Inert until the run selects an SPMD case (harness.config.activation): no process, file, line.
        self.active = False
        self.header_shown = False

    def claim_run_folder(self) -> Path:
        """The run folder, made with its manifest the first time this run has something to write."""
        try:
            folder = self.run_folder.claim()
        except HarnessError as exc:
            raise pytest.UsageError(f"results folder: {exc}") from None
        # Only the controller makes a root in memory: it is the one that removes it at the end.
        share_dump_root(folder, in_memory=self.role.owns_run)
        return folder

    @property
    def judges(self) -> list[Judge]:
        """In the order they judge a case (JUDGE_ORDER): the registry (a reproduced bug excuses its
        failure only), the sharding baseline, the cost baseline, the base build's run (it reads the
        registry's judgement)."""
        ordered = [self.registry_judge, self.sharding_judge, self.cost_judge, self.base_run_judge]
        return [judge for judge in ordered if judge is not None]

    def settle_updates(self, nodeid: str, passed: bool) -> None:
        """An update run writes a case only once pytest reported it passed in set-up, call and teardown."""
        for check in (self.sharding_judge, self.cost_judge):
            check.updates.settle(nodeid, passed)

    def configure_compare(self, config: pytest.Config) -> None:
        """--spmd-compare: load the base run now (a bad one is a usage error before any case)."""
        self.base_run_judge = basecheck.configure(config, self.backend, self.run_folder.path, self.role.owns_run)

    def activate(self, config: pytest.Config) -> None:
        """The run selects SPMD cases: read the inputs (a bad file stops it now) and take SIGTERM."""
        if self.active:
            return
        self.active = True
        if not getattr(config.option, "help", False):  # --help must work whatever state the files are in
            load_inputs(self, config)
            self.cost_judge.read_unless_probed()
        _stop_on_sigterm(config)

    def header_lines(self, config: pytest.Config) -> list[str]:
        """What the run uses: backend and devices, the torch_xla stack, where results go, the base run."""
        count = getattr(self.backend, "devices", None)  # a TPU host's chips are probed at the first case
        devices = f"{count} devices" if count else "this host's chips"
        compared = basecheck.report_header(self.base_run_judge, self.build)
        build = (
            [f"torch_xla {self.build.get('torch_xla') or '?'}: {buildid.describe(self.build)}"] if self.build else []
        )
        # the training job's size, where it is not the default the baselines hold
        job = "" if self.job_size == jobsize.DEFAULT else f", {self.job_size} job"
        return [
            f"spmd harness {versions.harness()}: backend {self.backend.name}, {devices}, {self.tier} tier{job}; "
            f"{versions.describe(versions.stack())}; results {self.run_folder.path}",
            *build,
            caseuser.header_line(),
        ] + (compared.splitlines() if compared else [])

    @functools.cached_property
    def build(self) -> dict[str, str | None] | None:
        """The torch_xla build this run uses, by its files (harness.records.buildid): the process
        that owns the run reads it once, for its header and the run folder's build.json."""
        return buildid.identify(fake=self.backend.name == "fake")

    def charge_late_fault(self, fault: LateFault) -> None:
        """A child misbehaved after a case's verdict: that case's record says so, and the run fails."""
        self.late_faults.append(fault)
        self.claim_run_folder()
        results.write_amendment(self.results_dir, fault.case, results.bounded_evidence(fault.evidence), self.worker)


def _run_folder(config: pytest.Config) -> runfolder.RunFolder:
    """This run's folder: the controller's (xdist workers), the early hook's, or a new one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKERINPUT_RUN_KEY in workerinput:
        return runfolder.RunFolder.from_workerinput(workerinput[WORKERINPUT_RUN_KEY])
    early = config.stash.get(RUN_FOLDER_KEY, None)
    if early is not None:
        return early
    try:
        return runfolder.RunFolder.new(options.results_dir(config), options.value(config, "spmd_run_id"))
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None


def fork_server_wanted(option: str | None, backend: Backend) -> bool:
    """--spmd-fork-server: on, off, or auto (on for the cpu backend)."""
    choice = option or "auto"
    return choice == "on" or (choice == "auto" and backend.name == "cpu")


def load_inputs(harness_session: HarnessSession, config: pytest.Config) -> None:
    """Read the registry (and the baseline) now, at configure time, in the xdist controller too:
    a malformed file is a usage error naming it before any case runs, not an INTERNALERROR in a
    worker, nor a wrong judgement."""
    try:
        load_registry(harness_session.registry_path)
    except RegistryError as exc:
        raise pytest.UsageError(f"known-bug registry: {exc}") from None
    # A TPU's default baseline is named by its device count, which takes a probe of the chips:
    # that one is read at the end of collection, still before any case runs.
    harness_session.sharding_judge.read_unless_probed()


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
