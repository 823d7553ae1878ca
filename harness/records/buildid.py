"""Which torch_xla build a run used: its files, not its version label.

Two builds of one release both read `torch_xla 2.9.0` (a local build, a patched copy, a wheel
from a CI artifact), so a comparison of two runs named by their labels alone cannot say whether
it compared two builds at all. A build is told by its files, read from the installed
distribution (the pytest process never imports torch_xla; its children run the same
site-packages):

    native   sha256 of its native libraries (_XLAC*.so, the files the wheel's RECORD lists that end
             in .so), read in full: a rebuilt library with the same size is another build.
             ~1 s for 2.9.0's 305 MB _XLAC on this project's CI machine, once per run (not cached:
             a cache a case body can write could name a build that did not run)
    python   sha256 over its Python files' paths and contents (3 MB)
    wheel    the wheel's file name and hash where pip recorded them (direct_url.json)
    git      torch_xla/version.py's __xla_gitrev__ where the build wrote one

The build's id is the first 12 hex digits of sha256(native, python). A fake-backend run names its
build in HARNESS_FAKE_BUILD (the harness's self-tests).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Any

from harness import schema
from harness.isolation.system import files

FILE_NAME = "build.json"  # in the run folder, written by the process that owns the run
FAKE_BUILD_ENV = "HARNESS_FAKE_BUILD"
_GITREV = re.compile(r"""^__xla_gitrev__\s*=\s*['"]([0-9a-f]{7,40})['"]""", re.MULTILINE)
_FIELDS = ("torch_xla", "id", "native", "python", "wheel", "wheel_sha256", "git")
MAX_FILE_BYTES = 16 << 10


def printable_text(text: str, limit: int) -> str:
    """At most `limit` characters, each one printable (the rest escaped): these files are untrusted."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])


def identify(distribution: str = "torch_xla", fake: bool = False) -> dict[str, str | None] | None:
    """The installed build's identity, None where the distribution is not installed."""
    if fake:
        name = os.environ.get(FAKE_BUILD_ENV)
        return _identity(os.environ.get("HARNESS_FAKE_TORCH_XLA"), name, name, None, None, None) if name else None
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    paths = sorted((Path(str(dist.locate_file(f))), str(f)) for f in dist.files or ())
    native = _digest((path, name) for path, name in paths if ".so" in Path(name).suffixes)
    python = _digest((path, name) for path, name in paths if name.endswith(".py"))
    wheel, wheel_sha256 = _wheel(dist)
    return _identity(dist.version, native, python, wheel, wheel_sha256, _git(paths, f"{distribution}/version.py"))


def _identity(
    version: str | None, native: str | None, python: str | None, wheel: str | None, sha: str | None, git: str | None
) -> dict[str, str | None]:
    built = hashlib.sha256(f"{native}\n{python}".encode()).hexdigest()[:12]
    return {
        "torch_xla": version,
        "id": built,
        "native": native,
        "python": python,
        "wheel": wheel,
        "wheel_sha256": sha,
        "git": git,
    }


def _digest(paths: Any) -> str | None:
    """sha256 over each file's name and content; None where there is no such file."""
    total, seen = hashlib.sha256(), False
    for path, name in paths:
        try:
            with open(path, "rb") as handle:
                total.update(name.encode() + b"\0")
                while chunk := handle.read(1 << 20):
                    total.update(chunk)
                seen = True
        except OSError:
            total.update(f"{name}: unreadable\0".encode())
    return total.hexdigest()[:16] if seen else None


def _wheel(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """The wheel file pip installed from, and its hash, as direct_url.json says (PEP 610)."""
    try:
        data = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return None, None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None, None
    name = printable_text(data["url"].rsplit("/", 1)[-1], 200)
    info = data.get("archive_info")
    sha = info.get("hash") if isinstance(info, dict) and isinstance(info.get("hash"), str) else None
    return name, printable_text(sha, 100) if sha else None


def _git(paths: list[tuple[Path, str]], version_file: str) -> str | None:
    for path, name in paths:
        if name.replace("\\", "/") == version_file:
            try:
                found = _GITREV.search(files.read_text(path)[:MAX_FILE_BYTES])
            except (OSError, UnicodeDecodeError):
                return None
            return found.group(1) if found else None
    return None


def describe(identity: dict[str, Any] | None) -> str:
    """`build 1a2b3c4d5e6f (native 0123..., python 4567..., wheel torch_xla-...whl, git 5fab705)`."""
    if not identity:
        return "build unknown"
    parts = [f"{key} {str(identity[key])[:12]}" for key in ("native", "python") if identity.get(key)]
    parts += [f"wheel {identity['wheel']}"] if identity.get("wheel") else []
    parts += [f"git {str(identity['git'])[:12]}"] if identity.get("git") else []
    return f"build {identity.get('id')}" + (f" ({', '.join(parts)})" if parts else "")


def write(run: Path, identity: dict[str, Any] | None) -> None:
    if identity is not None:
        files.create_new(run / FILE_NAME, json.dumps(identity, sort_keys=True))


def read(run: Path) -> dict[str, str | None] | None:
    """A run's build identity; None where it recorded none or the file is not one (a case can
    write the folder: only short printable strings of the known fields are taken)."""
    try:
        data = schema.load_json(files.read_text(run / FILE_NAME)[:MAX_FILE_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    return {key: printable_text(data[key], 200) if isinstance(data.get(key), str) else None for key in _FIELDS}


def relation(base: dict[str, Any] | None, this: dict[str, Any] | None) -> str | None:
    """The one line that says how the two builds relate where their labels agree; None otherwise."""
    if not base or not this or base.get("torch_xla") != this.get("torch_xla"):
        return None
    label = f"torch_xla {base.get('torch_xla')}"
    if base.get("id") == this.get("id"):
        return (
            f"WARNING: the base run ran this very build ({label}, {describe(this)}): nothing was compared with "
            "another build (point --spmd-compare at the base build's run)"
        )
    return f"same label, different build: both are {label}; base {describe(base)}, this run {describe(this)}"
