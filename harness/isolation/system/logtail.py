"""The end of a log, bounded in lines *and* bytes: what the harness shows of a log it did not write.

`tail_text` cuts text; `tail_file` reads only the end of a big file, from byte `since` on (a
case's part of a child log that several cases share), and can fold the text before it is cut
(harness.isolation.parent.evidence folds faulthandler's thread dumps). What was cut is said in a marker
line, so a reader knows the tail is not the whole log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from harness.isolation.system import files

TAIL_LINES = 40
TAIL_BYTES = 8_000
# How much of the end of a log file is read to find its tail: enough for TAIL_LINES normal lines.
TAIL_READ_BYTES = 256_000


def tail_text(text: str, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last `lines` lines of `text`, at most `max_bytes` long, cut at a line boundary.

    A single line longer than `max_bytes` keeps its end (where an error message usually is).
    """
    body = text.rstrip("\n")
    kept = body.splitlines()[-lines:] if body else []
    out: list[str] = []
    size = 0
    for line in reversed(kept):
        cost = len(line.encode("utf-8", "replace")) + 1
        if size + cost > max_bytes:
            if not out:  # one huge line: keep its end
                keep = line[-max(0, max_bytes - 100) :]
                out.append(f"[... {len(line) - len(keep)} characters of this line cut ...]{keep}")
            break
        out.append(line)
        size += cost
    out.reverse()
    cut = len(body.encode("utf-8", "replace")) - sum(len(line.encode("utf-8", "replace")) + 1 for line in out)
    if cut > 0 and out:
        out.insert(0, f"[... {max(cut, 0)} earlier bytes of the log cut ...]")
    return "\n".join(out)


def tail_file(
    path: Path,
    since: int = 0,
    lines: int = TAIL_LINES,
    max_bytes: int = TAIL_BYTES,
    fold: Callable[[str], str] | None = None,
) -> str:
    """tail_text of the part of a log file after byte `since`, `fold` applied first; reads only
    the last TAIL_READ_BYTES of a big file."""
    try:
        with os.fdopen(files.open_file(path, os.O_RDONLY), "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            start = max(since, end - TAIL_READ_BYTES)
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:  # missing, or a pipe or link a case put in its place (never waited on)
        return f"(no log at {path}: {exc.strerror or exc})"
    if start > since and "\n" in text:  # the window starts mid-line: drop that partial line
        text = "[... earlier part of the log cut ...]\n" + text.split("\n", 1)[1]
    return tail_text(fold(text) if fold else text, lines, max_bytes)
