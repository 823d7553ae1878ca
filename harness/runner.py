"""Parent side of the child processes: start, talk to, time out and reap them.

One `ChildProcess` is one `python -m harness.child` in its own process group, with an explicit
environment, its stdout/stderr in its own log file, and answers on a private pipe. A
`ChildPool` keeps warm children keyed by their `ChildSpec` (environment + set-up hooks), because
`import torch_xla` costs seconds and SPMD mode, functionalization and the device count are fixed
once per process. A crash or a timeout is always charged to the case in flight, and that child
is never reused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import protocol
from harness.errors import CaseCrashed, CaseTimedOut, ChildStartError

LOG_TAIL_LINES = 40
TERMINATE_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """Everything that is fixed for the life of a child; equal specs can share a child."""

    env: tuple[tuple[str, str], ...]
    preload: tuple[str, ...] = ()
    python: str = sys.executable

    @classmethod
    def build(cls, env: dict[str, str], preload: tuple[str, ...] = (), python: str | None = None) -> "ChildSpec":
        return cls(tuple(sorted(env.items())), tuple(preload), python or sys.executable)

    def describe(self) -> str:
        interesting = {k: v for k, v in self.env if k.startswith(("PJRT_", "CPU_NUM", "XLA_", "HARNESS_BACKEND"))}
        return " ".join(f"{k}={v}" for k, v in sorted(interesting.items()))


def signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


class _LineReader:
    """Reads newline-terminated JSON messages from a pipe with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next message; None on EOF (the child died); TimeoutError past the deadline."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


class ChildProcess:
    def __init__(self, spec: ChildSpec, log_dir: Path) -> None:
        self.spec = spec
        log_dir.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        env = dict(spec.env)
        env[protocol.RESULT_FD_ENV] = str(write_fd)
        env[protocol.PRELOAD_ENV] = ",".join(spec.preload)
        self.log_path = log_dir / f"child-{time.time_ns()}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [spec.python, "-u", "-m", "harness.child"],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                env=env, pass_fds=(write_fd,), start_new_session=True,
            )
        os.close(write_fd)  # so that the child's death reads as EOF here
        self.reader = _LineReader(read_fd)
        self.ready: dict[str, Any] | None = None
        self.cases_run = 0

    @property
    def torch_xla(self) -> str | None:
        return (self.ready or {}).get("torch_xla")

    def log_text(self, since: int = 0) -> str:
        with self.log_path.open("rb") as fh:
            fh.seek(since)
            return fh.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def wait_ready(self, timeout: float) -> None:
        if self.ready is not None:
            return
        try:
            message = self.reader.read(time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            raise ChildStartError(
                f"child ({self.spec.describe()}) was not ready after {timeout:.0f}s; "
                f"raise --case-timeout if start-up is slow here.\n--- log tail ---\n{tail(self.log_text())}"
            ) from None
        if message is None or message.get("kind") != "ready":
            how = signal_name(self.proc.wait()) if message is None else "its set-up raised"
            detail = "" if message is None else message["exception"]["traceback"]
            raise ChildStartError(
                f"child ({self.spec.describe()}) died before it was ready ({how}).\n"
                f"{detail}--- log tail ---\n{tail(self.log_text())}"
            )
        self.ready = message

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request; the verdict, or CaseCrashed/CaseTimedOut (the child is then gone)."""
        offset = self.log_size()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the child died; the read below sees EOF and reports it
        self.cases_run += 1
        try:
            message = self.reader.read(time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            log = tail(self.log_text(offset))
            raise CaseTimedOut(
                f"case {request['case']} timed out after {timeout:.0f}s; the child's process group "
                f"got SIGTERM, then SIGKILL.\n--- child log (this case) ---\n{log}",
                evidence=f"timeout after {timeout:.0f}s\n{log}", log_tail=log,
            ) from None
        if message is None:
            how = signal_name(self.proc.wait())
            log = tail(self.log_text(offset))
            raise CaseCrashed(
                f"child died with {how} while running case {request['case']}.\n"
                f"--- child log (this case) ---\n{log}",
                evidence=f"{how}\n{log}", log_tail=log,
            )
        message["log_tail"] = tail(self.log_text(offset))
        return message

    def kill(self) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # EOF: the child leaves its loop and exits
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
        os.close(self.reader.fd)


class ChildPool:
    """Warm children keyed by spec; at most one per spec, since a process runs one case at a time.

    exclusive: the device admits one process at a time (a TPU host: libtpu locks the chips), so
    every idle child is closed before another one starts.
    spares: when a case takes a fresh child, start the next one for the same spec right away, so
    its import runs on an idle core while the case runs. A spare has run no case, so it is as
    fresh as a new process. Off on exclusive devices and where every core is busy (xdist).
    """

    def __init__(self, log_dir: Path, startup_timeout: float, exclusive: bool = False, spares: bool = False) -> None:
        self.log_dir = log_dir
        self.startup_timeout = startup_timeout
        self.exclusive = exclusive
        self.spares_enabled = spares and not exclusive
        self.idle: dict[ChildSpec, ChildProcess] = {}
        self.spares: dict[ChildSpec, ChildProcess] = {}
        self.started = 0

    def prewarm(self, spec: ChildSpec) -> None:
        """Start a child now (it imports in the background) so the first case finds it warm."""
        if spec not in self.idle:
            self.idle[spec] = self._start(spec)

    def _start(self, spec: ChildSpec) -> ChildProcess:
        if self.exclusive:
            self.close()
        self.started += 1
        return ChildProcess(spec, self.log_dir)

    def acquire(self, spec: ChildSpec, fresh: bool) -> ChildProcess:
        child = self.spares.pop(spec, None) if fresh else self.idle.pop(spec, None)
        if child is not None and not child.is_alive():
            child = None  # it died between cases: that death belongs to no case, start anew
        child = child or self._start(spec)
        if fresh and self.spares_enabled:
            self.spares[spec] = self._start(spec)
        child.wait_ready(self.startup_timeout)
        return child

    def release(self, child: ChildProcess, reusable: bool) -> None:
        if reusable and child.is_alive() and child.spec not in self.idle:
            self.idle[child.spec] = child
        else:
            child.close()

    def close(self) -> None:
        for child in [*self.idle.values(), *self.spares.values()]:
            child.close()
        self.idle.clear()
        self.spares.clear()
