"""What a child's verdict may carry as observations, checked once, in the parent, as it arrives.

The observations are what a case body recorded (harness.isolation.child.context): sharding text and HLO
text by name, JSON values by key. A body can record anything under any key, and can even write a
verdict of its own on the result pipe, so the parent holds them to the shape its readers expect
before anything reads them (harness.isolation.parent.child_process.ChildProcess.finish): a verdict that
does not fit fails its case as a protocol failure naming the field or key, instead of an
INTERNALERROR in whatever reads it later, which would end the whole session.

Keys that start with `harness:` are the harness's own: the child-side cost meter
(harness.stepcosts) leaves the training loops' cost signatures and the partitioned modules they
were read from there, and the pytest process reads them (harness.judges.costcheck). Every such key the
parent reads is listed in RESERVED_VALUES with its check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from harness import costs
from harness.schema import shown

RESERVED_PREFIX = "harness:"


def _signatures_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"{shown(value)}, not a mapping of training-loop labels to cost signatures"
    for label, signature in value.items():
        try:
            costs.check_signature(signature, f"loop {label!r}")
        except costs.CostReadError as exc:
            return str(exc)
    return None


def _captures_problem(value: Any) -> str | None:
    """memray's captures: at most MAX_CAPTURES, each base64 of at most MAX_CAPTURE_BYTES, by a plain name."""
    limit = -(-costs.MAX_CAPTURE_BYTES // 3) * 4
    if not (
        isinstance(value, dict)
        and len(value) <= costs.MAX_CAPTURES
        and all(
            isinstance(name, str)
            and re.fullmatch(r"[A-Za-z0-9_]{1,80}", name)
            and isinstance(text, str)
            and len(text) <= limit
            and re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", text)
            for name, text in value.items()
        )
    ):
        return f"{shown(value)}, not at most {costs.MAX_CAPTURES} memray captures (base64) by name"
    return None


def _dumps_problem(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(text, str) for text in value.values()):
        return f"{shown(value)}, not a mapping of module names to HLO text"
    return None


# Every reserved key the pytest process reads, and what is wrong with a value (None: nothing).
RESERVED_VALUES: dict[str, Callable[[Any], str | None]] = {
    costs.SIGNATURES_VALUE: _signatures_problem,
    costs.DUMPS_VALUE: _dumps_problem,
    costs.CAPTURES_VALUE: lambda value: _captures_problem(value),
}


def _text_by_name_problem(what: str, value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"its {what} are {shown(value)}, not a mapping of names to text"
    for name, text in value.items():
        if not isinstance(text, str):
            return f"its {what} hold {name!r} as {shown(text)}, not text"
    return None


def problem(observations: Any) -> str | None:
    """Why a verdict's observations cannot be read (naming the field or the key), or None."""
    if not isinstance(observations, dict):
        return f"its observations are {shown(observations)}, not a mapping"
    unknown = sorted(set(observations) - {"shardings", "hlo", "values"})
    if unknown:
        return f"its observations hold an unknown field {unknown[0]!r}"
    for field, what in (("shardings", "sharding specs"), ("hlo", "HLO texts")):
        found = _text_by_name_problem(what, observations.get(field, {}))
        if found:
            return found
    values = observations.get("values", {})
    if not isinstance(values, dict):
        return f"its recorded values are {shown(values)}, not a mapping"
    for key, check in RESERVED_VALUES.items():
        if key in values:
            found = check(values[key])
            if found:
                return (
                    f"its {key!r} record is not as the harness writes it: {found} (keys that start with "
                    f"{RESERVED_PREFIX!r} are the harness's own; a body records its values under other names)"
                )
    return None
