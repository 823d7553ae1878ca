"""The parent's handle on one child process: start it, send it a case, read its answers, end it.

One `ChildProcess` is one process running harness.isolation.child.main's main loop in a session of its
own, with an explicit environment, its stdout/stderr in its own log file, answers on a private
pipe (harness.isolation.wire.protocol) and a lifeline pipe whose only write end the parent holds: when
the parent goes, even by SIGKILL, the child's watchdog kills the child's whole process group.
Every child comes from a server's keeper (harness.isolation.server.forkserver): forked from a server
that imported torch_xla once, or, fresh, exec'd by its keeper as `python -m harness.isolation.child`.
Popen would make pytest its parent, and pytest cannot be the subreaper that catches what a body
starts in a session of its own (it would adopt every orphan of the run and must not reap what it
did not start); a keeper can, and its server, a subreaper too, still reports the child if a body
kills the keeper. The parent's handle on the process is a processes.ProcessHandle.

Who is charged with what:
  * the child fails to start (dies, or says anything but "ready"): no case (ChildStartError);
  * the child dies, times out or answers out of turn between "started" and its verdict: the case
    in flight (CaseCrashed / CaseTimedOut / CaseProtocolError);
  * the child dies or says anything after a verdict and before it acknowledged the next request:
    the case that just ran (`LateFault`), and the next case is run in a new child; a child that
    has run no case charges the case being begun instead (`ChildProcess._charge` decides).
A death is seen from the child's own exit (pidfd), so a descendant that keeps the result pipe
open (a forked copy of the body, a gloo rank) cannot turn a crash into a timeout.
"""

from __future__ import annotations

import dataclasses
import os
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import CaseCrashed, CaseError, CaseProtocolError, CaseTimedOut, ChildStartError, HarnessError
from harness.isolation.parent import evidence, observations
from harness.isolation.parent.forkclient import KEEPER_REPORT_S, ForkServerClient
from harness.isolation.system import files, processes
from harness.isolation.system.processes import ProcessHandle
from harness.isolation.wire import protocol

# A child acknowledges a request as soon as it reads it; one that does not within this time is
# stuck in what its previous case left running.
ACK_TIMEOUT_S = 30.0
READ_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """Everything that is fixed for the life of a child; equal specs can share a child."""

    env: tuple[tuple[str, str], ...]
    preload: tuple[str, ...] = ()
    python: str = sys.executable
    # What a fork server for this child imports (harness.isolation.server.forkserver); None: exec a fresh process.
    fork_imports: tuple[str, ...] | None = None

    @classmethod
    def build(
        cls,
        env: dict[str, str],
        preload: tuple[str, ...] = (),
        python: str | None = None,
        fork_imports: tuple[str, ...] | None = None,
    ) -> ChildSpec:
        return cls(tuple(sorted(env.items())), tuple(preload), python or sys.executable, fork_imports)

    def describe(self) -> str:
        interesting = {k: v for k, v in self.env if k.startswith(("PJRT_", "CPU_NUM", "XLA_", "HARNESS_BACKEND"))}
        return " ".join(f"{k}={v}" for k, v in sorted(interesting.items()))


class LateFault(HarnessError):
    """The child misbehaved after the verdict of `case` and before acknowledging the next request.

    Not a CaseError: it is charged to `case`, which has finished (its record is amended), not to
    the case whose start found it."""

    def __init__(self, case: str, evidence: str, log_tail: str) -> None:
        super().__init__(f"case {case}: {evidence.splitlines()[0]}")
        self.case = case
        self.evidence = evidence
        self.log_tail = log_tail


class _Exited:
    """Sentinel: the child process has exited and every byte it sent has been read."""


EXITED = _Exited()


class ChildProcess:
    def __init__(self, spec: ChildSpec, log_dir: Path, server: ForkServerClient, fresh: bool = False) -> None:
        """Start the child by `server`'s keeper: forked, or (fresh) exec'd as `python -m harness.isolation.child`."""
        self.spec = spec
        self.server = server  # checked after the case: a body that killed it is charged (harness.isolation.parent.case)
        files.own_folder(log_dir, depth=2)  # logs/<worker>: links a case put there are replaced
        result_read, result_write = os.pipe()
        lifeline_read, self.lifeline = os.pipe()
        env = dict(spec.env)
        env[protocol.RESULT_FD_ENV] = str(result_write)
        env[protocol.LIFELINE_FD_ENV] = str(lifeline_read)
        env[protocol.PRELOAD_ENV] = ",".join(spec.preload)
        self.log_path = log_dir / f"child-{time.time_ns()}.log"
        try:
            with os.fdopen(files.open_file(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as log:
                argv = [spec.python, "-u", "-m", "harness.isolation.child"] if fresh else None
                self.proc: ProcessHandle = server.spawn(env, log.fileno(), (result_write, lifeline_read), argv)
        except BaseException:
            for fd in (result_read, self.lifeline):
                os.close(fd)
            raise
        finally:
            os.close(result_write)
            os.close(lifeline_read)
        self.result_fd = result_read
        self.pidfd = processes.pidfd_open(self.proc.pid)
        self.buffer = protocol.LineBuffer()
        self.pipe_closed = False
        self.ready: protocol.Ready | None = None
        self.next_id = 1
        self.last_case: str | None = None  # the case of the last verdict: owner of a late fault
        self.last_offset = 0  # where that case's part of the log starts
        self.quiet = True  # False: that case left a thread or process running (protocol.ChildAnswer.quiet)
        self.cases_run = 0
        self.ended = False
        self.timeout_s = 0.0

    @property
    def torch_xla(self) -> str | None:
        return self.ready.torch_xla if self.ready else None

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    # ---------------------------------------------------------------- reading the result pipe

    def _next_message(self, deadline: float) -> Any:
        """The next message, EXITED, or TimeoutError; protocol.ProtocolError for a bad line."""
        while True:
            line = self.buffer.next_line()
            if line is not None:
                return protocol.decode(line)
            if self.proc.poll() is not None:
                if not self._drain():  # everything the child wrote is in; nothing more will come
                    return EXITED
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._wait_readable(min(remaining, 1.0))

    def _wait_readable(self, timeout: float) -> None:
        watched = [] if self.pipe_closed else [self.result_fd]
        if self.pidfd is not None:
            watched.append(self.pidfd)
        else:
            timeout = min(timeout, 0.05)  # no pidfd (not Linux): poll for the exit
        if watched:
            ready, _, _ = select.select(watched, [], [], timeout)
        else:
            time.sleep(timeout)
            ready = []
        if self.result_fd in ready:
            self._read_chunk()
        elif self.pidfd in ready and self.proc.poll() is None:
            time.sleep(min(timeout, 0.02))  # it exited; its keeper has yet to report how (no spinning)

    def _read_chunk(self) -> bool:
        chunk = os.read(self.result_fd, READ_CHUNK)
        if not chunk:
            self.pipe_closed = True  # every writer closed it; the child's exit is next
            return False
        self.buffer.feed(chunk)
        return True

    def _drain(self) -> bool:
        """Read whatever is already in the pipe without waiting; True if anything came."""
        got = False
        while not self.pipe_closed and select.select([self.result_fd], [], [], 0)[0]:
            got = self._read_chunk() or got
        return got

    def _exit_description(self) -> str:
        code = processes.wait_for_exit(self.proc, KEEPER_REPORT_S + 5.0)
        if getattr(self.proc, "status_lost", False):  # a ForkedProcess whose keeper and server both died
            return "exit status unknown (its keeper and fork server ended before reporting it)"
        return processes.describe_exit(code)

    # ---------------------------------------------------------------- start-up

    def wait_ready(self, timeout: float) -> None:
        if self.ready is not None:
            return
        try:
            message = self._next_message(time.monotonic() + timeout)
        except TimeoutError:
            self.end(grace_s=processes.TERMINATE_GRACE_S)
            raise ChildStartError(
                f"child ({self.spec.describe()}) was not ready after {timeout:.0f}s; "
                f"raise --spmd-case-timeout if start-up is slow here.\n--- log tail ---\n"
                f"{evidence.log_tail(self.log_path)}"
            ) from None
        except protocol.ProtocolError as exc:
            self.end()
            raise ChildStartError(
                f"child ({self.spec.describe()}) sent {exc} instead of 'ready'.\n"
                f"--- log tail ---\n{evidence.log_tail(self.log_path)}"
            ) from None
        if isinstance(message, protocol.Ready):
            self.ready = message
            return
        if isinstance(message, protocol.StartupFailed):
            how, detail = "its set-up raised", message.exception["traceback"]
        elif message is EXITED:
            how, detail = self._exit_description(), ""
        else:
            how, detail = f"it sent {message.kind} instead of ready", ""
        self.end()
        cause, _ = evidence.crash_evidence(how, self.log_path)
        raise ChildStartError(f"child ({self.spec.describe()}) failed before it was ready: {cause}\n{detail}")

    # ---------------------------------------------------------------- one case

    def begin(self, case: str, body: dict[str, str], kwargs: dict[str, Any], deadline: float) -> tuple[int, int]:
        """Send the request and wait for its acknowledgement; (request id, log offset of the case).

        Raises LateFault when what went wrong belongs to the previous case, else a CaseError.
        """
        self.timeout_s = max(0.0, deadline - time.monotonic())
        request = protocol.Request(id=self.next_id, case=case, body=body, kwargs=kwargs)
        self.next_id += 1
        offset = self.log_size()
        previous = self.last_case
        self._drain()
        if self.buffer.pending() and previous:  # it spoke after its verdict, before being asked
            raise self._late_fault(previous, "protocol failure: the child answered again after its verdict")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(protocol.encode(request))
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the child is gone or closed stdin: the read below tells which
        try:
            message = self._next_message(min(deadline, time.monotonic() + ACK_TIMEOUT_S) if previous else deadline)
        except TimeoutError:
            raise self._charge(
                previous,
                f"the child did not acknowledge the next request within {ACK_TIMEOUT_S:.0f}s "
                "(stuck in what this case left running)",
                lambda: self._timed_out(case, deadline, offset),
            ) from None
        except protocol.ProtocolError as exc:
            sent = f"sent {exc}"
            raise self._charge(
                previous,
                f"protocol failure: the child {sent} after its verdict",
                lambda: self._protocol_failure(case, sent, offset),
            ) from None
        if isinstance(message, protocol.Started) and message.id == request.id:
            self.cases_run += 1
            return request.id, offset
        if message is EXITED:
            how = self._exit_description()
            raise self._charge(
                previous,
                f"{how} after the verdict of this case, before the next case started",
                lambda: self._crashed(case, how, offset),
            )
        what = f"sent {_describe(message)} when request {request.id} was due to be acknowledged"
        raise self._charge(
            previous, f"protocol failure: the child {what}", lambda: self._protocol_failure(case, what, offset)
        )

    def _charge(self, previous: str | None, late: str, own: Callable[[], CaseError]) -> LateFault | CaseError:
        """Who is charged with a fault seen before the child acknowledged a request, in one place.

        A child that ran a case (`previous`) answered it, so what goes wrong before it takes the
        next request is what that case left behind: a LateFault saying `late`. A child that has
        run nothing was ready (its start-up is wait_ready's to judge) and has been handed this
        case: the case being begun is charged, with the CaseError that `own` makes.
        """
        if previous:
            return self._late_fault(previous, late)
        return own()

    def finish(self, case: str, request_id: int, deadline: float, offset: int) -> protocol.ChildAnswer:
        """Wait for the verdict of the request in flight; a CaseError for anything else."""
        try:
            message = self._next_message(deadline)
        except TimeoutError:
            raise self._timed_out(case, deadline, offset) from None
        except protocol.ProtocolError as exc:
            raise self._protocol_failure(case, f"sent {exc}", offset) from None
        if message is EXITED:
            raise self._crashed(case, self._exit_description(), offset)
        if not (isinstance(message, protocol.ChildAnswer) and message.id == request_id):
            raise self._protocol_failure(case, f"sent {_describe(message)} instead of verdict {request_id}", offset)
        unreadable = observations.problem(message.observations)
        if unreadable:
            raise self._protocol_failure(case, f"sent verdict {request_id}, but {unreadable}", offset)
        self._drain()
        if self.buffer.pending():
            raise self._protocol_failure(
                case, "sent more after its verdict (a second answer, or a forked copy of the child answering)", offset
            )
        code = self.proc.poll()
        if code not in (None, 0):
            raise self._crashed(case, f"{processes.describe_exit(code)} right after its verdict", offset)
        self.last_case, self.last_offset = case, offset
        self.quiet = message.quiet
        return message

    def post_mortem(self, released: bool = False) -> LateFault | None:
        """For an idle child: a LateFault of its last case if it died or spoke since that verdict.
        released: it was let go unfit, and may have ended cleanly (exit code 0) on its own."""
        if self.last_case is None or self.ended:
            return None
        self._drain()
        if self.buffer.pending():
            return self._late_fault(self.last_case, "protocol failure: the child answered again after its verdict")
        code = self.proc.poll()
        if code is not None and not (released and code == 0):
            return self._late_fault(
                self.last_case,
                f"{processes.describe_exit(code)} after the verdict of this case, while the child was idle",
            )
        return None

    # ---------------------------------------------------------------- failures

    def _crashed(self, case: str, how: str, offset: int) -> CaseCrashed:
        self.end()
        cause, tail = evidence.crash_evidence(how, self.log_path, offset)
        return CaseCrashed(_message(cause, f"the child died while running case {case}"), evidence=cause, log_tail=tail)

    def _timed_out(self, case: str, deadline: float, offset: int) -> CaseTimedOut:
        self.end(grace_s=processes.TERMINATE_GRACE_S)  # SIGTERM first: faulthandler writes the stacks
        cause, tail = evidence.crash_evidence(f"timeout after {self.timeout_s:.0f}s", self.log_path, offset)
        return CaseTimedOut(
            _message(cause, f"case {case} ran too long; the child's process group got SIGTERM, then SIGKILL"),
            evidence=cause,
            log_tail=tail,
        )

    def _protocol_failure(self, case: str, what: str, offset: int) -> CaseProtocolError:
        self.end()
        tail = evidence.log_tail(self.log_path, offset)
        cause = f"protocol failure: the child {what}"
        cause = f"{cause}\n--- log tail ---\n{tail}"
        return CaseProtocolError(
            _message(cause, f"case {case}; the child was discarded"), evidence=cause, log_tail=tail
        )

    def _late_fault(self, case: str, what: str) -> LateFault:
        self.end()
        cause, tail = evidence.crash_evidence(what, self.log_path, self.last_offset)
        return LateFault(case, cause, tail)

    # ---------------------------------------------------------------- ending

    def end(self, grace_s: float = 0.0) -> int | None:
        """End the child and its whole process group; idempotent. grace_s > 0: SIGTERM first."""
        if not self.ended:
            self.ended = True
            if grace_s > 0:
                processes.terminate_group(self.proc, grace_s)
            else:
                processes.kill_group_now(self.proc)
            for fd in (self.lifeline, self.result_fd, self.pidfd):
                if fd is not None:
                    _close_quietly(fd)
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
        return self.proc.poll()

    def reaped(self) -> bool:
        """True once an ended child's exit has been collected (no zombie left)."""
        return self.proc.poll() is not None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _describe(message: Any) -> str:
    if isinstance(message, (protocol.ChildAnswer, protocol.Started)):
        return f"{message.kind} {message.id}"
    return getattr(message, "kind", repr(message))


def _message(cause: str, context: str) -> str:
    """The failure text: the cause's headline first (what pytest shows as the reason), then the log."""
    headline, _, tail = cause.partition("\n--- log tail ---\n")
    return evidence.terminal_safe(f"{headline}\n({context})\n--- child log (this case) ---\n{tail}")


__all__ = ["ChildProcess", "ChildSpec", "LateFault"]
