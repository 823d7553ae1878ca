"""The run's shared fork servers (harness.isolation.runservers): which start when."""

from __future__ import annotations

import os
import sys

from harness.config.backends import CpuBackend
from harness.isolation.child_process import ChildSpec
from harness.isolation.forkclient import EXEC_IMPORTS, ForkServerClient
from harness.isolation.runservers import RunServers, specs_to_start


def spec(imports: tuple[str, ...]) -> ChildSpec:
    return ChildSpec.build({"PATH": os.environ["PATH"]}, (), python=sys.executable, fork_imports=imports)


def test_under_xdist_the_torch_only_server_waits_for_collection_and_alone_it_does_not():
    backend = CpuBackend(4)
    now, later = specs_to_start(backend, distributed=True)
    assert [s.fork_imports for s in now] == [backend.fork_imports(True)], "the XLA server starts at once"
    assert [s.fork_imports for s in later] == [backend.fork_imports(False)]
    now, later = specs_to_start(backend, distributed=False)
    assert len(now) == 2 and later == [], "without workers both start at once"


def test_a_waiting_server_starts_when_every_worker_has_collected_and_serves_who_connected_before(tmp_path):
    servers = RunServers()
    first, waiting = spec(EXEC_IMPORTS), spec(("json",))
    servers.start([first], tmp_path, after_collection=[waiting])
    try:
        by_imports = {server.imports: server for server in servers.servers.values()}
        assert by_imports[EXEC_IMPORTS].proc is not None, "started now"
        late = by_imports[("json",)]
        assert late.proc is None, "started before the workers collected"
        client = ForkServerClient(late.address, 30)  # a worker's pool connects at its first case
        servers.worker_started()
        servers.worker_started()
        servers.worker_collected()
        assert late.proc is None, "one of two workers has collected"
        servers.worker_collected()
        assert late.proc is not None, "every worker has collected"
        with open(os.devnull, "wb") as log:
            child = client.spawn({"PATH": os.environ["PATH"]}, log.fileno(), (), argv=[sys.executable, "-c", "pass"])
        child.stdin.close()
        assert child.wait(30) == 0
        assert client.ready is not None and client.ready.imported == ["json"]
        client.close()
    finally:
        servers.close()
    assert not os.path.exists(late.address.path), "its socket folder went with it"


def test_a_worker_that_goes_down_leaves_no_server_waiting_and_one_never_started_closes_cleanly(tmp_path):
    servers = RunServers()
    servers.start([], tmp_path, after_collection=[spec(("json",))])
    (late,) = servers.servers.values()
    servers.worker_started()
    servers.launch_waiting()  # pytest_testnodedown
    assert late.proc is not None
    servers.close()
    never = RunServers()
    never.start([], tmp_path, after_collection=[spec(("json",))])
    (idle,) = never.servers.values()
    never.close()
    assert idle.proc is None and not os.path.exists(idle.address.path)
