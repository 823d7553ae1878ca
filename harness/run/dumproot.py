"""The run's XLA dump folder: where children put their dumps, who makes it, who removes it.

A step graph's compile writes about 200 files (the modules the step meter reads, and the LLVM IR
and objects XLA's CPU backend writes beside them), which the meter deletes after the step. On
ext4, creating files where as many were just deleted cost 3 s of system time in a `-n 2` run
(finding a free inode skips recently deleted ones); on tmpfs it costs nothing. So a run's dumps go
to a folder of its own in /dev/shm where that is a tmpfs, made by the run's controller and removed
at its end (the run folder's xla-dumps/ otherwise). Each step leaves at most its own dumps there.
A run killed with SIGKILL cannot remove its folder: the next run on the machine removes the
folders whose owner (the pid and start time written in them) is gone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
from pathlib import Path

from harness.isolation.system import files
from harness.isolation.wire.protocol import XLA_DUMP_ROOT_ENV
from harness.records import runfolder
from harness.run import caseuser

MEMORY_FOLDER = Path("/dev/shm")
OWNER_FILE = ".owner"  # in each memory root: "<pid> <start time>" of the process that made it


def share_dump_root(run_path: Path, in_memory: bool = True) -> None:
    """Children (and servers started from now on) put their XLA dumps under one folder of the run:
    in memory where the machine has a tmpfs at /dev/shm (made by the run's controller, which
    removes it at the end), else the run folder's xla-dumps/. A root the environment names
    already (the user's, or this run's from an earlier call) is kept."""
    if not (in_memory and share_memory_dump_root(run_path)) and not os.environ.get(XLA_DUMP_ROOT_ENV):
        root = run_path / runfolder.XLA_DUMPS_DIR
        root.mkdir(exist_ok=True)
        caseuser.give_dump_root(root)
        os.environ[XLA_DUMP_ROOT_ENV] = str(root)


def share_memory_dump_root(run_path: Path) -> bool:
    """The run's root in memory, made now and named in the environment, unless one is named
    already; False where there is none to make (no tmpfs, or a folder of its name exists). Only
    the controller calls it: xdist workers inherit its root, or, in a run that selects SPMD cases
    only at collection (the workers claim the run folder), dump to the run folder on disk."""
    if os.environ.get(XLA_DUMP_ROOT_ENV):
        return True
    root = _memory_dump_root(run_path)
    if root == run_path / runfolder.XLA_DUMPS_DIR:
        return False
    _remove_stale_roots()
    try:
        root.mkdir(mode=0o700)  # never one that exists: a folder of that name is not this run's
        caseuser.give_dump_root(root)
        files.create_new(root / OWNER_FILE, _owner_stamp(os.getpid()) or "")
    except OSError:
        return False
    # A run that ends before pytest_configure (a conftest that fails to import, after the
    # early start made this root) never reaches remove_dump_root: its exit removes it then.
    atexit.register(_remove_left_root, root, os.getpid())
    os.environ[XLA_DUMP_ROOT_ENV] = str(root)
    return True


def _remove_left_root(root: Path, pid: int) -> None:
    """At this process's exit, the memory root it made, unless remove_dump_root took it (and the
    variable) already: a later run of the same name may own a folder of that name by now."""
    if os.getpid() == pid and os.environ.get(XLA_DUMP_ROOT_ENV) == str(root):
        _remove_root(root)


def _remove_root(root: Path) -> None:
    """The folder, or the symlink a body put in its place (only the link: never what it points to)."""
    if root.is_symlink():
        root.unlink(missing_ok=True)
    else:
        shutil.rmtree(root, ignore_errors=True)


def remove_dump_root(run_path: Path) -> None:
    """At the run's end: the dump folder share_dump_root made (a failing case kept its own dumps in
    its record's folder already), and the variable naming it, so a later run in this process
    (pytester) makes its own. A root the environment named before the run is left alone."""
    shutil.rmtree(run_path / runfolder.XLA_DUMPS_DIR, ignore_errors=True)
    memory_root = _memory_dump_root(run_path)
    if os.environ.get(XLA_DUMP_ROOT_ENV) == str(memory_root):
        _remove_root(memory_root)
    if os.environ.get(XLA_DUMP_ROOT_ENV) in (str(memory_root), str(run_path / runfolder.XLA_DUMPS_DIR)):
        del os.environ[XLA_DUMP_ROOT_ENV]


def _memory_dump_root(run_path: Path) -> Path:
    """The run's dump folder in memory: named after the run folder (its name holds a timestamp and
    the controller's pid) and the user, so no two runs share one."""
    if not _is_tmpfs(MEMORY_FOLDER) or not os.access(MEMORY_FOLDER, os.W_OK):
        return run_path / runfolder.XLA_DUMPS_DIR
    return MEMORY_FOLDER / f"{caseuser.MEMORY_ROOT_PREFIX}{os.getuid()}-{run_path.name}"


def _is_tmpfs(folder: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return False
    return any(line.split()[1:3] == [str(folder), "tmpfs"] for line in mounts.splitlines() if len(line.split()) > 2)


def _owner_stamp(pid: int) -> str | None:
    """ "<pid> <start time in clock ticks since boot>" of a live process, None for a gone one: the
    start time tells a reused pid from the process that made a folder."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return f"{pid} {fields[19]}" if len(fields) > 19 else None


def _remove_stale_roots() -> None:
    """The memory roots of this user's runs that ended without removing theirs (SIGKILL, the
    OOM killer): a folder of this user, not a link, whose owner stamp names a process that is
    gone. A folder without a stamp, or of another user, or whose owner lives, is left alone."""
    for path in MEMORY_FOLDER.glob(f"{caseuser.MEMORY_ROOT_PREFIX}{os.getuid()}-*"):
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            stamp = files.read_text(path / OWNER_FILE).split()  # a pipe planted there is refused, not waited on
            pid = int(stamp[0])
        except (OSError, ValueError, IndexError):
            continue
        if _owner_stamp(pid) != " ".join(stamp):
            shutil.rmtree(path, ignore_errors=True)
