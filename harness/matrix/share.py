"""Share identical files between cached environments, as hard links.

Six release environments hold about 37 GB, much of it the same bytes: the CUDA libraries that
PyPI's torch wheels pull in repeat across releases that pin the same versions, as do jaxlib
builds and the harness's own dependencies. After an environment is built, every large file in it
whose content equals a file of another cached environment becomes a hard link to that file.
pip replaces files rather than writing into them, so a later install in one environment never
changes another's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

# Small files are not worth a hash: the savings are in the hundreds-of-MB libraries.
MIN_SHARED_BYTES = 1 << 20


def _large_files(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            if path.is_file() and not path.is_symlink() and info.st_size >= MIN_SHARED_BYTES:
                yield path, info


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def share_identical_files(env: Path, others: Iterable[Path]) -> int:
    """Hard-link `env`'s large files to identical files in `others`; return the bytes freed."""
    by_key: dict[tuple[str, int], list[Path]] = {}
    for other in others:
        if other.resolve() == env.resolve() or not other.is_dir():
            continue
        for path, info in _large_files(other):
            by_key.setdefault((path.name, info.st_size), []).append(path)
    freed = 0
    digests: dict[Path, str] = {}
    for path, info in _large_files(env):
        candidates = by_key.get((path.name, info.st_size), [])
        if not candidates:
            continue
        mine = _digest(path)
        for candidate in candidates:
            if candidate.stat().st_dev != info.st_dev or candidate.stat().st_ino == info.st_ino:
                continue
            if digests.setdefault(candidate, _digest(candidate)) != mine:
                continue
            _replace_with_link(path, candidate)
            freed += info.st_size
            break
    return freed


def _replace_with_link(path: Path, target: Path) -> None:
    """Swap `path` for a hard link to `target` atomically: a crash leaves one or the other."""
    staging = path.with_name(path.name + ".spmd-harness-link")
    staging.unlink(missing_ok=True)
    os.link(target, staging)
    os.chmod(staging, path.stat().st_mode)
    staging.replace(path)
