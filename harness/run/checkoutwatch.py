"""The harness's own code must be the same at the end of a run as at its start.

A case body that runs as pytest's own user can rewrite the checkout: the pytest process has
imported the harness already, but a child exec'd fresh (the fake backend's children, `fresh=True`,
a fork server started again after a body killed it) imports it from disk, so a rewritten
harness/isolation/child.py answers "passed" for every later case. The controlling pytest process
takes a fingerprint of the harness package (every file's kind and content, `__pycache__` aside:
children write it) when it starts and compares it when the run ends; a change fails the run,
naming the files, as a changed manifest does (harness.records.runfolder). Only `--spmd-case-user`
keeps a case from writing the checkout at all.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from harness.isolation import files

PACKAGE = Path(__file__).resolve().parents[1]
FINGERPRINT_KEY = pytest.StashKey[dict[str, str]]()


def fingerprint(root: Path = PACKAGE) -> dict[str, str]:
    """Each entry under root (a relative path) -> what it is: a regular file's SHA-256, or its kind."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*dirs, *names]:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = _describe(path)
    return found


def _describe(path: Path) -> str:
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
        if kind == stat.S_IFDIR:
            return "folder"
        if kind != stat.S_IFREG:
            return f"not a regular file ({kind:o})"
        with os.fdopen(files.open_file(path, os.O_RDONLY), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def take(config: pytest.Config) -> None:
    """At the start of the run (the controlling process only)."""
    config.stash[FINGERPRINT_KEY] = fingerprint()


def problems(config: pytest.Config) -> list[str]:
    """At the end of the run: what changed in the harness's code since take(), as one problem."""
    before = config.stash.get(FINGERPRINT_KEY, None)
    if before is None:
        return []
    now = fingerprint()
    changed = sorted(name for name in before.keys() | now.keys() if before.get(name) != now.get(name))
    if not changed:
        return []
    shown = ", ".join(f"harness/{name}" for name in changed[:5]) + (
        f" and {len(changed) - 5} more" if len(changed) > 5 else ""
    )
    return [
        f"the harness's code changed while the run's cases ran (by a case?): {shown}; verdicts of cases "
        "that ran after it cannot be trusted, and the run fails"
    ]
