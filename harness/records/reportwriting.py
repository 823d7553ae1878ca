"""Where harness.report writes, opened so that nothing planted there is written through.

The run's summary.md lies in a folder the code under test can write; $GITHUB_STEP_SUMMARY and
$GITHUB_OUTPUT are files a case could find and replace (scripts/ci-spmd.sh puts them back, a
laptop user's own script may not). So:

- summary.md is replaced atomically, never opened: a link there is replaced, not followed; a
  folder (or a pipe, a device) there is refused and named, and the rest of the report still goes out;
- the step summary and the outputs are appended to only when they are regular files, opened
  without following a link (harness.isolation.system.files.open_file); anything else is refused and named.

`problems` says, before anything is written, what is in the way, so the report can be red about
it in the very outputs and annotations it writes first; a write that still fails (something
changed in between) is returned as a message by `write_*`, never raised.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.isolation.system import files
from harness.records import escaping, runfolder


def problems(summary: Path, appended: dict[str, Path | None]) -> list[str]:
    """What is in the way of each file the report writes: summary.md (replaced, so a link there is
    fine) and the files it appends to (named in appended: what they are for -> path)."""
    found = []
    kind = _kind(summary)
    if kind not in (None, stat.S_IFREG, stat.S_IFLNK):
        found.append(f"{summary} is {files.kind_name(kind)}, not a summary file (put there by a case?): refused")
    for what, path in appended.items():
        kind = _kind(path) if path is not None else None
        if kind not in (None, stat.S_IFREG):
            name = "a link" if kind == stat.S_IFLNK else files.kind_name(kind)
            found.append(f"{what} {path} is {name}, not a file: refused, nothing written through it")
    return found


def _kind(path: Path) -> int | None:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError:
        return 0  # unreadable: "of another kind"


def size_of(path: Path | None) -> int:
    """The bytes a regular file holds already (a step summary earlier reports wrote into)."""
    try:
        info = os.lstat(path) if path is not None else None
    except OSError:
        return 0
    return info.st_size if info is not None and stat.S_ISREG(info.st_mode) else 0


def append(path: Path, text: str) -> str | None:
    """Append text to a regular file (creating it); why not, or None."""
    try:
        fd = files.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(escaping.utf8(text))
    except OSError as exc:
        return f"could not write to {path} ({exc.strerror or exc}): refused"
    return None


def replace(path: Path, text: str) -> str | None:
    """Write summary.md in place of whatever is there (a link is replaced); why not, or None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        runfolder.replace_file(path, escaping.utf8(text))
    except OSError as exc:
        return f"could not write {path} ({exc.strerror or exc}): refused, the summary is not there"
    return None


def outputs(path: Path, values: dict[str, int]) -> str | None:
    """The counts as `name=value` lines, appended: earlier steps' outputs in the same file stay."""
    return append(path, "".join(escaping.output_line(name, value) for name, value in values.items()))
