"""What the run reads later must be what it read at its start: the harness, conftests, case files.

A case body that runs as pytest's own user can rewrite the checkout: the pytest process has
imported the harness already, but a child exec'd fresh (the fake backend's children, a body with
preload=False, a fork server started again after a body killed it) imports it from disk, so a
rewritten harness/isolation/child/main.py answers "passed" for every later case. So can a `.pyc` planted
in harness/**/__pycache__ with its source's stamp: Python takes it without reading the source; and
one planted beside a helper module the cases import (cases/models.py's kind), in every later child.

The controlling pytest process takes a fingerprint when it starts: every file of the harness
package (kind and content), every conftest.py and Python file of the folders the run was given
(`__pycache__`, hidden folders and environments aside); after each case and at the end it compares,
and checks that every bytecode file of the harness and of those folders holds what its source
compiles to (children write `.pyc` files legitimately, so their content, not their presence, is
what counts; one found sound is not read again until it or its source changes). A change fails the run,
naming the files, as a changed manifest does (harness.records.runfolder). Case modules are also
held before use: each child imports its case's module from the bytes the run hashed at collection
(harness.isolation.parent.case.hold_sources), or refuses. Only `--spmd-case-user` keeps a case from
writing the checkout at all.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import sys
from pathlib import Path

import pytest

from harness.isolation.system import files

PACKAGE = Path(__file__).resolve().parents[1]
FINGERPRINT_KEY = pytest.StashKey[dict[str, str]]()
SEEN_CHANGED_KEY = pytest.StashKey[set[str]]()  # changes seen after a case, though put back since
VERIFIED_KEY = pytest.StashKey[dict[str, tuple[str, str]]]()  # bytecode found sound after a case
SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages", "results"})
MAX_WATCHED = 5000  # files of the run's folders fingerprinted; a checkout has a few hundred


def fingerprint(root: Path = PACKAGE, python_only: bool = False) -> dict[str, str]:
    """Each entry under root (its path) -> what it is: a regular file's SHA-256, or its kind.
    python_only: only `.py` files (a folder of cases holds the run's own results too)."""
    found: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_FOLDERS and not d.startswith(".") and d != "venv"]
        for name in names if python_only else [*dirs, *names]:
            if python_only and not name.endswith(".py"):
                continue
            path = Path(folder, name)
            found[str(path)] = _describe(path)
            if len(found) >= MAX_WATCHED:
                return found
    return found


def _run_folders(config: pytest.Config) -> list[Path]:
    """The folders the run was given (each path's folder), that exist."""
    folders = []
    for arg in config.args or [str(config.rootpath)]:
        path = Path(config.rootpath, arg.split("::")[0]).resolve()
        folder = path if path.is_dir() else path.parent
        if folder.is_dir() and folder not in folders:
            folders.append(folder)
    return folders


def _run_fingerprint(config: pytest.Config) -> dict[str, str]:
    """The harness package and the run's own Python files: conftest.py up from each path, and the
    Python files under each path the run was given (its cases, their helpers, their conftests)."""
    found = fingerprint(PACKAGE)
    for folder in _run_folders(config):
        for parent in [folder, *folder.parents]:
            conftest = parent / "conftest.py"
            if conftest.exists():
                found[str(conftest)] = _describe(conftest)
            if parent == config.rootpath:
                break
        found.update(fingerprint(folder, python_only=True))
    return found


# What follows the cache tag in the names the import system loads: `m.cpython-311.pyc`, `.opt-1`, `.opt-2`.
PLAIN_IMPORT_SUFFIXES = frozenset({".pyc", ".opt-1.pyc", ".opt-2.pyc"})


def bytecode_problems(roots: list[Path] | None = None, verified: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """The `.pyc` files under roots (the harness; the run's case folders too, whose helper modules
    later children import from disk) that this Python would load instead of compiling their source
    (a timestamp pyc stamped with its source's mtime and size, or a hash-based one) and that do not
    hold what their source compiles to. A stale pyc (its stamp is not its source's) or one without
    a source is never loaded from `__pycache__`: not a problem. `verified`: pyc -> (its identity, its
    source's stamp) found sound before, not read again (the check runs after every case)."""
    tag = sys.implementation.cache_tag
    bad = []
    for pyc in sorted({pyc for root in roots or [PACKAGE] for pyc in _bytecode_files(root, tag)}):
        stem, _, rest = pyc.name.partition(f".{tag}")
        if rest not in PLAIN_IMPORT_SUFFIXES:
            # pytest's rewritten modules (`-pytest-9.2.0.pyc`) are read by pytest's own import hook
            # only, in a pytest process as it starts: this run's processes started before any case
            # ran. Written by them as they import the harness, they are not what a case planted.
            continue
        level = 2 if rest.startswith(".opt-2") else 1 if rest.startswith(".opt-1") else 0
        source = pyc.parent.parent / f"{stem}.py"
        try:
            known = (_identity(pyc), _stamp(source) if source.is_file() else "no source")
            if verified is not None and verified.get(str(pyc)) == known:
                continue
            data = files.read_bytes(pyc)
            if source.is_file() and _would_load(data, source):
                code = marshal.loads(data[16:])
                expected = compile(files.read_bytes(source), str(source), "exec", dont_inherit=True, optimize=level)
                if code != expected:
                    bad.append(str(pyc))
                    continue
        except (OSError, ValueError, EOFError, TypeError, SyntaxError):
            bad.append(str(pyc))
            continue
        if verified is not None:
            verified[str(pyc)] = known
    return bad


def _bytecode_files(root: Path, tag: str) -> list[Path]:
    """Every `__pycache__/*.<tag>*.pyc` under root, outside the folders fingerprint() skips."""
    found = []
    for folder, dirs, names in os.walk(root):
        inside = Path(folder).name == "__pycache__"
        dirs[:] = (
            []
            if inside
            else [
                d
                for d in dirs
                if d == "__pycache__" or (d not in SKIPPED_FOLDERS and not d.startswith(".") and d != "venv")
            ]
        )
        if inside:
            found += [Path(folder, name) for name in names if name.endswith(".pyc") and f".{tag}" in name]
    return found


def _stamp(source: Path) -> str:
    info = source.stat()
    return f"{info.st_mtime_ns}:{info.st_size}"


def _identity(pyc: Path) -> str:
    """A file's inode, size, mtime and ctime: any write changes its ctime, which no process can set
    back (utime sets mtime only), so an unchanged identity is an unchanged file."""
    info = os.lstat(pyc)
    return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"


def _would_load(data: bytes, source: Path) -> bool:
    """Whether the import system takes this pyc for source without compiling the source."""
    flags = int.from_bytes(data[4:8], "little")
    if flags & 0b1:  # hash-based: taken on its hash (or unchecked); check its content whatever it says
        return True
    info = source.stat()
    stamp = (int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)
    return (int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")) == stamp


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
    config.stash[FINGERPRINT_KEY] = _run_fingerprint(config)


def _changed(config: pytest.Config) -> set[str]:
    before = config.stash.get(FINGERPRINT_KEY, None)
    if before is None:
        return set()
    now = _run_fingerprint(config)
    return {name for name in before.keys() | now.keys() if before.get(name) != now.get(name)}


def note(config: pytest.Config) -> None:
    """After each case (the controlling process): a helper module a case rewrites (or whose bytecode
    it plants), another case imports and a third puts back is unchanged at the end of the run; seen
    here, it still fails it."""
    if FINGERPRINT_KEY in config.stash:
        seen = config.stash.setdefault(SEEN_CHANGED_KEY, set())
        seen.update(_changed(config))
        seen.update(bytecode_problems(_bytecode_roots(config), config.stash.setdefault(VERIFIED_KEY, {})))


def _bytecode_roots(config: pytest.Config) -> list[Path]:
    return [PACKAGE, *(folder for folder in _run_folders(config) if not folder.is_relative_to(PACKAGE))]


def problems(config: pytest.Config) -> list[str]:
    """At the end of the run: what changed in the harness's code, its bytecode, the conftests or the
    case files since take() (or was seen changed after a case), as one problem."""
    if FINGERPRINT_KEY not in config.stash:
        return []
    seen: set[str] = config.stash.get(SEEN_CHANGED_KEY, set())
    changed = sorted(_changed(config) | seen)
    changed += sorted(set(bytecode_problems(_bytecode_roots(config))) - set(changed))
    if not changed:
        return []
    shown = ", ".join(_shown(name, config.rootpath) for name in changed[:5]) + (
        f" and {len(changed) - 5} more" if len(changed) > 5 else ""
    )
    return [
        f"the harness's code or the run's case files changed while the run's cases ran (by a case?): {shown}; "
        "verdicts of cases that ran after it cannot be trusted, and the run fails"
    ]


def _shown(name: str, rootpath: Path) -> str:
    path = Path(name)
    for base, prefix in ((PACKAGE, "harness/"), (rootpath, "")):
        if path.is_relative_to(base):
            return prefix + str(path.relative_to(base))
    return name
