"""Which user case children run as, and what the run header says about it.

A case body is the code under test: run as pytest's own user it can write everything the run
reads (its records, the baselines, the checkout, the venv) and signal the run's processes, and
each of those doors has to be shut one by one. Where the run has root (CI containers, the GKE
workers), `--spmd-case-user=USER` shuts them all at once: each child drops to USER before it
runs anything (harness.isolation.child.main.drop_to_case_user), and so does each fork server before it
imports torch_xla (harness.isolation.system.dropuser): the build under test never runs as root. The run's
own files stay root's.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path

import pytest

from harness.config import options
from harness.isolation.server import casens
from harness.isolation.wire.protocol import CASE_USER_ENV, XLA_DUMP_ROOT_ENV

MEMORY_ROOT_PREFIX = "spmd-xla-dumps-"  # harness.run.dumproot names its roots so


def configure(config: pytest.Config) -> None:
    """Resolve --spmd-case-user for this process's children (the environment carries it to them)."""
    name = options.value(config, "spmd_case_user")
    if not name:
        os.environ.pop(CASE_USER_ENV, None)
        return
    entry = checked_user(name, config.rootpath)
    os.environ[CASE_USER_ENV] = f"{entry.pw_uid}:{entry.pw_gid}"
    made_early = os.environ.get(XLA_DUMP_ROOT_ENV, "")
    if Path(made_early).name.startswith(MEMORY_ROOT_PREFIX):  # this run's, made before options were read
        give_dump_root(Path(made_early))


def configure_early(name: str | None, rootpath: Path) -> bool:
    """Before the early fork servers start (harness.run.earlystart): their environment names the
    case user, so they drop to it before they import torch_xla. False: the option is bad, and
    nothing may start before pytest_configure says so."""
    if not name:
        return True
    try:
        entry = checked_user(name, rootpath)
    except pytest.UsageError:
        return False
    os.environ[CASE_USER_ENV] = f"{entry.pw_uid}:{entry.pw_gid}"
    return True


def checked_user(name: str, rootpath: Path) -> pwd.struct_passwd:
    """The user --spmd-case-user names, if the run can become it and it can reach what it needs."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise pytest.UsageError(f"--spmd-case-user={name}: no such user on this machine") from None
    if os.geteuid() != 0:
        raise pytest.UsageError(
            f"--spmd-case-user={name}: only a run with root can run its cases as another user; drop the option"
        )
    if entry.pw_uid == 0:
        raise pytest.UsageError(f"--spmd-case-user={name} is root: name an unprivileged user (e.g. nobody)")
    for what, path in (
        ("this Python", Path(sys.base_prefix)),
        ("this venv", Path(sys.prefix)),
        ("the harness", Path(__file__).resolve().parents[1]),
        ("the rootdir", rootpath),
    ):
        closed = closed_to(path, entry.pw_uid, entry.pw_gid)
        if closed is not None:
            raise pytest.UsageError(
                f"--spmd-case-user={name}: {entry.pw_name} cannot reach {what} ({path}): {closed} is mode "
                f"{stat.S_IMODE(closed.stat().st_mode):o}. Put Python, the venv and the checkout where other "
                "users can read them (e.g. a venv made from the system's /usr/bin/python3, or a Python installed under /opt), "
                "or drop the option"
            )
    return entry


def closed_to(path: Path, uid: int, gid: int) -> Path | None:
    """The first folder from / down to path that the user (uid, gid) cannot enter and read, if any:
    a child that drops to that user would fail at its first import from there."""
    for folder in [*reversed(path.resolve().parents), path.resolve()]:
        try:
            info = folder.stat()
        except OSError:
            return folder
        if not stat.S_ISDIR(info.st_mode):
            continue
        shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
        needed = (stat.S_IROTH | stat.S_IXOTH) << shift
        if info.st_mode & needed != needed:
            return folder
    return None


def give_dump_root(root: Path) -> None:
    """The run's XLA dump folder is where children write: it belongs to the case user, if any."""
    user = os.environ.get(CASE_USER_ENV)
    if user:
        uid, gid = (int(part) for part in user.split(":"))
        os.chown(root, uid, gid)


def header_line() -> str:
    """How isolated the case bodies are, for the run header: what holds and what does not."""
    user = os.environ.get(CASE_USER_ENV)
    if user:
        uid, gid = (int(part) for part in user.split(":"))
        who = f"cases and the fork servers that import torch_xla run as user {pwd.getpwuid(uid).pw_name} (uid {uid})"
        refused = namespaces_refused(uid, gid)
        if refused is None:
            return (
                f"{who}: they cannot write the run's files nor signal its processes; each case's process runs in "
                "user, pid and mount namespaces of its own (harness.isolation.server.casens): it cannot signal, ptrace or "
                "see another case's processes, and its XLA dumps and HOME are on a private tmpfs, gone with it; not "
                "isolated from each other: what the case user may write elsewhere (/tmp)"
            )
        return (
            f"{who}: they cannot write the run's files nor signal its processes; each case's process has a HOME of "
            "its own (removed after it) and is not dumpable (no other case reads its memory); not isolated from "
            f"each other: the kernel refused namespaces to the case user ({refused}), so cases running at once (-n) "
            "share the uid and one can signal another's process or read its HOME, and the XLA dump folder"
        )
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    hint = " (--spmd-case-user=nobody isolates them)" if os.geteuid() == 0 else ""
    return (
        f"cases run as pytest's own user ({who}): unisolated, a case body can write what the run reads "
        f"and signal its processes{hint}"
    )


def namespaces_refused(uid: int, gid: int) -> str | None:
    """Why the case user cannot have namespaces of its own here (the kernel's word), None if it can:
    the keeper of each case child tries the same (harness.isolation.server.casens.enter)."""
    try:
        return casens.probe(uid, gid)
    except OSError as exc:
        return f"the probe did not run: {exc}"
