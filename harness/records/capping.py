"""Keep a job summary under what GitHub takes: 1 MiB per workflow step, the summaries of every report of
the step together (scripts/ci-spmd.sh reports the base build's run and the PR's in one workflow step).

A run of 3,000 cases renders to about 2.4 MiB. Rows are left out least wanted first (passed, then
skipped, then known bugs; failures last, so they are what stays) and the summary says how many of
which; the family headings and the totals still count every case. Should even that not fit (a
results folder full of problems or comparison lines), the text is cut at a line and says so.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Sequence

from harness.records.results import CaseRecord

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub's limit for one step's summary, in bytes
# What a report writes stays this far under the limit: the other steps' text, and the margin
# GitHub counts in (its own line endings) are not this report's to spend.
MARGIN = 32 * 1024
MINIMUM = 16 * 1024  # a report always says at least its totals and problems, whatever came before
# Rows are left out in this order: what a reader looks for last goes first.
LEAVE_OUT_FIRST = {"passed": 0, "skipped": 1, "xfailed": 2}


def size(text: str) -> int:
    return len(text.encode("utf-8", "backslashreplace"))


def budget(already_written: int = 0) -> int:
    """What one report may write into a step summary that holds already_written bytes."""
    return max(STEP_SUMMARY_LIMIT - MARGIN - already_written, MINIMUM)


def fit(records: Sequence[CaseRecord], render: Callable[[Collection[int]], str], limit: int) -> str:
    """render(left_out) for the fewest left-out rows that fit in limit bytes; cut when none does.
    left_out holds the id() of records, least wanted first (failures last)."""
    text = render(frozenset())
    if size(text) <= limit:
        return text
    order = [id(r) for r in sorted(records, key=lambda r: LEAVE_OUT_FIRST.get(r.outcome, 3))]
    low, high = 1, len(order)  # the fewest rows to leave out: a binary search, each step a render
    best = render(frozenset(order))
    while low <= high:
        middle = (low + high) // 2
        candidate = render(frozenset(order[:middle]))
        if size(candidate) <= limit:
            best, high = candidate, middle - 1
        else:
            low = middle + 1
    return best if size(best) <= limit else cut(best, limit)


def cut(text: str, limit: int) -> str:
    """The first lines of text that fit in limit bytes, a line saying how many were left out, and
    the last line (the totals)."""
    lines = text.splitlines()
    last = lines.pop() if lines else ""
    kept: list[str] = []
    used = size(last) + 400  # room for the note
    for line in lines:
        used += size(line) + 1
        if used > limit:
            break
        kept.append(line)
    note = (
        f"⚠️ **The summary was cut here: {len(lines) - len(kept)} more line(s) of {size(text)} bytes would pass "
        f"GitHub's {STEP_SUMMARY_LIMIT // 1024} KiB per step; every record is in the uploaded results folder.**"
    )
    return "\n".join([*kept, "", note, "", last]) + "\n"


def left_out_line(left_out: Sequence[CaseRecord], total: int) -> str:
    """What the tables do not show, for the summary."""
    outcomes = collections.Counter(r.outcome if r.outcome in LEAVE_OUT_FIRST else "failed" for r in left_out)
    which = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items(), key=lambda x: _order(x[0])))
    return (
        f"⚠️ **{len(left_out)} of {total} case rows left out ({which}) to keep this summary under GitHub's "
        f"{STEP_SUMMARY_LIMIT // 1024} KiB per step; every record is in the uploaded results folder "
        "(verdicts-*.jsonl).**"
    )


def _order(outcome: str) -> int:
    return LEAVE_OUT_FIRST.get(outcome, 3)
