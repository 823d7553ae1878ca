"""Run one long command (pip, pytest) with its output in a log file, a progress heartbeat and a timeout.

Output goes to the log rather than the terminal: pip and pytest print thousands of lines, and a
release manager wants one line of progress every so often plus the log path when it fails.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from harness.isolation.system import processes
from harness.matrix.errors import CommandTimedOut

# How long a stopped pip or pytest gets between SIGTERM and SIGKILL (pytest ends its own children).
TERMINATE_GRACE_S = 10.0


class Progress:
    """Where progress lines go: one line each, prefixed with the time since the command started."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[matrix {int(elapsed) // 60:2d}:{int(elapsed) % 60:02d}] {message}", file=self.stream, flush=True)


def run_logged(
    cmd: Sequence[str],
    log: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    heartbeat: Callable[[float], str | None] | None = None,
    every_s: float = 20.0,
    say: Callable[[str], None] = lambda _m: None,
) -> int:
    """Runs cmd with stdout+stderr appended to log; returns its exit code.

    Every `every_s` seconds `heartbeat(elapsed)` may return a line of progress to show.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(map(str, cmd))}\n")
        fh.flush()
        # A session of its own, so a timeout or Ctrl-C ends pip's or pytest's children as well.
        proc = processes.start_in_session(cmd, cwd=cwd, env=env, stdout=fh)
        try:
            while True:
                try:
                    code = proc.wait(timeout=every_s)
                    processes.kill_group_now(proc)  # whatever it left behind (its group outlives it)
                    return code
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if timeout_s is not None and elapsed > timeout_s:
                        processes.terminate_group(proc, TERMINATE_GRACE_S)
                        raise CommandTimedOut(f"{cmd[0]} ran past {timeout_s:.0f}s") from None
                    line = heartbeat(elapsed) if heartbeat else None
                    if line:
                        say(line)
        except BaseException:
            processes.terminate_group(proc, TERMINATE_GRACE_S)  # interrupted (Ctrl-C): leave nothing running
            raise


def last_line_matching(log: Path, prefixes: tuple[str, ...]) -> str | None:
    """The last line of the log starting with one of prefixes (for a heartbeat), or None."""
    try:
        with log.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64_000))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.lstrip().startswith(prefixes):
            return line.strip()[:120]
    return None


def tail(log: Path, lines: int = 15) -> str:
    return processes.tail_file(log, lines=lines)
