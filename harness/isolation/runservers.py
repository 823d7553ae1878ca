"""The run's fork servers: started by the controlling pytest process, shared by its xdist workers.

A run imports torch_xla once. The process that controls the run (plain pytest, or xdist's
controller) starts the XLA fork server as early as pytest lets a plugin act on its options
(`pytest_load_initial_conftests`, before conftests and test modules are imported), so the
import overlaps pytest's own start-up and collection, and xdist's worker start-up. It also starts
the torch-only server (bodies that must see a process without torch_xla). Workers receive the
addresses in `workerinput`; their pools connect to them and start servers of their own only for keys nobody serves.

Started early only when the selection can hold SPMD cases: `-m` selects items marked spmd, or the
paths reach the repository's cases/ folder. Otherwise the first SPMD case collected starts a
server in its own pool, as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from harness.backends import Backend
from harness.isolation.case import child_spec
from harness.isolation.child_process import ChildSpec
from harness.isolation.forkclient import ForkServer, ServerAddress, server_key

CASES_DIR = "cases"
WORKERINPUT_KEY = "harness_fork_servers"


def selection_may_hold_spmd_cases(options: argparse.Namespace, rootpath: Path, testpaths: Sequence[str]) -> bool:
    """Whether the command line can select SPMD cases (a cheap guess from the options alone)."""
    if getattr(options, "help", False) or getattr(options, "version", False) or getattr(options, "collectonly", False):
        return False
    markexpr = getattr(options, "markexpr", "") or ""
    if markexpr:
        return _marker_expression_selects_spmd(markexpr)
    paths = list(getattr(options, "file_or_dir", None) or []) or list(testpaths) or ["."]
    cases = (rootpath / CASES_DIR).resolve()
    for arg in paths:
        path = (
            (rootpath / arg.split("::", 1)[0]).resolve() if not Path(arg).is_absolute() else Path(arg.split("::", 1)[0])
        )
        if path == cases or cases in path.parents or path in cases.parents:
            return True
    return False


def _marker_expression_selects_spmd(markexpr: str) -> bool:
    """True if an item marked `spmd` (and nothing the expression names otherwise) is selected."""
    try:
        from _pytest.mark.expression import Expression  # pytest's own parser for -m

        def only_spmd(name: str, /, **_: object) -> bool:
            return name == "spmd"

        return bool(Expression.compile(markexpr).evaluate(only_spmd))
    except Exception:  # noqa: BLE001 - a private API or a bad expression: pytest reports the latter later
        return False


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
