"""Versions of what a run used, read from the installed distributions' metadata.

The pytest process never imports torch or torch_xla (a crash there would take pytest down), so
the versions come from package metadata: the children run the same interpreter and site-packages.
The child still reports the torch_xla it imported (CaseRecord.torch_xla); that one judges.
"""

from __future__ import annotations

import importlib.metadata

DISTRIBUTIONS = ("torch_xla", "torch", "jax", "libtpu")


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def harness() -> str:
    return installed("spmd-regression-harness") or "unknown"


def stack() -> dict[str, str | None]:
    """torch_xla, torch, jax and libtpu as installed here (None: not installed)."""
    return {name: installed(name) for name in DISTRIBUTIONS}


def describe(versions: dict[str, str | None]) -> str:
    """`torch_xla 2.9.0, torch 2.9.0, jax 0.7.1` (what is not installed is left out)."""
    return ", ".join(f"{name} {version}" for name, version in versions.items() if version) or "no torch_xla installed"
