"""Warm children keyed by their ChildSpec, and the guarantee that none outlives the run.

`import torch_xla` costs seconds and SPMD mode, functionalization and the device count are fixed
once per process, so children with the same spec are reused. Every child the pool starts stays
in `live` until it has been ended, so closing the pool (pytest finishing, Ctrl-C, SIGTERM) ends
busy children too, not only idle ones.

exclusive: the device admits one process at a time (a TPU host: libtpu locks the chips), so
every idle child is closed before another one starts.
spares: when a case takes a fresh child, start the next one for the same spec right away, so
its import runs on an idle core while the case runs. A spare has run no case, so it is as
fresh as a new process. Off on exclusive devices and where every core is busy (xdist).

Every child comes from a server's keeper (harness.isolation.forkserver): forked from a server that imported
torch_xla once, or, for a spec without fork imports or with forking off, exec'd fresh by a keeper
of this pool's *exec server*, which imports nothing. Either way the keeper and the server are
child subreapers, so what a body starts outside its session is ended with its child.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.errors import ChildStartError
from harness.isolation import processes
from harness.isolation.child_process import ChildProcess, ChildSpec, LateFault
from harness.isolation.forkclient import (
    EXEC_IMPORTS,
    KEEPER_REPORT_S,
    ForkServerClient,
    ServerAddress,
    ServerHandle,
    server_key,
)

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
        # Fork children from servers that imported torch_xla once (harness.isolation.forkserver); specs
        # without fork_imports are exec'd fresh either way. `servers`: the run's shared servers
        # (started by the controlling pytest process) by key; a key none of them serves gets a
        # server of this pool's own.
        self.fork = fork
        self.shared = dict(servers or {})
        self.owned: dict[str, ServerHandle] = {}
        self.clients: dict[str, ForkServerClient] = {}
        self.idle: dict[ChildSpec, ChildProcess] = {}
        self.spares: dict[ChildSpec, ChildProcess] = {}
        self.parked: list[ChildProcess] = []  # released unfit after a verdict; ended by settle()
        self.live: list[ChildProcess] = []  # started and not yet ended, whatever they are doing
        self.ended: list[ChildProcess] = []  # ended but maybe not yet reaped (no wait on the critical path)
        self.started = 0

    def prewarm(self, spec: ChildSpec) -> None:
        """Start importing now, in the background, so the first case finds it done: the fork
        server for spec when children are forked (forking itself is cheap), else a child."""
        if self.fork and spec.fork_imports is not None:
            self._server_for(spec)
        elif spec not in self.idle:
            self.idle[spec] = self._start(spec)

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

    def acquire(self, spec: ChildSpec, fresh: bool) -> ChildProcess:
        """A ready child for spec: a spare or a new one when fresh, else the idle one if any."""
        child = self.spares.pop(spec, None) if fresh else self.idle.pop(spec, None)
        if child is not None and (child.ended or not child.is_alive()):
            # It died while idle. A warm child has run a case: its death is that case's fault,
            # which the caller learns from begin() (LateFault) if we hand it out; a spare that
            # died has run nothing, and its start-up error shows in wait_ready.
            if child.last_case is None:
                self.discard(child)
                child = None
        child = child or self._start(spec)
        if fresh and self.spares_enabled:
            self.spares[spec] = self._start(spec)
        self.reap()
        child.wait_ready(self.startup_timeout)
        return child

    def replacement(self, spec: ChildSpec) -> ChildProcess:
        """A new child for a case whose child turned out to be unfit (LateFault of its last case)."""
        child = self._start(spec)
        child.wait_ready(self.startup_timeout)
        return child

    def release(self, child: ChildProcess, reusable: bool) -> None:
        if reusable and not child.ended and child.is_alive() and child.spec not in self.idle:
            self.idle[child.spec] = child
        elif not child.quiet and not child.ended:
            # Its case left a thread or process running, which may still crash or answer: that is
            # the case's fault, not the next one's. settle() looks, and ends it, before the next case.
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
        """Late faults of idle and parked children that died or spoke since their last case (at session end)."""
        faults = self.settle()
        for spec, child in list(self.idle.items()):
            fault = child.post_mortem()
            if fault is not None:
                faults.append(fault)
                del self.idle[spec]
                self.discard(child)
        return faults

    def _close_idle(self) -> None:
        for child in [*self.idle.values(), *self.spares.values(), *self.parked]:
            self.discard(child)
        self.idle.clear()
        self.spares.clear()
        self.parked.clear()

    def close(self) -> None:
        """End every child and server this pool started, busy ones included, and collect their exits."""
        self.idle.clear()
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
