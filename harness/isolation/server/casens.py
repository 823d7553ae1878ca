"""Each case child in namespaces of its own (--spmd-case-user), so one case cannot stop or read another.

All case children of a run share the case user's uid, and a process may signal any process of its
uid; a server dropped to the case user cannot give each child a uid of its own. So the keeper of a
case child (harness.isolation.server.forkserver.keep_child, single-threaded right after its fork) enters a
new user namespace (needs no privilege) and a new pid namespace, and forks an init there (pid 1):
the init takes a mount namespace of its own, mounts a /proc that shows only the namespace's
processes and a private tmpfs on the run's dump root (the child's XLA dumps, memray captures and
HOME, which the child writes and reads itself: no other case sees them), and forks the case child (pid 2). The child
drops every capability it had in its namespace. It then cannot name a process outside its
namespace (kill, pidfd_open and ptrace take pids of its namespace; a pidfd from the host's /proc is
refused across namespaces), nor see another case's HOME (a tmpfs in another mount namespace). When
the init ends, the kernel ends every process of the namespace: no helper outlives its case.

The init reports the child's exit status to the keeper through a pipe (the keeper is not the
child's parent), so "killed by SIGSEGV" stays exact; the child's pid as the keeper's namespace
knows it (which the client signals on a timeout) arrives with SCM_CREDENTIALS, which the kernel
translates. Where the kernel refuses (no user namespaces), the keeper runs the child as before and
the run header says that cases share the uid (probe()).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import NoReturn

from harness.isolation.wire.protocol import XLA_DUMP_ROOT_ENV

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
INIT_FAILED = 71  # the init could not set the namespace up; the child never ran

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter() -> None:
    """In the keeper: a user namespace mapping only this uid and gid, and a pid namespace for the
    children it forks next. OSError where the kernel refuses them (nothing changed); RuntimeError
    where it took them but the maps cannot be written (the keeper cannot go on as before then)."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare(CLONE_NEWUSER|CLONE_NEWPID)")
    # A process that dropped from root is not dumpable, and then its /proc/self files are root's:
    # dumpable just long enough to write its maps (the case child makes itself not dumpable again).
    if _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise RuntimeError("the case namespace cannot be set up: prctl(PR_SET_DUMPABLE) failed")
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    except OSError as exc:
        raise RuntimeError(f"the case namespace's {exc.filename} cannot be written: {exc.strerror}") from None
    finally:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def start(home: str | None, body: Callable[[], NoReturn]) -> tuple[int, int, int]:
    """In the keeper, after enter(): fork the init, which runs `body` as pid 2. Returns (init pid,
    the body's pid in the keeper's namespace, the read end of the pipe the init writes its status to)."""
    status_read, status_write = os.pipe()
    theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # EOF when the init dies first
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    init = os.fork()
    if init == 0:
        os.close(status_read)
        mine.close()
        _run_init(home, body, status_write, theirs)
    os.close(status_write)
    theirs.close()
    try:
        _, ancillary, _, _ = mine.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("3i")))
        pid = next(
            struct.unpack("3i", data[: struct.calcsize("3i")])[0]
            for level, kind, data in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
        )
    except (OSError, StopIteration):
        pid = init  # the init failed before the body ran; the client watches the init
    finally:
        mine.close()
    return init, pid, status_read


def child_status(init_status: int, status_read: int) -> int:
    """The case child's wait status: as the init reported it, else the init's own (it died first)."""
    try:
        data = os.read(status_read, 4)
    finally:
        os.close(status_read)
    return struct.unpack("i", data)[0] if len(data) == 4 else init_status


def _run_init(home: str | None, body: Callable[[], NoReturn], status_write: int, tell: socket.socket) -> NoReturn:
    code = INIT_FAILED
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        _private_scratch(home)
        child = os.fork()
        if child == 0:
            os.close(status_write)
            tell.send(b"p")  # the kernel attaches our pid, as the keeper's namespace numbers it
            tell.close()
            _drop_capabilities()
            body()
        tell.close()
        while True:  # pid 1 reaps every orphan of the namespace; the child's status goes to the keeper
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                os.write(status_write, struct.pack("i", status))
                code = 0
                break
    except BaseException as exc:  # the keeper reports our exit; say why on its stderr
        print(f"case namespace: {exc}", file=sys.stderr)
    os._exit(code)


def _private_scratch(home: str | None) -> None:
    """A tmpfs of this case's own on the run's dump root, where the child's dumps, captures and HOME
    go (harness.xla.scratch_folder, dropuser.make_home), or on its HOME alone where there is none."""
    root = os.environ.get(XLA_DUMP_ROOT_ENV)
    if root and os.path.isdir(root):
        _check(_libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700"), "mount dump root")
        if home is not None and os.path.commonpath([root, home]) == root:
            os.makedirs(home, mode=0o700, exist_ok=True)  # hidden by the mount: made again in it
            return
    if home is not None:
        _check(_libc.mount(b"tmpfs", home.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0700"), "mount HOME")


def _drop_capabilities() -> None:
    """The child had every capability in its own namespace (its init made it); it keeps none."""
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def probe(uid: int, gid: int) -> str | None:
    """Why the kernel refuses enter() to (uid, gid) here, None if it allows it: a forked process
    becomes the user (root only) and tries. No exec: the user need not reach Python to be probed."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if os.geteuid() != uid:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare")
        except OSError as exc:
            code = min(exc.errno or 1, 255)
        os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return None if code == 0 else f"unshare(CLONE_NEWUSER|CLONE_NEWPID): {os.strerror(code) if code > 0 else code}"
