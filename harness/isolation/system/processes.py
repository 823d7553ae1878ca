"""The one way the harness starts, ends and describes processes.

Every process the harness ends as a whole runs in a session of its own, so that ending it ends
everything it started. A fork server, a suite run of the release matrix, a pytest on a GKE host
or a `--local` host are started by `start_in_session` (a Popen); a case child gets its session
from its keeper (harness.isolation.server.forkserver), and the parent holds a forkclient.ForkedProcess.
Both are a `ProcessHandle`, and `terminate_group` ends either: it sends SIGTERM to the whole
process group, waits, then SIGKILLs the group, and it does so even when the leader is already
dead, because a descendant (a gloo rank, an inductor compile worker, a forked copy of a case
body) may still be running.

A session is not a container: a body can leave it (`setsid`, `start_new_session=True`, a double
fork). What catches those is a *child subreaper* (`become_subreaper`, Linux 3.4+): orphans of its
descendants are re-parented to it instead of to init, so `end_children` finds every one of them
among its own children and ends them, generation after generation. Elsewhere the harness says
that it cannot contain them (`SUBREAPER_UNAVAILABLE`).

`signal_name` and `describe_exit` turn return codes into words, guarded for numbers that name no
signal. The tail of a log is harness.isolation.system.logtail's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from harness.isolation.system import logtail

TERMINATE_GRACE_S = 5.0
# How long end_children keeps killing and reaping; SIGKILLed processes go in milliseconds unless a
# disk wait holds them.
END_CHILDREN_S = 5.0
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SUBREAPER_UNAVAILABLE = (
    "no child subreaper on this system ({why}): a helper a case body starts in a "
    "session of its own, or double-forks, is not ended with its child"
)


class ProcessHandle(Protocol):
    """A started process the harness watches and ends: a subprocess.Popen from start_in_session,
    or a case child from a fork server's keeper (harness.isolation.parent.forkclient.ForkedProcess).

    The process leads a process group of its own (its pid is the group's id): that is how
    terminate_group and kill_group_now end it with everything it started.
    """

    pid: int

    @property
    def stdin(self) -> IO[Any] | None:
        """A pipe to its standard input, where the parent holds one."""

    def poll(self) -> int | None:
        """Its return code (-N for signal N) once it has ended, else None; never blocks."""

    def wait(self, timeout: float | None = None) -> int:
        """Its return code, waiting at most `timeout` seconds; subprocess.TimeoutExpired after that."""


def start_in_session(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout: IO | int | None = None,
    stdin: IO | int | None = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
    cwd: str | Path | None = None,
    text: bool = False,
) -> subprocess.Popen:
    """Popen in a new session (its own process group, pgid == pid); stderr goes with stdout."""
    return subprocess.Popen(
        [str(c) for c in cmd],
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
        text=text,
    )


def terminate_group(proc: ProcessHandle, grace_s: float = TERMINATE_GRACE_S) -> int | None:
    """End `proc` and every process left in its group; return the leader's return code.

    SIGTERM first, so faulthandler in a case child can write its stacks, then SIGKILL for the
    group whatever the leader did: descendants that ignore SIGTERM or outlive the leader go too.
    """
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not refused; D state only
        return None


def kill_group_now(proc: ProcessHandle) -> None:
    """SIGKILL the group without waiting (interrupt paths, where nothing may block)."""
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is empty already (PermissionError: macOS says so for a zombie leader)


def signal_name(number: int) -> str:
    """SIGABRT for 6; 'signal 99' for a number that names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(returncode: int | None) -> str:
    """'SIGABRT' for -6 (Popen's convention), 'exit code 7' for 7, 'still running' for None."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        return signal_name(-returncode)
    if returncode > 128 and returncode - 128 in signal.valid_signals():
        # A shell or a wrapper reports death by signal N as 128+N.
        return f"exit code {returncode} ({signal_name(returncode - 128)})"
    return f"exit code {returncode}"


# Where harness.matrix.procs takes its logs' tails from.
tail_file = logtail.tail_file


def wait_for_exit(proc: ProcessHandle, timeout_s: float) -> int | None:
    """proc's return code, or None if it is still running after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.02)


def is_running(pid: int) -> bool:
    """Alive and not a zombie, from /proc (for a process that is not our child, whose exit we
    cannot wait for: an orphaned zombie may wait for a reaper that a container lacks)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


# ---------------------------------------------------------------- containment (subreaper)


def become_subreaper() -> str | None:
    """Make this process a child subreaper; None when it is one, else why it cannot be."""
    if not sys.platform.startswith("linux"):
        return f"prctl(PR_SET_CHILD_SUBREAPER) is Linux only, this is {sys.platform}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl is not reachable: {exc}"
    return None


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces): state, ppid, pgrp, ...

    os.open/os.read, not pathlib: `parents()` reads every process's stat, a few times per case
    (a quarter of pathlib's CPU: 0.6 ms for 64 processes)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)  # one line of numbers and a command name of at most 64 bytes
    except OSError:
        return None
    finally:
        os.close(fd)
    _, closing, rest = raw.rpartition(b")")
    return rest.decode("ascii", "replace").split() if closing else None


def stopped_outside_job_control(pid: int) -> bool:
    """pid is stopped (SIGSTOP, SIGTSTP) and not by its terminal's job control: it has no terminal,
    or its group is still the terminal's foreground group (a shell that stopped a job with Ctrl-Z
    takes the foreground back). A case body can stop the run's processes this way."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] != "T":
        return False
    _state, _ppid, pgrp, _session, tty_nr, tpgid = fields[:6]
    return tty_nr == "0" or pgrp == tpgid


def continue_if_stopped(pid: int) -> bool:
    """SIGCONT pid if a signal stopped it outside job control (a case body's SIGSTOP or SIGTSTP);
    True if it was. For a process of the run whose watchers may all be gone: an xdist worker
    that ends continues its controller, which no fork server of that worker watches any more."""
    if not stopped_outside_job_control(pid):
        return False
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return False
    return True


def parents() -> dict[int, int]:
    """pid -> parent pid of every process this one can see (empty without /proc)."""
    found: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return found
    for name in entries:
        fields = _stat_fields(name)
        if fields is not None and fields[0] != "Z":
            found[int(name)] = int(fields[1])
    return found


def children_of(pid: int) -> list[int]:
    """The live (not zombie) children of pid."""
    return [child for child, parent in parents().items() if parent == pid]


def end_children(timeout_s: float = END_CHILDREN_S, keep: Collection[int] = ()) -> None:
    """SIGKILL every child of this process but `keep`, reap it, and repeat: in a subreaper the
    orphans of each killed generation become children of ours. Bounded by timeout_s."""
    if not _has_children():  # the usual end of a keeper: its child reaped, nothing adopted
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doomed = [pid for pid in children_of(os.getpid()) if pid not in keep]
        if not doomed:
            break
        for pid in doomed:
            _kill_quietly(pid, signal.SIGKILL)
        for pid in doomed:
            _reap_by(pid, deadline)
    _reap_zombies(keep)


def _has_children() -> bool:
    """Any child, running or ended and not yet reaped (a syscall, where scanning /proc reads every
    process's stat). WNOWAIT: an ended child stays for its waiter."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_by(pid: int, deadline: float) -> None:
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] != 0 or time.monotonic() >= deadline:
                return
        except ChildProcessError:
            return
        time.sleep(0.005)


def _reap_zombies(keep: Collection[int]) -> None:
    """Collect the exits of adopted children that had ended on their own (zombies)."""
    try:
        entries = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return
    for pid in entries:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] == "Z" and int(fields[1]) == os.getpid() and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def pidfd_open(pid: int) -> int | None:
    """A descriptor that stays readable-on-exit for this very process (immune to pid reuse); None
    where the platform has none (not Linux) or the process is gone already."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def pidfd_signal(pidfd: int, sig: int) -> None:
    """Signal the process behind a pidfd (never another that reused its pid); quiet if it ended."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except (AttributeError, OSError):
        pass
