"""What a dead child's log says about its death, cause first.

A child that dies of SIGABRT leaves the cause in one line (glog's `F... Check failed: ...`, an
XLA `RET_CHECK`, `Fatal Python error`), followed by faulthandler's stack dump of every thread,
which is long and nearly always about idle helper threads. Evidence of a crash therefore leads
with the signal and the first fatal line of the case's part of the log, then a bounded tail in
which faulthandler's thread dumps are folded to a line each (the current thread keeps its top
frames). Registry signatures are matched against all of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness.isolation.system import files
from harness.isolation.system.logtail import TAIL_BYTES, TAIL_LINES, tail_file

# (rank, pattern): the lowest rank found first in the log is the cause. A glog FATAL, a failed
# CHECK or RET_CHECK is the cause itself; "Fatal Python error" is what faulthandler prints for
# any fatal signal; glog ERROR lines are often noise, so they come last.
# glog writes "F1122 12:00:00.000000 1234 file.cc:12] ..."; TSL/XLA's logger writes
# "2026-11-22 15:40:33.234445: F external/xla/...] ..." (seen on torch_xla 2.5.1).
FATAL_PATTERNS: tuple[tuple[int, re.Pattern[str]], ...] = (
    (0, re.compile(r"^F\d{4} \d\d:\d\d:\d\d")),
    (0, re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: F ")),
    (0, re.compile(r"Check failed")),
    (0, re.compile(r"RET_CHECK")),
    (1, re.compile(r"^Fatal Python error")),
    (2, re.compile(r"^E\d{4} \d\d:\d\d:\d\d")),
    (2, re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: E ")),
)
# How far into a case's log the fatal-line scan reads (a case may print tens of MB of HLO).
SCAN_LIMIT_BYTES = 64 * 1024 * 1024
MAX_FATAL_LINE = 500
CURRENT_THREAD_FRAMES = 6

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FRAME = re.compile(r"^  (File \"|<no Python frame>|<truncated>)")


def first_fatal_line(lines: Iterable[str]) -> str | None:
    """The line that best names the cause: the first of the best rank in FATAL_PATTERNS."""
    best: tuple[int, str] | None = None
    for line in lines:
        for rank, pattern in FATAL_PATTERNS:
            if (best is None or rank < best[0]) and pattern.search(line):
                best = (rank, line.strip()[:MAX_FATAL_LINE])
                break
        if best is not None and best[0] == 0:
            break
    return best[1] if best else None


def _log_lines(path: Path, since: int) -> Iterator[str]:
    try:
        with os.fdopen(files.open_file(path, os.O_RDONLY), "rb") as fh:
            fh.seek(since)
            read = 0
            for raw in fh:
                read += len(raw)
                yield raw[:4096].decode("utf-8", "replace")
                if read > SCAN_LIMIT_BYTES:
                    return
    except OSError:
        return


def fold_thread_dumps(text: str) -> str:
    """Fold faulthandler's per-thread stacks; keep the current thread's innermost frames."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        header = _THREAD_HEADER.match(lines[i])
        if header is None:
            if lines[i].startswith("Extension modules:"):
                out.append("[faulthandler: list of extension modules folded]")
            else:
                out.append(lines[i])
            i += 1
            continue
        frames = []
        i += 1
        while i < len(lines) and _FRAME.match(lines[i]):
            frames.append(lines[i])
            i += 1
        if header.group(1) == "Current thread":
            out.append(lines[i - len(frames) - 1])
            out.extend(frames[:CURRENT_THREAD_FRAMES])
            if len(frames) > CURRENT_THREAD_FRAMES:
                out.append(f"  [... {len(frames) - CURRENT_THREAD_FRAMES} outer frames folded]")
        else:
            out.append(f"[faulthandler: stack of thread {header.group(2)} ({len(frames)} frames) folded]")
    return "\n".join(out)


def log_tail(path: Path, since: int = 0, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The end of the case's part of the log, thread dumps folded, bounded in lines and bytes."""
    return tail_file(path, since, lines, max_bytes, fold=fold_thread_dumps)


def crash_evidence(how: str, path: Path, since: int = 0) -> tuple[str, str]:
    """(evidence, log tail) for a child that died: `SIGABRT: <first fatal line>` then the tail."""
    fatal = first_fatal_line(_log_lines(path, since))
    tail = log_tail(path, since)
    headline = f"{how}: {fatal}" if fatal else how
    return f"{headline}\n--- log tail ---\n{tail}", tail


# A library's debug log writes one block as many lines behind one prefix (torch_xla 2.9's
# "Unexpected Execution Analysis: ..." block: 17 lines, 10 of them the Python frames the child's
# traceback shows above it). Shown in a failure, such a run keeps its first lines.
_PREFIX = re.compile(r"^([^:\n]{12,80}:)")
PREFIX_RUN_KEEP = 6
PREFIX_RUN_MIN = 10


def fold_prefix_runs(text: str, keep: int = PREFIX_RUN_KEEP, longer_than: int = PREFIX_RUN_MIN) -> str:
    """text with each run of more than `longer_than` consecutive lines that share a prefix (up to
    their first colon, 12-80 characters) cut to its first `keep` lines and a line that says how
    many more there were. For display only: registry signatures match the whole tail."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _PREFIX.match(lines[i])
        j = i + 1
        while match and j < len(lines) and lines[j].startswith(match.group(1)):
            j += 1
        if match and j - i > longer_than:
            out += lines[i : i + keep]
            out.append(
                f"{match.group(1)} ... {j - i - keep} more line(s) like these (the run folder's logs/ has them all)"
            )
        else:
            out += lines[i:j]
        i = j
    return "\n".join(out)


def terminal_safe(text: str) -> str:
    """text with every control character but newline and tab escaped (\\x1b): a failure's long
    text is the code under test's, and pytest prints it as it is, where an escape sequence could
    clear the screen, retitle the terminal or colour the log."""
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii") for c in text)


def headline(evidence: str, limit: int = 300) -> str:
    """The first line of a piece of evidence, bounded: what a one-line reason shows."""
    first = evidence.strip().splitlines()[0] if evidence.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."
