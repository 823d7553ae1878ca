"""Command-line number parsers shared by the pytest plugin and the release matrix.

argparse (which pytest's own option parser is built on) shows an ArgumentTypeError's text as is,
and any other error as "invalid <function name> value": the errors here are both, so the user
reads what the value must be, in plain words.
"""

from __future__ import annotations

import math

from harness.errors import NotAPositiveNumber


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a device or worker count)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise NotAPositiveNumber(f"{text!r} is not a positive whole number (1, 2, ...)")
    return value


# Every timeout of every tool reads the same way: plain seconds, or a number with s, m or h.
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def positive_seconds(text: str) -> float:
    """A positive, finite duration: seconds (60, 0.5) or with a unit (90s, 90m, 3h). nan, inf, 0
    and below would make a timeout that never fires or fires at once."""
    text = str(text).strip()
    scale = _UNITS.get(text[-1:].lower())
    try:
        value = float(text[:-1]) * scale if scale else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise NotAPositiveNumber(f"{text!r} is not a positive, finite number of seconds (e.g. 60, 0.5, 90m or 3h)")
    return value
