"""Which user case children run as, and what the run header says about it.

A case body is the code under test: run as pytest's own user it can write everything the run
reads (its records, the baselines, the checkout, the venv) and signal the run's processes, and
each of those doors has to be shut one by one. Where the run has root (CI containers, the GKE
workers), `--spmd-case-user=USER` shuts them all at once: each child drops to USER before it
runs anything (harness.isolation.child.drop_to_case_user). The run's own files stay root's.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from harness.config import options
from harness.isolation.protocol import CASE_USER_ENV, XLA_DUMP_ROOT_ENV

MEMORY_ROOT_PREFIX = "spmd-xla-dumps-"  # harness.run.dumproot names its roots so


def configure(config: pytest.Config) -> None:
    """Resolve --spmd-case-user for this process's children (the environment carries it to them)."""
    name = options.value(config, "spmd_case_user")
    if not name:
        os.environ.pop(CASE_USER_ENV, None)
        return
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
    os.environ[CASE_USER_ENV] = f"{entry.pw_uid}:{entry.pw_gid}"
    made_early = os.environ.get(XLA_DUMP_ROOT_ENV, "")
    if Path(made_early).name.startswith(MEMORY_ROOT_PREFIX):  # this run's, made before options were read
        give_dump_root(Path(made_early))


def give_dump_root(root: Path) -> None:
    """The run's XLA dump folder is where children write: it belongs to the case user, if any."""
    user = os.environ.get(CASE_USER_ENV)
    if user:
        uid, gid = (int(part) for part in user.split(":"))
        os.chown(root, uid, gid)


def header_line() -> str:
    """How isolated the case bodies are, for the run header."""
    user = os.environ.get(CASE_USER_ENV)
    if user:
        uid = int(user.split(":")[0])
        return (
            f"cases run as user {pwd.getpwuid(uid).pw_name} (uid {uid}): isolated, they cannot write the "
            "run's files nor signal its processes"
        )
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    hint = " (--spmd-case-user=nobody isolates them)" if os.geteuid() == 0 else ""
    return (
        f"cases run as pytest's own user ({who}): unisolated, a case body can write what the run reads "
        f"and signal its processes{hint}"
    )
