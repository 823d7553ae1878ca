"""Calls of torch_xla's SPMD API, counted per metered step. Used inside children only.

A native leak in torch_xla is often one allocation kept per call of one of its functions (a build
that loses 256 KiB in every `xs.mark_sharding`): the heap then grows per step in proportion to how
often a step calls it. The step meter (harness.stepcosts) counts, beside the native heap, the calls
of the SPMD entry points every Python path goes through: the `torch_xla._XLAC` bindings that
`xs.mark_sharding`, `enable_manual_sharding`, ... call, looked up on the module at each call (so a
wrapper installed here sees a case's calls and FSDPv2's alike). Each binding is wrapped once per
process; counting costs a dictionary increment per call.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

# The binding, and the name of the Python API a reader knows it by.
BINDINGS = {
    "_xla_mark_sharding": "mark_sharding",
    "_xla_annotate_custom_sharding": "annotate_custom_sharding",
    "_mark_manual_sharding": "mark_manual_sharding",
    "_spmd_full_to_shard_shape": "enable_manual_sharding",
    "_spmd_shard_to_full_shape": "disable_manual_sharding",
    "_xla_clear_sharding": "clear_sharding",
}
MAX_APIS = 16  # names a record may keep (a checked bound: records are read back as untrusted)
CALLS: collections.Counter[str] = collections.Counter()
_WRAPPED = "__harness_counted__"


def install() -> None:
    """Wrap each binding torch_xla has (idempotent: a binding wrapped already is left as it is)."""
    import torch_xla

    bindings = torch_xla._XLAC
    for binding, api in BINDINGS.items():
        original = getattr(bindings, binding, None)
        if original is None or getattr(original, _WRAPPED, False):
            continue
        setattr(bindings, binding, _counted(original, api))


def _counted(original: Any, api: str) -> Any:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        CALLS[api] += 1
        return original(*args, **kwargs)

    setattr(counted, _WRAPPED, True)
    return counted


def now() -> dict[str, int]:
    return dict(CALLS)


def since(before: dict[str, int]) -> dict[str, int]:
    """The calls made since `before` (a now()), by API, those made at least once."""
    return {api: n - before.get(api, 0) for api, n in CALLS.items() if n - before.get(api, 0) > 0}
