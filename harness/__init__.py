"""SPMD regression harness for torch_xla.

The pytest plugin lives in `harness.plugin`; case bodies run in child processes started by
`harness.isolation` (see docs/architecture.md). Importing any module of this package loads
neither torch nor torch_xla (tests/test_parent_imports.py imports every one to check): the
modules case bodies use in their children (`xla`, `recording`, `stepcosts`) import them inside
the functions that need them.

What case authors may import is `__all__` below: `from harness import xla, sharding`, or names
from those modules (`from harness.sharding import parse_sharding`). Everything else (the plugin,
the isolation machinery, results folders, the CLIs) may change without notice;
tests/test_public_surface.py pins this list and keeps cases/ inside it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "costbaseline",  # cost baselines, for the cost detectors' self-test cases
    "costs",  # cost signatures and their comparison
    "hlo",  # HLO text read by role
    "meshes",  # training mesh layouts
    "oracles",  # the differential oracle: programs, their runner and search (harness/oracles/)
    "recording",  # what bodies record of shardings, by stable name
    "registry",  # known_bugs.toml entries (get_entry)
    "sharding",  # HLO sharding values and assertions on them
    "stepcosts",  # the child-side meter of a training step's costs
    "tiles",  # which device holds which tile
    "xla",  # torch_xla helpers absorbing release differences
]


def __getattr__(name: str) -> ModuleType:
    # Lazy (PEP 562): `import harness` stays cheap and torch-free in the pytest process, and
    # `harness.xla` after a bare `import harness` still works, importing the module on first use.
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
