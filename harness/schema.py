"""Small checks shared by the readers of the harness's input files (registry, baseline, records).

Each returns or raises nothing clever: the caller puts the file, the entry and the field in front
of the words these build, so a message reads "FILE: entry X: field: what is wrong; what to do".
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any


def unknown_keys(keys: Iterable[str], known: Iterable[str]) -> str | None:
    """'unknown key 'signature'; did you mean 'signatures'?' for the first unknown key, else None.

    A misspelt optional key would otherwise be dropped without a word, and the field it meant
    to set would silently take its default.
    """
    known = sorted(known)
    unknown = sorted(str(k) for k in keys if k not in known)
    if not unknown:
        return None
    close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
    return f"unknown key {unknown[0]!r}; {hint}"


def load_json(text: str | bytes) -> Any:
    """json.loads, where JSON nested deeper than the interpreter can recurse (a file a case
    wrote) is a ValueError like any other bad JSON, not a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply to be read") from None


def shown(value: Any) -> str:
    """What a value is, for a message: "the string 'T'", "the number 2.6", "a list"."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if value is None:
        return "null"
    containers: dict[type, str] = {list: "a list", tuple: "a list", dict: "a mapping"}
    return containers.get(type(value), f"a {type(value).__name__}")
