"""The run's fork servers: started by the controlling pytest process, shared by its xdist workers.

A run imports torch_xla once. The process that controls the run (plain pytest, or xdist's
controller) starts the XLA fork server as early as pytest lets a plugin act on its options
(`pytest_load_initial_conftests`, before conftests and test modules are imported), so the
import overlaps pytest's own start-up and collection, and xdist's worker start-up. It also starts
the torch-only server (bodies that must see a process without torch_xla), which under xdist
waits to import until the workers have collected (specs_to_start says why). Workers
receive the addresses in `workerinput`; their pools connect to them and start servers of their
own only for keys nobody serves.

Started early only when the command line selects SPMD cases (harness.config.activation.selects_spmd_early).
Otherwise the first SPMD case selected starts a server in its own pool (under xdist: each worker's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.isolation.backend import Backend
from harness.isolation.parent.case import child_spec
from harness.isolation.parent.child_process import ChildSpec
from harness.isolation.parent.forkclient import ServerAddress, ServerHandle, server_key

WORKERINPUT_KEY = "harness_fork_servers"


class RunServers:
    """The servers one run shares, keyed like the pools key them (forkclient.server_key)."""

    def __init__(self) -> None:
        self.servers: dict[str, ServerHandle] = {}
        self._workers_started = 0
        self._workers_collected = 0

    def start(self, specs: Sequence[ChildSpec], log_dir: Path, *, after_collection: Sequence[ChildSpec] = ()) -> None:
        """One server per distinct key, started now: those of `after_collection` import once every
        xdist worker has collected (worker_collected), one went down, or the run turned out to
        have no workers (start_waiting_imports); until then they wait, owned like any other."""
        for spec, wait in [(spec, False) for spec in specs] + [(spec, True) for spec in after_collection]:
            if spec.fork_imports is None or server_key(spec.python, dict(spec.env), spec.fork_imports) in self.servers:
                continue
            server = ServerHandle(spec.python, dict(spec.env), spec.fork_imports, log_dir, wait_to_import=wait)
            self.servers[server.key] = server

    def worker_started(self) -> None:
        self._workers_started += 1

    def worker_collected(self) -> None:
        """xdist schedules no case before every worker has collected: the waiting servers import then."""
        self._workers_collected += 1
        if self._workers_collected >= self._workers_started:
            self.start_waiting_imports()

    def start_waiting_imports(self) -> None:
        for server in self.servers.values():
            server.start_imports()  # once; a server that never waited is left as it is

    def addresses(self) -> dict[str, ServerAddress]:
        return {key: server.address for key, server in self.servers.items()}

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


def servers_can_start(backend: Backend) -> bool:
    """The backend forks its children, and what its servers import is installed."""
    imports = backend.fork_imports(True)
    if imports is None:
        return False
    return "torch_xla" not in imports or backend.capabilities().has_xla


def specs_to_start(backend: Backend, distributed: bool) -> tuple[list[ChildSpec], list[ChildSpec]]:
    """(start now, start once the xdist workers have collected): the XLA server, which every
    SPMD case waits for, and the torch-only one (the gloo reference cases, bodies that must see
    a process without torch_xla).

    Alone, pytest leaves the second core free while the XLA server imports torch_xla (one core,
    about 5 s): both start at once, and a first gloo case finds its server ready. Under xdist the
    workers' start-up and collection take that core too; with the torch-only import beside them
    the XLA server was ready about 2 s later, and then imported alone, the other core idle
    (benchmarks/cpu_breakdown.py, /proc/stat). Started after collection, its import takes that
    idle core instead.
    """
    xla, torch_only = child_spec(backend, preload=True), child_spec(backend, preload=False)
    return ([xla], [torch_only]) if distributed else ([xla, torch_only], [])


def addresses_to_workerinput(addresses: dict[str, ServerAddress]) -> list[dict[str, str]]:
    return [address.to_dict() for address in addresses.values()]


def addresses_from_workerinput(data: list[dict[str, str]] | None) -> dict[str, ServerAddress]:
    addresses = [ServerAddress.from_dict(item) for item in data or []]
    return {address.key: address for address in addresses}
