"""The parent side of harness.isolation.server.forkserver: start a server, ask it for children, watch them.

`ServerHandle` is the owner's handle: it binds the listening socket, then starts the server process,
which inherits it, so an address can be handed out at once (to xdist workers, which start before
the server's imports are done): connections queue until the server serves. `ForkServerClient` is
one pytest process's connection: the first spawn waits for the server's "ready", each spawn
returns a `ForkedProcess`, a processes.ProcessHandle like a Popen: a pid, stdin, poll() and
wait() with the exit status the child's keeper reports (a signal as -N, as Popen does).

A keeper is not trusted to report: a body can stop it (SIGSTOP) or kill it. A child that has
exited without a status gets its keeper continued (SIGCONT), then, after KEEPER_REPORT_S, killed:
the server, a subreaper, then collects the child and reports the child's own status. Every wait
here has a bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ChildStartError
from harness.isolation.system import files, logtail, processes
from harness.isolation.wire import forkwire
from harness.isolation.wire.forkwire import (
    CONTROL_FD_ENV,
    GO_FD_ENV,
    IMPORTS_ENV,
    LISTEN_BACKLOG,
    LISTEN_FD_ENV,
    POST_FORK_VARIABLES,
    SOCKET_FOLDER_PREFIX,
    TOKEN_BYTES,
    TOKEN_FD_ENV,
)

# How long a child may be gone without its keeper reporting before the keeper is SIGKILLed.
KEEPER_REPORT_S = 3.0
# The key of a pool's exec server: no imports, every child exec'd fresh by its keeper.
EXEC_IMPORTS: tuple[str, ...] = ()


def server_key(python: str, env: Mapping[str, str], imports: tuple[str, ...]) -> str:
    """Children whose key is equal can come from one server: the interpreter, the imports and
    every variable read at import. A short hash, so it can travel to xdist workers."""
    fixed = sorted((k, v) for k, v in env.items() if k not in POST_FORK_VARIABLES)
    text = json.dumps([python, list(imports), fixed])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ServerAddress:
    """Where a client finds a server, the log to show when it is not there, and the run's token
    the server asks of every spawn request (forkwire). Travels to xdist workers in workerinput;
    never written to a file or a log."""

    key: str
    path: str
    log_path: str
    token: str = dataclasses.field(repr=False)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> ServerAddress:
        return cls(data["key"], data["path"], data["log_path"], data["token"])


class ServerHandle:
    """The owner's handle on one server process (the run's controlling pytest process owns it)."""

    def __init__(
        self,
        python: str,
        env: Mapping[str, str],
        imports: tuple[str, ...],
        log_dir: Path,
        wait_to_import: bool = False,
    ) -> None:
        """Socket and process now. wait_to_import: the process waits for start_imports() (at most
        forkserver.GO_WAIT_S) before it imports; clients that connect meanwhile wait for its ready."""
        self.python = python
        self.imports = imports
        self.key = server_key(python, env, imports)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"forkserver-{time.time_ns()}.log"
        self._env = {k: v for k, v in env.items() if k not in POST_FORK_VARIABLES}
        # A short private folder: a Unix socket path has at most 107 bytes, and 0700 keeps other
        # users of the machine from connecting.
        self._dir = tempfile.mkdtemp(prefix=SOCKET_FOLDER_PREFIX)
        token = secrets.token_hex(TOKEN_BYTES)
        self.address = ServerAddress(self.key, os.path.join(self._dir, "server.sock"), str(self.log_path), token)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.address.path)
        self._listener.listen(LISTEN_BACKLOG)
        self.control, self._control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._go: int | None = None  # our end of the pipe the server waits on, while it waits
        self._launch(wait_to_import)

    def _launch(self, wait_to_import: bool) -> None:
        """Start the server process; it inherits the listener, queued connections included."""
        with self._lock:
            go_read = -1
            if wait_to_import:
                go_read, self._go = os.pipe()
            # The token on a pipe the server reads once: not in its environment, which any process
            # of this user can read in /proc. It fits in the pipe's buffer, so the write never blocks.
            token_read, token_write = os.pipe()
            os.write(token_write, self.address.token.encode())
            os.close(token_write)
            env = {
                **self._env,
                IMPORTS_ENV: ",".join(self.imports),
                LISTEN_FD_ENV: str(self._listener.fileno()),
                CONTROL_FD_ENV: str(self._control_theirs.fileno()),
                TOKEN_FD_ENV: str(token_read),
                forkwire.RUN_PIDS_ENV: str(os.getppid()) if os.environ.get("PYTEST_XDIST_WORKER") else "",
                **({GO_FD_ENV: str(go_read)} if wait_to_import else {}),
            }
            passed = (self._listener.fileno(), self._control_theirs.fileno(), token_read)
            try:
                with os.fdopen(files.open_file(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as log:
                    self.proc = processes.start_in_session(
                        [self.python, "-u", "-m", "harness.isolation.server.forkserver"],
                        env=env,
                        stdout=log,
                        pass_fds=passed + ((go_read,) if wait_to_import else ()),
                    )
            finally:
                os.close(token_read)
                if wait_to_import:
                    os.close(go_read)
            self._listener.close()
            self._control_theirs.close()

    def start_imports(self) -> None:
        """Let a server started with wait_to_import import now (once; no-op otherwise)."""
        with self._lock:
            if self._go is None:
                return
            try:
                os.write(self._go, b"g")
            except OSError:
                pass  # the server is gone: its clients see that
            os.close(self._go)
            self._go = None

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """End the server and its keepers (children are ended by their own pools), remove the socket."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.proc is None:
                self._listener.close()
                self._control_theirs.close()
        if self._go is not None:
            os.close(self._go)
            self._go = None
        self.control.close()  # the server's lifeline: it ends its descendants, then its group
        if self.proc is not None:
            # Time to end what it adopted (escaped helpers); a server that cannot (stopped) is killed.
            if processes.wait_for_exit(self.proc, processes.END_CHILDREN_S + 1.0) is None:
                processes.kill_group_now(self.proc)
                processes.wait_for_exit(self.proc, 5.0)
        shutil.rmtree(self._dir, ignore_errors=True)


class ForkedProcess:
    """A child a server's keeper forked or exec'd, as child_process.ChildProcess sees it: a
    processes.ProcessHandle, like a Popen, whose exit status comes from the keeper's pipe."""

    def __init__(self, pid: int, stdin_fd: int, status_fd: int, keeper: int | None = None) -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin_fd, "wb")
        self.returncode: int | None = None
        self.status_lost = False  # True: the child is gone and nobody could say how it ended
        self._status_fd: int | None = status_fd
        self._status = b""
        self._pidfd = processes.pidfd_open(pid)
        self._keeper_pidfd = processes.pidfd_open(keeper) if keeper else None
        self._gone_since: float | None = None  # when the child was first seen gone without a status
        os.set_blocking(status_fd, False)

    def poll(self) -> int | None:
        if self.returncode is not None or self._status_fd is None:
            return self.returncode
        try:
            chunk = os.read(self._status_fd, 64)
        except BlockingIOError:
            self._nudge_keeper()
            return None
        if chunk:
            self._status += chunk
            if not self._status.endswith(b"\n"):
                return None
            self.returncode = forkwire.parse_status(self._status)
        elif self._child_exited():
            # Every writer is gone (keeper and server) and the status with them. SIGKILL is what
            # ends a server's group; status_lost lets the evidence say the status is unknown.
            self.returncode = -signal.SIGKILL
            self.status_lost = True
        else:
            return None  # keeper and server gone, child still running: its pool will end it
        self._close()
        return self.returncode

    def _child_exited(self) -> bool:
        if self._pidfd is not None:  # immune to the pid being reused
            return bool(select.select([self._pidfd], [], [], 0)[0])
        return not processes.is_running(self.pid)

    def _nudge_keeper(self) -> None:
        """The child is gone and its keeper has not reported: continue it, and in the end kill it."""
        if self._keeper_pidfd is None or not self._child_exited():
            return
        now = time.monotonic()
        if self._gone_since is None:
            self._gone_since = now
            processes.pidfd_signal(self._keeper_pidfd, signal.SIGCONT)  # a stopped keeper cannot reap
        elif now - self._gone_since > KEEPER_REPORT_S:
            processes.pidfd_signal(self._keeper_pidfd, signal.SIGKILL)  # the server reports the child instead
            os.close(self._keeper_pidfd)
            self._keeper_pidfd = None

    def _close(self) -> None:
        for fd in (self._status_fd, self._pidfd, self._keeper_pidfd):
            if fd is not None:
                os.close(fd)
        self._status_fd = self._pidfd = self._keeper_pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]  # poll() returned a code, so it is set


class ForkServerClient:
    """One pytest process's connection to a server."""

    def __init__(self, address: ServerAddress, startup_timeout: float) -> None:
        self.address = address
        self.startup_timeout = startup_timeout
        self.ready: forkwire.ServerReady | None = None  # awaited at the first spawn: connecting never blocks
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.connect(address.path)
        except OSError as exc:
            self.sock.close()
            raise self._start_error(f"cannot be reached at {address.path} ({exc.strerror or exc})") from None

    def _start_error(self, what: str) -> ChildStartError:
        return ChildStartError(
            f"fork server {what}; log: {self.address.log_path}\n{logtail.tail_file(Path(self.address.log_path))}"
        )

    def _receive(self, what: str, timeout: float, *expected: type) -> Any:
        """The server's next message, of one of the `expected` types; a SpawnFailed it sends
        instead is a ChildStartError."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(forkwire.MAX_MESSAGE_BYTES)
        except (TimeoutError, OSError) as exc:
            self.close()
            raise self._start_error(f"gave no {what} within {timeout:.0f}s ({exc})") from None
        if not data:
            self.close()
            raise self._start_error(f"ended before its {what}")
        message = forkwire.decode(data, *expected, forkwire.SpawnFailed)
        if isinstance(message, forkwire.SpawnFailed):
            raise ChildStartError(f"fork server could not fork a child: {message.error}")
        return message

    def is_usable(self) -> bool:
        """False once the server closed the connection (it died or was ended)."""
        if self.sock.fileno() < 0:
            return False
        if self.ready is None:
            return True  # the ready message may still be due
        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable  # a ready server says nothing unasked: readable means closed

    def spawn(
        self, env: Mapping[str, str], log_fd: int, pass_fds: tuple[int, ...], argv: list[str] | None = None
    ) -> ForkedProcess:
        """A new child with `env` (post-fork variables), stdout/stderr on log_fd, `pass_fds` open;
        with `argv`, a fresh process: the child execs argv with the whole of `env`."""
        if self.ready is None:
            self.ready = self._receive("ready", self.startup_timeout, forkwire.ServerReady)
        stdin_read, stdin_write = os.pipe()
        status_read, status_write = os.pipe()
        if argv:
            request = forkwire.SpawnRequest(
                token=self.address.token, env=dict(env), fds=list(pass_fds), argv=list(argv)
            )
        else:
            request = forkwire.SpawnRequest(
                token=self.address.token,
                env={k: v for k, v in env.items() if k in POST_FORK_VARIABLES},
                fds=list(pass_fds),
                argv=None,
            )
        try:
            try:
                socket.send_fds(self.sock, [forkwire.encode(request)], [stdin_read, log_fd, status_write, *pass_fds])
            except OSError as exc:
                self.close()
                raise self._start_error(f"closed the connection ({exc.strerror or exc})") from None
            reply = self._receive("child", self.startup_timeout, forkwire.Spawned)
        except BaseException:
            os.close(stdin_write)
            os.close(status_read)
            raise
        finally:
            os.close(stdin_read)
            os.close(status_write)
        return ForkedProcess(reply.pid, stdin_write, status_read, reply.keeper)

    def close(self) -> None:
        self.sock.close()
