"""Why torch_xla's JAX-backed SPMD functions refuse to run. Used inside case bodies only.

`xs.shard_as` (2.8+) and, through it, the backward of `scan` and `scan_layers` (2.8+) lower a
JAX function with `torch_xla.core.xla_builder.call_jax`, which needs jax and torchax (bundled in
torch_xla's wheel from 2.8.0). When either does not import, torch_xla raises
`AssertionError: Jax is required for this feature` and drops the reason. This module says which
one failed and why, so that a case tells "jax is not installed" (the environment: a skip) from
"jax is installed and torch_xla's own torchax does not import" (a bug of the wheel).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

JAX_REQUIRED = "Jax is required for this feature"
# What torch_xla's maybe_get_torchax imports.
TORCHAX_MODULES = ("torchax", "torchax.tensor", "torchax.interop", "torchax.ops.mappings")


def jax_version() -> str | None:
    """jax's version, or None when it does not import (it is not a dependency of torch_xla: the
    `pallas` extra brings it)."""
    try:
        import jax
    except ImportError:
        return None
    return str(jax.__version__)


def torchax_import_error() -> str | None:
    """`Type: message` of what stops torchax from importing as torch_xla imports it, or None."""
    try:
        for name in TORCHAX_MODULES:
            importlib.import_module(name)
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def explain(what: str, error: BaseException) -> AssertionError:
    """The AssertionError to raise for torch_xla's 'Jax is required' from `what`, saying why."""
    version = jax_version()
    if version is None:
        return AssertionError(f"{what} raised {JAX_REQUIRED!r}: jax is not installed (torch_xla[pallas] brings it)")
    cause = torchax_import_error() or "torchax imports here: the cause is elsewhere"
    return AssertionError(
        f"{what} raised {JAX_REQUIRED!r} with jax {version} installed: torch_xla's bundled torchax does not "
        f"import ({cause})"
    )


def stand_in_for_flax() -> bool:
    """Make torch_xla 2.9.0's bundled torchax importable without flax, as installing flax does.

    Its torchax/checkpoint.py runs `from flax.training import checkpoints` at import (flax is
    used by its checkpoint functions only, and no extra of torch_xla brings it). An empty
    `flax.training.checkpoints` module lets the import finish. Returns False (and changes
    nothing) where a real flax is installed.
    """
    if importlib.util.find_spec("flax") is not None:
        return False
    names = ("flax", "flax.training", "flax.training.checkpoints")
    modules = {name: types.ModuleType(name) for name in names}
    for parent, child in zip(names, names[1:]):
        modules[parent].__path__ = []  # a package, so that the submodule import is looked up
        setattr(modules[parent], child.rsplit(".", 1)[1], modules[child])
    sys.modules.update(modules)
    return True
