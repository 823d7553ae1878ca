"""Becoming the run's case user (--spmd-case-user), in the processes that run the build under test.

The fork servers that import torch_xla (the build's import-time code runs there) and every case
child drop to the case user before anything of the build runs: the server as its first act, an
exec'd child before its preload hooks. A keeper gives each child a HOME of its own, in the run's
XLA dump root (the case user's, removed with the run), and removes it when the child has ended.
A child is also made not dumpable: another case's process of the same uid can then neither read
its memory or environment in /proc nor ptrace it. Signals (same uid) are shut by namespaces of
each child's own (harness.isolation.server.casens) where the kernel allows them; the run header says
which holds (harness.run.caseuser.header_line).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile

from harness.isolation.wire.protocol import CASE_USER_ENV, XLA_DUMP_ROOT_ENV

HOME_PREFIX = "spmd-case-home-"
PR_SET_DUMPABLE = 4  # linux/prctl.h


def case_user(env: dict[str, str] | os._Environ[str] | None = None) -> tuple[int, int] | None:
    """(uid, gid) of the run's case user, None when the run names none."""
    text = (os.environ if env is None else env).get(CASE_USER_ENV, "")
    if not text:
        return None
    uid, gid = (int(part) for part in text.split(":"))
    return uid, gid


def become(uid: int, gid: int) -> None:
    """Drop to (uid, gid) for good; nothing if this process is that user already."""
    if os.geteuid() == uid and os.getuid() == uid:
        return
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def not_dumpable() -> None:
    """Other processes of this uid can neither ptrace this one nor read its /proc memory and environ."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def make_home(uid: int, gid: int) -> str:
    """A private HOME in the run's dump root (removed with the run if its remover misses it)."""
    root = os.environ.get(XLA_DUMP_ROOT_ENV) or None
    if root is not None and not os.path.isdir(root):
        root = None
    home = tempfile.mkdtemp(prefix=HOME_PREFIX, dir=root)
    if os.geteuid() == 0:
        os.chown(home, uid, gid)
    return home


def remove_home(home: str) -> None:
    shutil.rmtree(home, ignore_errors=True)
