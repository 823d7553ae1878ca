"""Opening a file a case body can reach: never through a link, never blocking on what is not a file.

A case body runs as the same user as pytest, so it can put a named pipe, a device node or a
symlink where the harness expects its own file (run.json, a child log, the verdicts file, an HLO
text, a dump root's owner stamp). Opening a pipe blocks until someone opens its other end, so a
plain `open()` would hang the run. Every such open goes through `open_file`: O_NOFOLLOW (a link is
an error, never followed) and O_NONBLOCK (a pipe opens at once, or fails), then fstat on the
descriptor itself, so what was opened is what is checked: anything but a regular file is refused
with NotARegularFile (an OSError, so callers that handle a missing or unreadable file handle it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from harness.errors import HarnessError


class NotARegularFile(HarnessError, OSError):
    """What is at the path is a pipe, a device, a socket or a folder (placed there by a case?)."""


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags) for a regular file only: a link, pipe, device or folder is NotARegularFile.
    The descriptor returned blocks as usual (O_NONBLOCK served only the open)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a link, said in words
            raise NotARegularFile(
                errno.ELOOP, "not a regular file (a link, not followed; put there by a case?)", str(path)
            ) from None
        raise
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            raise NotARegularFile(
                errno.EINVAL,
                f"not a regular file ({_KINDS.get(kind, 'of another kind')}; put there by a case?)",
                str(path),
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


# What the harness reads back (a run's records, manifest and comparison, a baseline) is a few MiB
# at most. A file beyond this was made to exhaust the reader's memory (or is no harness file): it
# is refused, not read, so a results folder cannot take down the job that reports it.
READ_LIMIT = 256 * 2**20


class FileTooLarge(HarnessError, OSError):
    """A file the harness reads back is larger than any it writes (READ_LIMIT)."""


def check_size(fd: int, path: str | os.PathLike[str], limit: int = READ_LIMIT) -> None:
    """FileTooLarge unless the open file fd holds at most limit bytes."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise FileTooLarge(
            errno.EFBIG,
            f"{size / 2**20:.0f} MiB, more than any file the harness writes ({limit // 2**20} MiB); not read",
            str(path),
        )


def kind_name(mode: int) -> str:
    """What an entry that is not a regular file is, for a message ("a named pipe")."""
    return _KINDS.get(stat.S_IFMT(mode), "of another kind")


def _open_within_limit(path: str | os.PathLike[str]) -> int:
    """A descriptor of the file for reading: a regular file, not a link, not beyond READ_LIMIT."""
    fd = open_file(path, os.O_RDONLY)
    try:
        check_size(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path: str | os.PathLike[str]) -> str:
    """The file's text (UTF-8), read only if it is a regular file, not a link, and not beyond READ_LIMIT."""
    with os.fdopen(_open_within_limit(path), encoding="utf-8") as fh:
        return fh.read()


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes, on the terms of read_text: a regular file, not a link, within READ_LIMIT."""
    with os.fdopen(_open_within_limit(path), "rb") as fh:
        return fh.read()


def create_new(path: str | os.PathLike[str], text: str) -> None:
    """Create path with text; FileExistsError if any entry (a link, a pipe) has that name. What
    UTF-8 cannot hold (a lone surrogate from the code under test's text) is written escaped."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    with os.fdopen(open_file(path, flags), "w", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(text)


def append_line(path: Path, line: str, durable: bool = False) -> None:
    """Append one line to a log of records (a run's verdicts, its journal), creating it. A link,
    pipe or device a case put in the file's place is removed, never written through nor waited
    on: what it hid is missing, not forged. durable: fsync, so a crash after this keeps the line."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd = open_file(path, flags)
    except OSError as exc:
        if not (isinstance(exc, NotARegularFile) or exc.errno in (errno.ELOOP, errno.ENXIO)):
            raise
        os.unlink(path)
        fd = open_file(path, flags | os.O_EXCL)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        if durable:
            os.fsync(fh.fileno())


def replace_file(path: Path, text: str) -> None:
    """Write text to path atomically: a reader sees the old or the new file, never half of one.
    The temporary file is made exclusively, so nothing planted under its name is written through;
    the rename replaces whatever entry is at path (a link, a pipe) rather than opening it."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.unlink()
    except FileNotFoundError:
        pass
    create_new(temp, text)
    os.replace(temp, path)


def clear_for_writer(path: str | os.PathLike[str]) -> None:
    """Remove what a case put where another program will open a file for writing (a pipe it
    would block on, a link it would write through); a regular file, or nothing, is left as is."""
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except FileNotFoundError:
        return
    if kind not in (stat.S_IFREG, stat.S_IFDIR):
        os.unlink(path)


def own_folder(path: Path, depth: int = 1) -> None:
    """Make path (and the depth - 1 folders above it) a real folder: a link, file or pipe a case
    put in place of one is removed first, so what the run writes there cannot land through a
    link elsewhere (`hlo/` linked to a folder outside the results). The folder above those is
    the caller's to trust (the run folder, checked by harness.records.runfolder)."""
    chain = [path, *path.parents][:depth]
    for folder in reversed(chain):
        try:
            kind = stat.S_IFMT(os.lstat(folder).st_mode)
        except FileNotFoundError:
            kind = None
        if kind == stat.S_IFDIR:
            continue
        if kind is not None:
            os.unlink(folder)
        try:
            os.mkdir(folder)
        except FileExistsError:  # another process of the run made it a moment ago
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise
