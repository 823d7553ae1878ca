"""What a reproduced known bug excuses in a loop's steady state, and what it does not.

A case that xfails on its known bug still measured the rest of its loop: a build that leaks
2.3 MiB of native memory per step inside a case whose known bug keeps host objects alive must
fail that case, not hide behind the bug. So steady state is judged one figure at a time (the
compilations after the warm-up, XLA tensors and device bytes, host objects, the native heap, the
resident set), and a figure is excused only where the entry's signatures name it: entry
`mark-sharding-with-gradients-keeps-a-mesh-per-call` matches "host objects kept: ...Mesh +8", so
it excuses host objects, and native heap growth beside it is a finding.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from harness import costs
from harness.registry import KnownBug

# Each steady-state figure: the live fields it is judged on (None: the compilations after the
# warm-up), and the words of steady_state_problems' line for it that an entry's signature names.
FIGURES: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "compilations": (None, ("compiled",)),
    "XLA tensors": (("tensors", "bytes_per_device", "footprint_bytes"), ("XLA tensors", "device footprint")),
    "host objects": (("host_objects",), ("host objects", "linecache")),
    "native heap": (("heap_bytes",), ("native heap",)),
    "resident set": (("rss_bytes",), ("resident set",)),
}


def names_figure(entries: Sequence[KnownBug], words: tuple[str, ...]) -> bool:
    """Whether an entry's signatures name the figure: one of its words in a signature's pattern
    (its regular expression's escapes aside)."""
    patterns = [signature.pattern.replace("\\", "") for entry in entries for signature in entry.signatures]
    return any(word in pattern for word in words for pattern in patterns)


def only_figure(signature: Mapping[str, Any], fields: tuple[str, ...] | None) -> dict[str, Any]:
    """The signature with one figure left to judge: its live fields (None: no live figure, the
    compilations alone; else no compilation), and nothing that says what stayed alive, which
    belongs to the whole step and would let one figure's line name another's objects."""
    alone = copy.deepcopy(dict(signature))
    for step in alone.get("steps", []):
        step.pop("kept", None)
        step.pop("native_stacks", None)
        if fields is None:
            step.pop("live", None)
        else:
            step["compiles"] = 0
            step["live"] = {k: v for k, v in (step.get("live") or {}).items() if k in fields}
    return alone


def unexcused_problems(signature: Mapping[str, Any], label: str, entries: Sequence[KnownBug]) -> list[str]:
    """steady_state_problems' lines for the figures the known bug does not name."""
    problems = []
    for fields, words in FIGURES.values():
        if names_figure(entries, words):
            continue
        problems += costs.steady_state_problems(only_figure(signature, fields), label)
    return problems
