"""harness.isolation.system.processes: reading /proc and ending a process's children."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import traceback

import pytest

from harness.isolation.system import processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


def test_parents_reads_a_command_name_with_spaces_and_parentheses(tmp_path):
    # The command name is the one field /proc/PID/stat does not delimit: ") S 1 (" must not shift
    # the state and parent fields that come after it.
    sleep = shutil.which("sleep")
    if sleep is None:
        pytest.skip("no sleep program")
    program = tmp_path / ") S 1 ("
    shutil.copy(sleep, program)
    child = subprocess.Popen([str(program), "30"])
    try:
        _wait_for(lambda: processes.parents().get(child.pid) == os.getpid())
        assert processes.is_running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not processes.is_running(child.pid)


def test_has_children_sees_a_running_and_an_unreaped_child_and_leaves_it_waitable():
    def check() -> None:
        assert not processes._has_children(), "a new process has no children"
        pid = os.fork()
        if pid == 0:
            time.sleep(0.2)
            os._exit(7)
        assert processes._has_children(), "a running child"
        _wait_for(lambda: not processes.is_running(pid))
        assert processes._has_children(), "an ended child nobody has reaped yet"
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7, "WNOWAIT left its status for its waiter"
        assert not processes._has_children(), "the child reaped"

    _in_a_new_process(check)


def test_end_children_kills_and_reaps_every_child_and_returns_at_once_without_any():
    def check() -> None:
        for _ in range(2):
            if os.fork() == 0:
                signal.pause()
                os._exit(0)
        processes.end_children(timeout_s=5)
        assert not processes._has_children(), "a child outlived end_children"
        started = time.monotonic()
        processes.end_children(timeout_s=5)
        assert time.monotonic() - started < 1.0

    _in_a_new_process(check)


def _in_a_new_process(check) -> None:
    """Run check in a fork of this process: the pytest process may have children of its own."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            check()
        except BaseException:  # noqa: BLE001 - reported through the exit code and stderr
            traceback.print_exc()
            code = 1
        os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the check failed in the forked process (stderr)"


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
