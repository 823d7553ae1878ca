"""What a reproduced known bug excuses in a loop's steady state, and what it does not.

A case that xfails on its known bug still measured the rest of its loop: a build that leaks
2.3 MiB of native memory per step inside a case whose known bug keeps host objects alive must
fail that case, not hide behind the bug. Without a reference a bug's side effects cannot be told
from a new fault on the figures a bug moves (a Dynamo retrace on every step keeps host objects and
compiles, whatever its entry's signature names), so on its own steady state judges a reproduced
bug's loop on native memory (the heap, the resident set), which no entry's bug moves unless its
signature names it; every other figure is held to the cost baseline and the base run, which hold
the bug too (harness.judges.costcheck, harness.judges.basecheck).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from harness import costs
from harness.registry import KnownBug

# Each steady-state figure judged on its own: the live field it is read from, and the words of
# steady_state_problems' line for it that an entry's signature would name.
NATIVE_HEAP_FIELD = "heap_bytes"
FIGURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "native heap": ((NATIVE_HEAP_FIELD,), ("native heap",)),
    "resident set": (("rss_bytes",), ("resident set",)),
}


def names_figure(entries: Sequence[KnownBug], words: tuple[str, ...]) -> bool:
    """Whether an entry's signatures name the figure (one of its words in a signature's pattern,
    its regular expression's escapes aside) or its `moves` list does (its mechanism moves it)."""
    if any(word in entry.moves for entry in entries for word in words):
        return True
    patterns = [signature.pattern.replace("\\", "") for entry in entries for signature in entry.signatures]
    return any(word in pattern for word in words for pattern in patterns)


def only_figure(signature: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The signature with one figure left to judge: its live fields and no compilation, and nothing
    that says what stayed alive, which belongs to the whole step and would let one figure's line
    name another's objects."""
    alone = copy.deepcopy(dict(signature))
    for step in alone.get("steps", []):
        step.pop("kept", None)
        step.pop("native_stacks", None)
        if NATIVE_HEAP_FIELD not in fields:
            # The nightly stack judge's lines are the native heap's, by allocating stack: a bug that
            # moves the heap moves them too, and the resident set's judge must not repeat them.
            step.pop("native_leaks", None)
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
