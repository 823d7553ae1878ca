"""The run's shared fork servers (harness.isolation.parent.runservers): which import when, and that a
server told to wait is owned like any other."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from harness.config.backends import CpuBackend
from harness.isolation.parent.child_process import ChildSpec
from harness.isolation.parent.forkclient import EXEC_IMPORTS, ForkServerClient
from harness.isolation.parent.runservers import RunServers, specs_to_start
from harness.isolation.system.processes import is_running


def spec(imports: tuple[str, ...]) -> ChildSpec:
    return ChildSpec.build({"PATH": os.environ["PATH"]}, (), python=sys.executable, fork_imports=imports)


def answers_within(client: ForkServerClient, seconds: float) -> bool:
    """The server has sent its ready message (it sends it once its imports are done)."""
    return bool(select.select([client.sock], [], [], seconds)[0])


def test_under_xdist_the_torch_only_server_waits_for_collection_and_alone_it_does_not():
    backend = CpuBackend(4)
    now, later = specs_to_start(backend, distributed=True)
    assert [s.fork_imports for s in now] == [backend.fork_imports(True)], "the XLA server imports at once"
    assert [s.fork_imports for s in later] == [backend.fork_imports(False)]
    now, later = specs_to_start(backend, distributed=False)
    assert len(now) == 2 and later == [], "without workers both import at once"


def test_a_waiting_server_imports_when_every_worker_has_collected_and_serves_who_connected_before(tmp_path):
    servers = RunServers()
    servers.start([spec(EXEC_IMPORTS)], tmp_path, after_collection=[spec(("json",))])
    try:
        late = next(server for server in servers.servers.values() if server.imports == ("json",))
        client = ForkServerClient(late.address, 30)  # a worker's pool connects at its first case
        servers.worker_started()
        servers.worker_started()
        servers.worker_collected()
        assert not answers_within(client, 1.0), "it imported before every worker had collected"
        servers.worker_collected()
        assert answers_within(client, 30), "every worker has collected: it imports and answers"
        with open(os.devnull, "wb") as log:
            child = client.spawn({"PATH": os.environ["PATH"]}, log.fileno(), (), argv=[sys.executable, "-c", "pass"])
        child.stdin.close()
        assert child.wait(30) == 0
        assert client.ready is not None and client.ready.imported == ["json"]
        client.close()
    finally:
        servers.close()
    assert not os.path.exists(late.address.path), "its socket folder went with it"


def test_a_worker_down_starts_the_imports_and_a_server_still_waiting_ends_with_its_run(tmp_path):
    servers = RunServers()
    servers.start([], tmp_path, after_collection=[spec(("json",))])
    (late,) = servers.servers.values()
    client = ForkServerClient(late.address, 30)
    servers.worker_started()
    servers.start_waiting_imports()  # pytest_testnodedown, or a run that started no worker
    assert answers_within(client, 30)
    client.close()
    servers.close()
    never = RunServers()
    never.start([], tmp_path, after_collection=[spec(("json",))])
    (idle,) = never.servers.values()
    started = time.monotonic()
    never.close()
    assert time.monotonic() - started < 5, "a waiting server ends at once with its owner"
    assert idle.proc is not None and idle.proc.poll() is not None
    assert not os.path.exists(os.path.dirname(idle.address.path))


OWNER = """
import sys
from pathlib import Path
from harness.isolation.parent.child_process import ChildSpec
from harness.isolation.parent.runservers import RunServers
servers = RunServers()
servers.start([], Path(sys.argv[1]), after_collection=[ChildSpec.build({}, (), python=sys.executable, fork_imports=("json",))])
(server,) = servers.servers.values()
print(server.proc.pid, server.address.path, flush=True)
sys.stdin.read()
"""


def test_an_owner_killed_while_its_server_waits_leaves_neither_the_server_nor_its_socket_folder(tmp_path):
    with subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as owner:
        assert owner.stdout is not None
        pid, socket_path = owner.stdout.readline().split()
        os.kill(owner.pid, signal.SIGKILL)  # pytest killed while its workers still collect
    deadline = time.monotonic() + 10
    while (is_running(int(pid)) or os.path.exists(os.path.dirname(socket_path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_running(int(pid)), "the waiting server outlived its owner"
    assert not os.path.exists(os.path.dirname(socket_path)), "its socket folder was left behind"
