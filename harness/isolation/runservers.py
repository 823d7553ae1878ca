"""The run's fork servers: started by the controlling pytest process, shared by its xdist workers.

A run imports torch_xla once. The process that controls the run (plain pytest, or xdist's
controller) starts the XLA fork server as early as pytest lets a plugin act on its options
(`pytest_load_initial_conftests`, before conftests and test modules are imported), so the
import overlaps pytest's own start-up and collection, and xdist's worker start-up. It also starts
the torch-only server (bodies that must see a process without torch_xla). Workers receive the
addresses in `workerinput`; their pools connect to them and start servers of their own only for keys nobody serves.

Started early only when the command line selects SPMD cases (harness.config.activation.selects_spmd_early).
Otherwise the first SPMD case selected starts a server in its own pool (under xdist: each worker's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.isolation.backend import Backend
from harness.isolation.case import child_spec
from harness.isolation.child_process import ChildSpec
from harness.isolation.forkclient import ForkServer, ServerAddress, server_key

WORKERINPUT_KEY = "harness_fork_servers"


class RunServers:
    """The servers one run shares, keyed like the pools key them (forkclient.server_key)."""

    def __init__(self) -> None:
        self.servers: dict[str, ForkServer] = {}

    def start(self, specs: Sequence[ChildSpec], log_dir: Path) -> None:
        """One server per distinct key, started now."""
        for spec in specs:
            if spec.fork_imports is None or server_key(spec.python, dict(spec.env), spec.fork_imports) in self.servers:
                continue
            server = ForkServer(spec.python, dict(spec.env), spec.fork_imports, log_dir)
            self.servers[server.key] = server

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


def specs_to_start(backend: Backend) -> list[ChildSpec]:
    """The XLA server (every SPMD case needs it) and the torch-only one (the gloo reference cases).

    Both start at once: while the XLA server imports torch_xla (one core, about 4 s), the other
    core has time for the torch-only import, which a first gloo case would otherwise wait for.
    """
    return [child_spec(backend, preload=True), child_spec(backend, preload=False)]


def addresses_to_workerinput(addresses: dict[str, ServerAddress]) -> list[dict[str, str]]:
    return [address.to_dict() for address in addresses.values()]


def addresses_from_workerinput(data: list[dict[str, str]] | None) -> dict[str, ServerAddress]:
    addresses = [ServerAddress.from_dict(item) for item in data or []]
    return {address.key: address for address in addresses}
