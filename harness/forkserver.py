"""A fork server: import torch and torch_xla once per run, fork a child per case environment.

`import torch_xla` costs 4-6 s and most of a child's memory; the state it leaves is the same for
every child of one interpreter and import-time environment. The server (`python -m
harness.forkserver`) imports only what is listed in HARNESS_FORKSERVER_IMPORTS, makes no runtime
call (no PJRT client, no JAX backend, no torch op: a torch CPU op would start libgomp's pool and
a forked child's first matmul would hang), then forks on request. What a child may still choose
after the fork is the environment variables torch_xla reads at use, not at import
(`POST_FORK_VARIABLES`); every other variable keys the server.

Each child is forked twice (server -> intermediate -> child, the intermediate exits at once), so
it is re-parented to the pytest process, which makes itself a child subreaper: pytest then waits
for it like for any child of its own, and sees its exit status. The child starts a session of
its own, takes its stdin, log and pipes from the parent (passed over a Unix socket), sets its
environment, reseeds its random generators and runs `harness.child.main()`: from there on it is
exactly a child started by exec.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from harness import processes
from harness.errors import ChildStartError

IMPORTS_ENV = "HARNESS_FORKSERVER_IMPORTS"
SOCKET_FD_ENV = "HARNESS_FORKSERVER_FD"
# Read by torch_xla (C++) or the harness at each use, so a forked child may set them. Seen for
# XLA_DISABLE_FUNCTIONALIZATION and CPU_NUM_DEVICES on torch_xla 2.6-2.9: forked children with
# either changed give the same shardings, outputs and losses as fresh processes.
POST_FORK_VARIABLES = frozenset({
    "XLA_DISABLE_FUNCTIONALIZATION", "CPU_NUM_DEVICES", "MASTER_ADDR", "MASTER_PORT",
    "HARNESS_BACKEND", "HARNESS_DEVICES", "HARNESS_PRELOAD", "HARNESS_RESULT_FD", "HARNESS_LIFELINE_FD",
})
# Modules that read the environment once at import; a server must never hold them.
FORBIDDEN_IN_SERVER = ("torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel",
                       "torch_xla.experimental.spmd_fully_sharded_data_parallel")
XLA_IMPORTS = ("torch", "torch_xla", "torch_xla.runtime", "torch_xla.distributed.spmd", "jax?")
TORCH_IMPORTS = ("torch",)
PR_SET_CHILD_SUBREAPER = 36
MAX_CONTROL_MESSAGE = 1 << 20


def server_key(python: str, env: Mapping[str, str], imports: tuple[str, ...]) -> tuple:
    """Children whose key is equal can come from one server."""
    fixed = tuple(sorted((k, v) for k, v in env.items() if k not in POST_FORK_VARIABLES))
    return (python, imports, fixed)


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (the forked children). Linux only."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------


class AdoptedProcess:
    """A forked child re-parented to this process: what runner.ChildProcess needs of a Popen."""

    def __init__(self, pid: int, stdin_fd: int) -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin_fd, "wb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours to wait for (no subreaper): judge by /proc
                if not Path(f"/proc/{self.pid}").exists():
                    self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]


class ForkServer:
    """The parent's handle on one server process."""

    def __init__(self, python: str, env: Mapping[str, str], imports: tuple[str, ...], log_dir: Path,
                 startup_timeout: float) -> None:
        self.imports = imports
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"forkserver-{time.time_ns()}.log"
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_env = {k: v for k, v in env.items() if k not in POST_FORK_VARIABLES}
        server_env[IMPORTS_ENV] = ",".join(imports)
        server_env[SOCKET_FD_ENV] = str(theirs.fileno())
        with self.log_path.open("wb") as log:
            self.proc = processes.start_in_session([python, "-u", "-m", "harness.forkserver"], env=server_env,
                                                   stdout=log, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock.settimeout(startup_timeout)
        self.ready: dict[str, Any] | None = None  # awaited at the first spawn: starting never blocks

    def _receive(self, what: str) -> dict[str, Any]:
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = self.sock.recv(MAX_CONTROL_MESSAGE)
                if not chunk:
                    break
                data += chunk
        except (socket.timeout, OSError) as exc:
            self.close()
            raise ChildStartError(f"fork server gave no {what} ({exc}); log: {self.log_path}\n"
                                  f"{processes.tail_file(self.log_path)}") from None
        if not data:
            code = processes.wait_for_exit(self.proc, 5.0)
            self.close()
            raise ChildStartError(f"fork server died ({processes.describe_exit(code)}) before its {what}; "
                                  f"log: {self.log_path}\n{processes.tail_file(self.log_path)}")
        message = json.loads(data)
        if "error" in message:
            raise ChildStartError(f"fork server could not fork a child: {message['error']}")
        return message

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, env: Mapping[str, str], log_fd: int, pass_fds: tuple[int, ...]) -> AdoptedProcess:
        """A new child with `env` (post-fork variables), stdout/stderr on log_fd, `pass_fds` open."""
        if self.ready is None:
            self.ready = self._receive("ready")
        stdin_read, stdin_write = os.pipe()
        request = {"env": {k: v for k, v in env.items() if k in POST_FORK_VARIABLES}, "fds": list(pass_fds)}
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode() + b"\n"], [stdin_read, log_fd, *pass_fds])
            reply = self._receive("child")
        finally:
            os.close(stdin_read)
        return AdoptedProcess(reply["pid"], stdin_write)

    def close(self) -> None:
        self.sock.close()
        processes.kill_group_now(self.proc)
        processes.wait_for_exit(self.proc, 5.0)


# ------------------------------------------------------------------------------------------
# Server side: python -m harness.forkserver
# ------------------------------------------------------------------------------------------


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


def serve(sock: socket.socket) -> None:
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MAX_CONTROL_MESSAGE, 16)
        if not message:
            return
        try:
            pid = fork_child(json.loads(message), fds, sock)
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except Exception as exc:  # noqa: BLE001 - the parent must hear why, the server goes on
            sock.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        finally:
            for fd in fds:
                os.close(fd)


def fork_child(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """Fork twice; return the grandchild's pid (it is adopted by the parent, a subreaper)."""
    report_read, report_write = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            os.close(report_read)
            child = os.fork()
            if child == 0:
                os.close(report_write)
                become_child(request, fds, sock)  # never returns
            os.write(report_write, str(child).encode())
        finally:
            os._exit(0)
    os.close(report_write)
    pid_text = os.read(report_read, 64)
    os.close(report_read)
    os.waitpid(intermediate, 0)
    return int(pid_text)


def become_child(request: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    code = 70
    try:
        sock.close()
        os.setsid()
        stdin_fd, log_fd, *passed = fds
        os.dup2(stdin_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (stdin_fd, log_fd):
            if fd > 2:
                os.close(fd)
        # The parent named its pipes by its own fd numbers; here they arrived with new ones.
        renumber = dict(zip(request["fds"], passed))
        env = {k: v for k, v in os.environ.items() if k not in POST_FORK_VARIABLES}
        for key, value in request["env"].items():
            env[key] = str(renumber.get(int(value), value)) if key.endswith("_FD") else value
        os.environ.clear()
        os.environ.update(env)
        reseed()
        sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115 - fd 0 is the new stdin now
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from harness import child

        code = child.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report and leave; the parent sees the exit code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


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
    sock = socket.socket(fileno=int(os.environ.pop(SOCKET_FD_ENV)))
    started = time.monotonic()
    imported = import_modules([n for n in os.environ.pop(IMPORTS_ENV, "").split(",") if n])
    held = [m for m in FORBIDDEN_IN_SERVER if m in sys.modules]
    if held:
        sock.sendall(json.dumps({"error": f"the server's imports pulled in {held}, which read the "
                                 "environment at import; fork children cannot change it"}).encode() + b"\n")
        return 2
    threads = len(os.listdir("/proc/self/task"))
    sock.sendall(json.dumps({"ready": True, "pid": os.getpid(), "imported": imported, "threads": threads,
                             "startup_s": round(time.monotonic() - started, 3)}).encode() + b"\n")
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
