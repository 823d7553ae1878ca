"""Children for case bodies, one per body, and the guarantee that none outlives the run.

Every body runs in a child that ran no other body (issue 51): what a body leaves in its process
(a replaced function, a mode left entered, a hook, a global mesh) dies with it, so nothing has to
be put back. A child costs a fork from a server that imported torch_xla once, plus its PJRT
client's start at its first device use (0.2-0.4 s on the 2-core machine, docs/architecture.md).
Every child the pool starts stays in `live` until it has been ended, so closing the pool (pytest
finishing, Ctrl-C, SIGTERM) ends busy children too.

exclusive: the device admits one process at a time (a TPU host: libtpu locks the chips), so
every other child is closed before another one starts, and no spare is started.
spares: while a case runs, the next child for the same spec is started (a spare has run no case:
it is as fresh as a new process). Always for forked children (a fork, no import: it costs the
busy cores nothing); for exec'd children (an import each) only where a core is free (not xdist).

Every child comes from a server's keeper (harness.isolation.server.forkserver): forked from a server that imported
torch_xla once, or, for a spec without fork imports or with forking off, exec'd fresh by a keeper
of this pool's *exec server*, which imports nothing. Either way the keeper and the server are
child subreapers, so what a body starts outside its session is ended with its child.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.errors import ChildStartError
from harness.isolation.parent.child_process import ChildProcess, ChildSpec, LateFault
from harness.isolation.parent.forkclient import (
    EXEC_IMPORTS,
    KEEPER_REPORT_S,
    ForkServerClient,
    ServerAddress,
    ServerHandle,
    server_key,
)
from harness.isolation.system import processes

# Closing a pool waits this long for each ended child's status (a stopped keeper is continued or
# killed within KEEPER_REPORT_S); then it goes on: the run must end.
CLOSE_WAIT_S = KEEPER_REPORT_S + 5.0


class ChildPool:
    def __init__(
        self,
        log_dir: Path,
        startup_timeout: float,
        exclusive: bool = False,
        spares: bool = False,
        fork: bool = False,
        servers: Mapping[str, ServerAddress] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.startup_timeout = startup_timeout
        self.exclusive = exclusive
        self.spares_enabled = spares and not exclusive
        # Fork children from servers that imported torch_xla once (harness.isolation.server.forkserver); specs
        # without fork_imports are exec'd fresh either way. `servers`: the run's shared servers
        # (started by the controlling pytest process) by key; a key none of them serves gets a
        # server of this pool's own.
        self.fork = fork
        self.shared = dict(servers or {})
        self.owned: dict[str, ServerHandle] = {}
        self.clients: dict[str, ForkServerClient] = {}
        self.spares: dict[ChildSpec, ChildProcess] = {}  # started, ready or starting, ran no case
        self.parked: list[ChildProcess] = []  # released unquiet after a verdict; ended by settle()
        self.live: list[ChildProcess] = []  # started and not yet ended, whatever they are doing
        self.ended: list[ChildProcess] = []  # ended but maybe not yet reaped (no wait on the critical path)
        self.started = 0

    def prewarm(self, spec: ChildSpec) -> None:
        """Start importing now, in the background, so the first case finds it done: the fork
        server for spec when children are forked (a spawn would wait for its imports), else a
        child (a spare: it runs the first case)."""
        if self.fork and spec.fork_imports is not None:
            self._server_for(spec)
        elif spec not in self.spares:
            self.spares[spec] = self._start(spec)

    def _start(self, spec: ChildSpec) -> ChildProcess:
        if self.exclusive:
            self._close_idle()
        self.started += 1
        client = self._server_for(spec)
        try:
            child = ChildProcess(spec, self.log_dir, client, fresh=self._fresh(spec))
        except ChildStartError:
            if client.is_usable():
                raise
            # The server went away (ended, crashed): once, a server of this pool's own.
            child = ChildProcess(spec, self.log_dir, self._server_for(spec, own=True), fresh=self._fresh(spec))
        self.live.append(child)
        return child

    def _fresh(self, spec: ChildSpec) -> bool:
        """Exec'd fresh by a keeper of the exec server, rather than forked from an importing server."""
        return not self.fork or spec.fork_imports is None

    def _server_for(self, spec: ChildSpec, own: bool = False) -> ForkServerClient:
        imports = spec.fork_imports
        if (
            self._fresh(spec) or imports is None
        ):  # one exec server per interpreter: its children take their own environment
            key, imports = "exec-" + server_key(spec.python, {}, EXEC_IMPORTS), EXEC_IMPORTS
        else:
            key = server_key(spec.python, dict(spec.env), imports)
        client = self.clients.get(key)
        if client is not None and client.is_usable() and not own:
            return client
        if client is not None:
            client.close()
        if not own and key in self.shared:
            try:
                self.clients[key] = client = ForkServerClient(self.shared[key], self.startup_timeout)
                return client
            except ChildStartError:
                pass  # the run's server is gone (it crashed or was ended): start one of our own
        server = self.owned.get(key)
        if server is None or not server.is_alive():
            if server is not None:
                server.close()
            server = ServerHandle(spec.python, dict(spec.env), imports, self.log_dir)
            self.owned[key] = server
        address = server.address
        self.clients[key] = client = ForkServerClient(address, self.startup_timeout)
        return client

    def acquire(self, spec: ChildSpec) -> ChildProcess:
        """A ready child for spec that ran no case: the spare if any, else a new one; then the
        next spare starts while the case runs."""
        child = self.spares.pop(spec, None)
        if child is not None and (child.ended or not child.is_alive()):
            self.discard(child)  # a spare that died has run nothing: a new one, no one charged
            child = None
        child = child or self._start(spec)
        if self._wants_spare(spec):
            self.spares[spec] = self._start(spec)
        self.reap()
        child.wait_ready(self.startup_timeout)
        return child

    def _wants_spare(self, spec: ChildSpec) -> bool:
        """A fork costs the busy cores nothing; an exec'd child's import only where a core is free."""
        return not self.exclusive and (self.spares_enabled or not self._fresh(spec))

    def replacement(self, spec: ChildSpec) -> ChildProcess:
        """A new child for a case whose child turned out to be unfit (LateFault of its last case)."""
        child = self._start(spec)
        child.wait_ready(self.startup_timeout)
        return child

    def release(self, child: ChildProcess) -> None:
        """A child ran its one case: ended now, or parked until the next case begins when its body
        left a thread or process running (what it does meanwhile is that case's late fault)."""
        if not child.quiet and not child.ended:
            self.parked.append(child)
        else:
            self.discard(child)

    def settle(self) -> list[LateFault]:
        """End the parked children; what they did since their verdict is charged to their case."""
        faults = []
        for child in self.parked:
            fault = child.post_mortem(released=True)
            if fault is not None:
                faults.append(fault)
            self.discard(child)
        self.parked.clear()
        return faults

    def discard(self, child: ChildProcess) -> None:
        """End the child and its group now; its exit is collected later, off the critical path."""
        child.end()
        if child in self.live:
            self.live.remove(child)
            self.ended.append(child)

    def reap(self) -> None:
        self.ended = [c for c in self.ended if not c.reaped()]

    def idle_deaths(self) -> list[LateFault]:
        """Late faults of parked children that died or spoke since their case (at session end)."""
        return self.settle()

    def _close_idle(self) -> None:
        for child in [*self.spares.values(), *self.parked]:
            self.discard(child)
        self.spares.clear()
        self.parked.clear()

    def close(self) -> None:
        """End every child and server this pool started, busy ones included, and collect their exits."""
        self.spares.clear()
        self.parked.clear()
        for child in list(self.live):
            self.discard(child)
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        for server in self.owned.values():
            server.close()
        self.owned.clear()
        for child in self.ended:
            processes.wait_for_exit(child.proc, CLOSE_WAIT_S)  # bounded: a run's end cannot hang here
        self.ended.clear()
