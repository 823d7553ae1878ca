"""The fork server process (`python -m harness.isolation.server.forkserver`): import torch_xla once, fork children.

`import torch_xla` costs 4-6 s and most of a child's memory; the state it leaves is the same for
every child of one interpreter and import-time environment. The server imports only what is
listed in HARNESS_FORKSERVER_IMPORTS (forkwire.IMPORTS_ENV), makes no runtime call (no PJRT
client, no JAX backend, no torch op: a torch CPU op would start libgomp's pool and a forked
child's first matmul would hang), then forks on request. What a child may still choose after the fork is the environment
variables torch_xla reads at use, not at import (`POST_FORK_VARIABLES`); every other variable
keys the server. The parent side (starting a server, asking it for children) is
harness.isolation.parent.forkclient; what the two say to each other is harness.isolation.wire.forkwire.

One server serves every pytest process of a run: the controlling process starts it and passes
the socket to the xdist workers, so a run imports torch_xla once, not once per worker. Clients
connect to a listening Unix socket (SOCK_SEQPACKET: one request per message, file descriptors
passed with it). A control socket from the owning process is the server's lifeline: when it
closes (the owner ended, SIGKILL included) the server kills its process group and exits.

For each child the server forks a *keeper*, which forks the child and waits for it: the client
that asked for the child is not its parent, so the keeper writes the child's exit status (a
signal included) to a pipe the client passed along. The child starts a session of its own, takes
its stdin, log and pipes from the client, sets its environment, reseeds its random generators and
runs `harness.isolation.child.main.main()`: from there on it is exactly a child started by exec. A request that
names an `argv` gets a child that execs it with the request's whole environment: a fresh process
(`--spmd-fork-server=off`, TPU), kept the same way (the pool's *exec server* imports nothing).

Containment (harness.isolation.system.processes, Linux): the server and every keeper are child subreapers. A
helper the body started that leaves the child's session (setsid, a double fork) is adopted by the
keeper when its parent ends; when the child has ended, the keeper reports its status, then kills
and reaps every process it adopted, generation after generation. A keeper that dies first (a body
can SIGKILL its parent) leaves the child and the helpers to the server: the server reaps that
child and writes *its* exit status on the client's pipe (it keeps a copy of the write end until
the status is in), and kills every other process it adopts. When the owner goes, the server ends
all of its descendants, then its group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hmac
import importlib
import os
import random
import select
import selectors
import shutil
import signal
import socket
import struct
import sys
import time
from typing import NoReturn

import harness
from harness.errors import HarnessError
from harness.isolation.server import casens
from harness.isolation.system import dropuser, processes
from harness.isolation.wire import forkwire
from harness.isolation.wire.forkwire import (
    CONTROL_FD_ENV,
    FIXED_FDS,
    GO_FD_ENV,
    IMPORTS_ENV,
    LISTEN_FD_ENV,
    MAX_PASSED_FDS,
    POST_FORK_VARIABLES,
    SOCKET_FOLDER_PREFIX,
    TOKEN_BYTES,
    TOKEN_FD_ENV,
)
from harness.isolation.wire.protocol import KEEPER_PID_ENV

# Modules that read the environment once at import; a server must never hold them.
FORBIDDEN_IN_SERVER = (
    "torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel",
)
# What every forked child would import next, at 0.1-0.3 s of CPU each (about 40 children a run):
# its own main, pytest and hypothesis (a case module imports them to define its bodies) and the
# case kit (harness.__all__). None of them reads the environment at import, starts a thread or
# imports torch (tests/test_parent_imports.py); a fresh child imports them itself, the same modules.
CHILD_IMPORTS = (
    "harness.isolation.child.main",
    "pytest",
    "hypothesis?",
    *(f"harness.{name}" for name in harness.__all__),
)
XLA_IMPORTS = ("torch", "torch_xla", "torch_xla.runtime", "torch_xla.distributed.spmd", "jax?", *CHILD_IMPORTS)
# torch._dynamo too: torch.distributed.tensor imports it at its first dispatch (1.5-2.5 s), which
# each forked gloo rank would otherwise pay again. It starts no thread and runs no op.
TORCH_IMPORTS = ("torch", "torch._dynamo", *CHILD_IMPORTS)
KEEPER_REPORTED = 0  # a keeper's exit code once the child's status is on the client's pipe
KEEPER_FAILED = 1


def import_modules(names: list[str]) -> list[str]:
    """Import each name; a trailing '?' marks one that may be missing (jax without the pallas extra)."""
    done = []
    for name in names:
        optional = name.endswith("?")
        try:
            importlib.import_module(name.rstrip("?"))
            done.append(name.rstrip("?"))
        except ImportError:
            if not optional:
                raise
    return done


@dataclasses.dataclass
class Kept:
    """A child the server forked a keeper for, and the server's copy of its exit-status pipe."""

    child: int
    status_fd: int


class NotThisRunsClient(HarnessError):
    """A spawn request without this run's token (a process of another run found the socket)."""


class Server:
    def __init__(
        self, listener: socket.socket, control: socket.socket, ready: forkwire.ServerReady, token: bytes
    ) -> None:
        self.token = token  # what every spawn request must carry (forkwire: only this run's clients know it)
        self.listener = listener
        self.control = control
        self.ready_packet = forkwire.encode(ready)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(control, selectors.EVENT_READ, "control")
        self.clients: list[socket.socket] = []
        self.keepers: dict[int, Kept] = {}  # by keeper pid
        self.orphans: dict[int, Kept] = {}  # by child pid: children whose keeper died before reporting
        # Set once a keeper died before reporting: from then on we may adopt a child's helpers.
        self.adopting = False
        # Processes that were ours before serving (none expected: an import's helper would be one).
        self.own_before = set(processes.children_of(os.getpid()))
        # A child's end wakes the loop at once: an orphan's status is due to its client.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_write)
        self.selector.register(self._wake_read, selectors.EVENT_READ, "sigchld")
        # The run's pytest processes: the owner, and each client that showed the run's token. A
        # body that stops one (SIGSTOP) while it waits for the verdict would stop the run for good;
        # seen stopped twice, a second apart, it is continued (see _continue_the_run).
        self.run_pids = {os.getppid()} | {
            int(p) for p in os.environ.pop(forkwire.RUN_PIDS_ENV, "").split(",") if p.isdigit()
        }
        self._stopped_seen: set[int] = set()
        self._next_stop_check = 0.0

    def serve(self) -> None:
        while True:
            self._continue_the_run()
            for key, _ in self.selector.select(timeout=1.0):
                if key.data == "control":
                    self._check_owner()
                elif key.data == "accept":
                    self._accept()
                elif key.data == "sigchld":
                    _drain(self._wake_read)
                else:
                    self._answer(key.fileobj)  # type: ignore[arg-type]  # a client socket: the only other registration
            self._reap()
            if self.adopting:
                self._end_strays()

    def _continue_the_run(self) -> None:
        """SIGCONT a process of the run that stayed stopped outside job control for a second (a
        case body's SIGSTOP). Ctrl-Z in a terminal is left alone. This holds against a body that
        stops pytest only: one that stops every server of the run first stops this check too
        (only a case child running as another user, or in another pid namespace, cannot)."""
        now = time.monotonic()
        if now < self._next_stop_check:
            return
        self._next_stop_check = now + 1.0
        stopped = {pid for pid in self.run_pids if processes.stopped_outside_job_control(pid)}
        for pid in stopped & self._stopped_seen:
            print(f"fork server: the run's process {pid} was stopped by a signal; continued", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._stopped_seen = stopped

    def _reap(self) -> None:
        """Collect ended keepers, orphans and strays; hand an orphan's status to its client."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.keepers:
                self._keeper_ended(self.keepers.pop(pid), status)
                continue
            kept = self.orphans.pop(pid, None) or self._kept_child(pid)
            if kept is not None:  # an orphan (maybe collected before its keeper): its status is owed
                self._report(kept, status)

    def _kept_child(self, pid: int) -> Kept | None:
        return next((kept for kept in self.keepers.values() if kept.child == pid), None)

    def _keeper_ended(self, kept: Kept, status: int) -> None:
        if kept.status_fd < 0:
            return  # its child was collected here already (it had become an orphan)
        if os.waitstatus_to_exitcode(status) == KEEPER_REPORTED:
            os.close(kept.status_fd)
            return
        # The keeper died first: its child, running or not yet collected, is ours (a subreaper's).
        self.adopting = True
        try:
            pid, child_status = os.waitpid(kept.child, os.WNOHANG)
        except ChildProcessError:  # the keeper collected it and died before writing: status lost
            os.close(kept.status_fd)
            return
        if pid == 0:
            self.orphans[kept.child] = kept  # its exit comes to _reap
        else:
            self._report(kept, child_status)

    @staticmethod
    def _report(kept: Kept, status: int) -> None:
        _write_status(kept.status_fd, status)
        os.close(kept.status_fd)
        kept.status_fd = -1

    def _end_strays(self) -> None:
        """Kill what we adopted that is neither a keeper nor a child whose status we owe: the
        escaped helpers of a child whose keeper died. Its orphaned child is ended by its pool."""
        owed = {kept.child for kept in (*self.orphans.values(), *self.keepers.values())}
        for pid in processes.children_of(os.getpid()):
            if pid not in self.keepers and pid not in owed and pid not in self.own_before:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _check_owner(self) -> None:
        """The owner never writes: readable means it is gone (EOF, or a reset). Keepers go too."""
        try:
            gone = not self.control.recv(1)
        except OSError:
            gone = True
        if gone:  # the owner's close, or SIGKILL: its socket folder goes with us
            remove_socket_folder(self.listener)
            # Every descendant, escaped helpers included (they are ours once their keeper is gone);
            # then the group, ourselves with it.
            processes.end_children()
            os.killpg(0, signal.SIGKILL)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.sendall(self.ready_packet)
        except OSError:
            conn.close()
            return
        self.clients.append(conn)
        self.selector.register(conn, selectors.EVENT_READ, "client")

    def _answer(self, conn: socket.socket) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(conn, forkwire.MAX_MESSAGE_BYTES, MAX_PASSED_FDS)
        except OSError:
            message, fds = b"", []
        if not message:
            self.selector.unregister(conn)
            self.clients.remove(conn)
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        reply: forkwire.Spawned | forkwire.SpawnFailed
        refused = False
        try:
            request = forkwire.decode(message, forkwire.SpawnRequest)
            if not hmac.compare_digest(request.token.encode(), self.token):
                refused = True
                raise NotThisRunsClient(
                    "this fork server serves only the run that started it, and the request lacks that run's token"
                )
            self.run_pids.add(_peer_pid(conn))
            keeper, child = self._fork_keeper(request, fds)
            reply = forkwire.Spawned(pid=child, keeper=keeper)
        except Exception as exc:  # the client must hear why; the server goes on
            reply = forkwire.SpawnFailed(error=f"{type(exc).__name__}: {exc}")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            conn.sendall(forkwire.encode(reply))
        except OSError:
            pass  # that client is gone; its child's lifeline ends the child
        if refused:  # not one of ours: it gets nothing more from this server
            self.selector.unregister(conn)
            self.clients.remove(conn)
            conn.close()

    def _fork_keeper(self, request: forkwire.SpawnRequest, fds: list[int]) -> tuple[int, int]:
        """Fork a keeper that forks the child and reports its exit; return (keeper, child) pids."""
        if len(fds) < FIXED_FDS:
            raise ValueError(f"a spawn request carries at least {FIXED_FDS} descriptors, got {len(fds)}")
        pid_read, pid_write = os.pipe()
        keeper = os.fork()
        if keeper == 0:
            code = KEEPER_FAILED
            try:
                os.close(pid_read)
                self._close_server_sockets()
                code = keep_child(request, fds, pid_write)
            finally:
                os._exit(code)
        os.close(pid_write)
        try:
            pid_text = os.read(pid_read, 64)
        finally:
            os.close(pid_read)
        if not pid_text:
            raise RuntimeError("the keeper process died before it forked the child")
        # Our copy of the status pipe: if the keeper dies before it reports, we report instead.
        self.keepers[keeper] = Kept(int(pid_text), os.dup(fds[2]))
        return keeper, int(pid_text)

    def _close_server_sockets(self) -> None:
        """In a keeper: nothing of the server's stays open, nor its signal wake-up."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()  # the forked copy of the epoll descriptor; the server's stays as it is
        for sock in (self.listener, self.control, *self.clients):
            sock.close()
        for kept in (*self.keepers.values(), *self.orphans.values()):
            if kept.status_fd >= 0:
                os.close(kept.status_fd)
        os.close(self._wake_read)
        os.close(self._wake_write)


def _peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket (the kernel's word, SO_PEERCRED)."""
    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(pid)


def keep_child(request: forkwire.SpawnRequest, fds: list[int], pid_write: int) -> int:
    """In the keeper: fork the child, tell the server its pid, wait, write its exit status, then
    end every process this keeper adopted (the child's helpers that left its session)."""
    stdin_fd, log_fd, status_fd, *passed = fds
    processes.become_subreaper()  # where it cannot be, the server's ready message says so
    user = dropuser.case_user(request.env) or dropuser.case_user()
    home = dropuser.make_home(*user) if user else None  # the child's own; removed below
    isolated = user is not None and _enter_namespaces()

    def start_child() -> NoReturn:
        os.close(pid_write)
        os.close(status_fd)
        become_child(request, stdin_fd, log_fd, passed, home)

    if isolated:
        init, child, init_status = casens.start(home, start_child)
    else:
        child = os.fork()
        if child == 0:
            start_child()
    os.write(pid_write, str(child).encode())
    os.close(pid_write)
    for fd in (stdin_fd, log_fd, *passed):
        os.close(fd)
    if isolated:
        status = casens.child_status(os.waitpid(init, 0)[1], init_status)
    else:
        _, status = os.waitpid(child, 0)
    reported = _write_status(status_fd, status)
    processes.end_children()
    if home is not None:
        dropuser.remove_home(home)
    return KEEPER_REPORTED if reported else KEEPER_FAILED


def _enter_namespaces() -> bool:
    """Namespaces of the child's own (harness.isolation.server.casens); False where the kernel refuses."""
    try:
        casens.enter()
        return True
    except OSError:
        return False  # the run header says so (harness.run.caseuser.header_line probes the same)


def _write_status(fd: int, status: int) -> bool:
    """The exit status line a client reads (forkclient.ForkedProcess): -N for signal N, as Popen."""
    try:
        os.write(fd, forkwire.status_line(os.waitstatus_to_exitcode(status)))
        return True
    except OSError:
        return False  # the client is gone


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def become_child(
    request: forkwire.SpawnRequest,
    stdin_fd: int,
    log_fd: int,
    passed: list[int],
    home: str | None = None,
) -> NoReturn:
    code = 70
    gc.enable()  # off in the server (main): a child collects as any fresh process does
    try:
        keeper = os.getppid()  # in its own pid namespace: the init (1), which adopts its orphans
        os.setsid()
        os.dup2(stdin_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (stdin_fd, log_fd):
            if fd > 2:
                os.close(fd)
        # The client named its pipes by its own fd numbers; here they arrived with new ones.
        renumber = dict(zip(request.fds, passed))
        argv = request.argv
        # A fresh process takes the request's environment whole; a forked one keeps the server's
        # and changes only what is read after the fork.
        env = {} if argv else {k: v for k, v in os.environ.items() if k not in POST_FORK_VARIABLES}
        for key, value in request.env.items():
            env[key] = str(renumber.get(int(value), value)) if key.endswith("_FD") else value
        env[KEEPER_PID_ENV] = str(keeper)
        if home is not None:  # a case user's child: root's HOME is not its to write (caches, jax's config)
            env["HOME"] = home
            env.pop("XDG_CACHE_HOME", None)
        if argv:
            for fd in passed:
                os.set_inheritable(fd, True)
            os.execve(argv[0], argv, env)
        os.environ.clear()
        os.environ.update(env)
        reseed()
        sys.stdin = open(0, closefd=False)  # fd 0 is the new stdin now
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # the child's stdout for its whole life
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # the child's stderr for its whole life
        from harness.isolation.child import main as child

        code = child.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # report and leave; the client sees the exit code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def remove_socket_folder(listener: socket.socket) -> None:
    folder = os.path.dirname(listener.getsockname() or "")
    if os.path.basename(folder).startswith(SOCKET_FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


# How long a server told to wait (GO_FD_ENV) waits at most: the owner's word only orders the
# imports of a run's servers (which one gets the CPU first); it must never hold a run up.
GO_WAIT_S = 30.0


def wait_for_go(go_fd: int, control: socket.socket, listener: socket.socket) -> bool:
    """Wait for the owner's go (a byte, or its end of the pipe closed) before importing; False
    when the owner is gone meanwhile (its lifeline closed): the socket folder goes, and the
    server ends without having imported anything."""
    readable, _, _ = select.select([go_fd, control.fileno()], [], [], GO_WAIT_S)
    os.close(go_fd)
    if control.fileno() in readable:  # the owner never writes on its lifeline: readable means gone
        remove_socket_folder(listener)
        return False
    return True


def reseed() -> None:
    """A fork inherits its parent's generators; a fresh process would have seeded its own."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # a fresh process seeds torch's default generator from entropy too


def main() -> int:
    user = dropuser.case_user()
    if user is not None:  # --spmd-case-user: the build's import-time code never runs as root
        dropuser.become(*user)
        os.environ["HOME"] = dropuser.make_home(*user)  # in the run's dump root, removed with the run
        os.environ.pop("XDG_CACHE_HOME", None)
    listener = socket.socket(fileno=int(os.environ.pop(LISTEN_FD_ENV)))
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    token = read_token(int(os.environ.pop(TOKEN_FD_ENV)))
    go = os.environ.pop(GO_FD_ENV, None)
    if go is not None and not wait_for_go(int(go), control, listener):
        return 0
    started = time.monotonic()
    # The collector is off while the server imports (import torch_xla runs dozens of full
    # collections: about 1 s of its 4-6 s) and for the server's life; one collection after the
    # imports frees their garbage. What is left is every child's for good: frozen, a child's
    # collections never walk it (a collection writes to every object's header, and each page it
    # writes to is one the child must copy). Children turn the collector back on (become_child).
    gc.disable()
    imported = import_modules([n for n in os.environ.pop(IMPORTS_ENV, "").split(",") if n])
    gc.collect()
    gc.freeze()
    held = [m for m in FORBIDDEN_IN_SERVER if m in sys.modules]
    if held:
        # Printed to the server's log; clients see the server gone and show that log's tail.
        print(
            f"fork server: the imports pulled in {held}, which read the environment at import; "
            "forked children could not change it",
            file=sys.stderr,
            flush=True,
        )
        return 2
    # Without a subreaper, escaped helpers go to init: the log and every client say so.
    containment = processes.become_subreaper()
    ready = forkwire.ServerReady(
        pid=os.getpid(),
        imported=imported,
        threads=len(os.listdir("/proc/self/task")),
        startup_s=round(time.monotonic() - started, 3),
        containment="subreaper" if containment is None else processes.SUBREAPER_UNAVAILABLE.format(why=containment),
    )
    # Clients receive it on connecting.
    print(f"fork server ready: {forkwire.encode(ready).decode()}", flush=True)
    Server(listener, control, ready, token).serve()
    return 0


def read_token(fd: int) -> bytes:
    """The run's token from the pipe the owner passed (it wrote it whole and closed its end)."""
    with os.fdopen(fd, "rb") as pipe:
        token = pipe.read()
    if len(token) != 2 * TOKEN_BYTES:
        raise SystemExit(f"fork server: the owner's token pipe held {len(token)} bytes, not {2 * TOKEN_BYTES}")
    return token


if __name__ == "__main__":
    sys.exit(main())
