"""Two signatures compared item by item: counts exactly, bytes within a band (docs/costs.md#bands),
for the cost baseline, the base run, the release matrix and the GKE aggregation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from harness.costs.rendering import collective_groups, collectives_listing, kib, label_prefix, signed_kib
from harness.costs.signature import (
    DEFAULT_LABEL,
    DEFAULT_WARMUP,
    GRAPH_MEMORY_FIELDS,
    HELD_PEAK_NAME,
    MEMORY_FIELDS,
    STEP_FIELDS,
    comparable,
    new_buffers,
)

# Bytes are judged with a band, counts exactly (docs/costs.md#bands). XLA's buffer assignment moves
# from release to release by a few bytes to a few percent (a padded scalar, a fused copy: 177.3 KiB
# +16 B, 1.4 -> 1.5 KiB on a tiny graph, 90 -> 95.1 KiB temp from 2.7 to 2.8) while every count
# stays the same; what users report is memory that doubles (#8423: 2.5x). A byte figure fails when
# it grows by more than 5% of what it was and by more than 1 KiB; a smaller growth is listed
# ("within the band"), a decrease is listed as an improvement. A count (compilations, executions,
# collectives and their replica groups, live tensors) fails on any change.
BYTES_BAND_RELATIVE = 0.05

BYTES_BAND_FLOOR = 1024

FAILS, WITHIN_BAND, IMPROVEMENT = "fails", "within the band", "improvement"


def bytes_judgement(before: int, after: int) -> str:
    """FAILS when `after` exceeds `before` by more than the band, IMPROVEMENT when it is lower,
    else WITHIN_BAND (equal figures are not a change at all: callers skip them)."""
    if after < before:
        return IMPROVEMENT
    grew = after - before
    return FAILS if grew > BYTES_BAND_FLOOR and grew > before * BYTES_BAND_RELATIVE else WITHIN_BAND


def band_text() -> str:
    return f"+{BYTES_BAND_RELATIVE:.0%} and +{kib(BYTES_BAND_FLOOR)}"


@dataclasses.dataclass(frozen=True)
class CostChange:
    item: str  # "step0", "memory", "step3" (a step's counts), prefixed with the meter's label
    detail: str  # "all-gather 3 -> 5 (+96 KiB per device)"
    judgement: str = FAILS  # WITHIN_BAND or IMPROVEMENT: a byte move that is listed, not failed

    @property
    def fails(self) -> bool:
        return self.judgement == FAILS

    def __str__(self) -> str:
        listed = "" if self.fails else f" [{self.judgement}, listed]"
        return f"{self.item}: {self.detail}{listed}"


def failing(changes: list[CostChange]) -> list[CostChange]:
    return [c for c in changes if c.fails]


def listed(changes: list[CostChange]) -> list[CostChange]:
    """Byte moves within the band and improvements: shown, never failed."""
    return [c for c in changes if not c.fails]


class _Parts:
    """The parts of one item's change, grouped by judgement: one CostChange per judgement."""

    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {}
        self.explained = False  # a footprint change here names its new buffers

    def add(self, text: str, judgement: str = FAILS) -> None:
        self.parts.setdefault(judgement, []).append(text)

    def add_bytes(self, text: str, before: int, after: int) -> None:
        self.add(text, bytes_judgement(before, after))

    def extend(self, other: _Parts) -> None:
        for judgement, texts in other.parts.items():
            self.parts.setdefault(judgement, []).extend(texts)

    def changes(self, item: str) -> list[CostChange]:
        return [
            CostChange(item, ", ".join(self.parts[j]), j) for j in (FAILS, WITHIN_BAND, IMPROVEMENT) if j in self.parts
        ]


def compare_loops(
    expected: Mapping[str, Mapping[str, Any]], observed: Mapping[str, Mapping[str, Any]], reference: str = "baseline"
) -> list[CostChange]:
    """Every training loop of a case, by label: compare() where both measured it, else a line
    saying which side lacks it (`reference` names where `expected` was read from)."""
    changes = []
    for label in sorted(set(expected) | set(observed)):
        if label not in observed:
            changes.append(CostChange(label, "training loop no longer measured"))
        elif label not in expected:
            changes.append(CostChange(label, f"training loop not in the {reference}"))
        else:
            changes += compare(expected[label], comparable(observed[label]), label)
    return changes


def compare(expected: Mapping[str, Any], observed: Mapping[str, Any], label: str = DEFAULT_LABEL) -> list[CostChange]:
    """Per-item changes between two signatures: a step's counts, a graph's collectives, memory.
    Counts fail on any change; bytes fail beyond the band and are listed otherwise (CostChange.judgement)."""
    changes: list[CostChange] = []
    prefix = label_prefix(label)
    warmup_a, warmup_b = expected.get("warmup"), observed.get("warmup")
    if warmup_a is not None and warmup_b is not None and warmup_a != warmup_b:
        # A longer warm-up hides a leak or a compilation in the steps it no longer judges (a 5-step
        # loop with a 4-step warm-up judges one step, and native growth needs two): a count, exact.
        changes.append(
            CostChange(f"{prefix}warm-up", f"{warmup_a} -> {warmup_b} steps (steady state judges the steps after it)")
        )
    before_steps, after_steps = expected.get("steps", []), observed.get("steps", [])
    # A footprint that grew beyond the band is named by its new buffers (dtype, shape, sharding),
    # once, on the first step it fails on; where either side has no listing, the bytes alone.
    buffers_a, buffers_b = expected.get("buffers"), observed.get("buffers")
    explain = new_buffers(buffers_a, buffers_b) if buffers_a is not None and buffers_b is not None else ""
    # A loop longer than the baseline's (the nightly tier's 20 steps against a baseline of the PR
    # tier's 5) compares each step after the baseline's last with that last step: steps after the
    # warm-up run the same cached graph and leave the same alive, so each must read as it did.
    longer = len(after_steps) > len(before_steps) > (warmup_a if warmup_a is not None else DEFAULT_WARMUP)
    for index in range(max(len(before_steps), len(after_steps))):
        if index >= len(after_steps) or (index >= len(before_steps) and not longer):
            changes.append(
                CostChange(
                    f"{prefix}step{index}", "not run in the baseline" if index >= len(before_steps) else "no longer run"
                )
            )
            continue
        a, b = before_steps[min(index, len(before_steps) - 1)], after_steps[index]
        parts = _Parts()
        for k in STEP_FIELDS:
            if k != "cache_hits" and a.get(k) != b.get(k):
                parts.add(f"{k} {a.get(k)} -> {b.get(k)}")
        live = _live_change(a.get("live"), b.get("live"), explain)
        if live.explained:
            explain = ""
        parts.extend(live)
        changes += parts.changes(f"{prefix}step{index}")
    graphs_a, graphs_b = expected.get("graphs", {}), observed.get("graphs", {})
    for name in sorted(set(graphs_a) | set(graphs_b)):
        changes += _graph_change(graphs_a.get(name), graphs_b.get(name)).changes(f"{prefix}{name}")
    mem_a, mem_b = expected.get("memory", {}), observed.get("memory", {})
    parts = _Parts()
    for k in MEMORY_FIELDS:
        if mem_a.get(k) != mem_b.get(k) and (k in mem_a or k in mem_b):
            before, after = mem_a.get(k, 0), mem_b.get(k, 0)
            parts.add_bytes(f"{k.replace('_', ' ')} {_moved(before, after)}", before, after)
    changes += parts.changes(f"{prefix}memory per device")
    return _merge_listed_steps(changes, prefix)


def _merge_listed_steps(changes: list[CostChange], prefix: str) -> list[CostChange]:
    """One line for a byte move that every step of a run of steps shows alike ("step0..step4: step
    peak 177.3 KiB -> 177.3 KiB (+16 B) per device [within the band, listed]"): between two
    releases a padded buffer moves every step's peak by the same bytes. Failing changes stay one
    per step, as the baseline's lines name them."""
    merged: list[CostChange] = []
    run: list[tuple[int, CostChange]] = []

    def flush() -> None:
        if run:
            first, last = run[0][0], run[-1][0]
            item = f"{prefix}step{first}" + (f"..step{last}" if last > first else "")
            merged.append(dataclasses.replace(run[0][1], item=item))
            run.clear()

    for change in changes:
        index = _step_index(change.item, prefix)
        if index is None or change.fails:
            flush()
            merged.append(change)
            continue
        if run and (
            index != run[-1][0] + 1 or (change.detail, change.judgement) != (run[-1][1].detail, run[-1][1].judgement)
        ):
            flush()
        run.append((index, change))
    flush()
    return merged


def _step_index(item: str, prefix: str) -> int | None:
    """3 for f"{prefix}step3", else None (a graph, the memory line)."""
    rest = item.removeprefix(prefix)
    return int(rest[4:]) if item.startswith(prefix) and rest.startswith("step") and rest[4:].isdigit() else None


def _live_change(before: Mapping[str, int] | None, after: Mapping[str, int] | None, explain: str = "") -> _Parts:
    """'live after step: 10 -> 14 tensors (+32 KiB per device)' (a count: fails), or
    'live after step: 10 tensors, 1.2 KiB -> 1.3 KiB per device' (bytes alone: the band). A
    baseline taken before live tensors were measured has none: nothing to compare; a signature
    that lost them says so."""
    parts = _Parts()
    if before is None:
        return parts
    if after is None:
        parts.add("live after step: not measured")
        return parts
    count_a, count_b = before.get("tensors"), after.get("tensors")
    bytes_a, bytes_b = before.get("bytes_per_device", 0), after.get("bytes_per_device", 0)
    moved = bytes_b - bytes_a
    if count_a != count_b:
        parts.add(
            f"live after step: {count_a} -> {count_b} tensors" + (f" ({signed_kib(moved)} per device)" if moved else "")
        )
    elif moved:
        parts.add_bytes(f"live after step: {count_b} tensors, {_moved(bytes_a, bytes_b)} per device", bytes_a, bytes_b)
    for field, name in (
        ("footprint_bytes", "device footprint"),
        ("step_peak_bytes", "step peak (footprint + temp)"),
        ("held_peak_bytes", HELD_PEAK_NAME),
    ):
        held_a, held_b = before.get(field), after.get(field)
        if held_a is None or held_b is None or held_a == held_b:  # a baseline without it: not compared
            continue
        text = f"{name} {_moved(held_a, held_b)} per device"
        donated_a, donated_b = before.get("donated_bytes", 0), after.get("donated_bytes", 0)
        if field == "held_peak_bytes" and donated_b < donated_a:
            text += (
                f" (donated {_moved(donated_a, donated_b)}: {kib(donated_a - donated_b)} of arguments no longer "
                "aliased to outputs, so the step holds them and their outputs at once)"
            )
        if explain and bytes_judgement(held_a, held_b) == FAILS:
            text += f" (device buffers new: {explain})"
            parts.explained, explain = True, ""
        parts.add_bytes(text, held_a, held_b)
    return parts


def _memory_change(before: Mapping[str, int] | None, after: Mapping[str, int] | None) -> _Parts:
    """'temp 1.2 MiB -> 2.5 MiB per device', one part per field that moved, each judged by the band."""
    parts = _Parts()
    if before is None:
        return parts
    if after is None:
        parts.add("memory not read")
        return parts
    for k in GRAPH_MEMORY_FIELDS:
        if k in before and k in after and before[k] != after[k]:
            if k == "donated":  # fewer arguments donated: every step holds them and their outputs at once
                parts.add_bytes(
                    f"donated (arguments whose buffers the outputs reuse) {_moved(before[k], after[k])} per device",
                    after[k],
                    before[k],
                )
                continue
            parts.add_bytes(f"{k} {_moved(before[k], after[k])} per device", before[k], after[k])
    return parts


def _moved(before: int, after: int) -> str:
    """'1.2 MiB -> 2.5 MiB'; where both round alike, the bytes moved too: '177.3 KiB -> 177.3 KiB (+16 B)'."""
    shown = f"{kib(before)} -> {kib(after)}"
    return shown if kib(before) != kib(after) else f"{shown} ({signed_kib(after - before)})"


def _graph_change(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> _Parts:
    parts = _Parts()
    if before is None:
        parts.add(
            "new graph, " + collectives_listing(after.get("collectives") if after else None) + " (not in the baseline)"
        )
    elif after is None:
        parts.add("no longer compiled")
    else:
        parts.extend(_collectives_change(before, after))
        parts.extend(_memory_change(before.get("memory"), after.get("memory")))
    return parts


def _collectives_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> _Parts:
    parts = _Parts()
    listed_a, listed_b = before.get("collectives"), after.get("collectives")
    if listed_a is None or listed_b is None:
        if listed_a is not None or listed_b is not None:
            parts.add(
                f"collectives no longer read ({after.get('unread', '')})"
                if listed_b is None
                else f"collectives read now: {collectives_listing(listed_b)}"
            )
        return parts
    for kind in sorted({c["kind"] for c in listed_a} | {c["kind"] for c in listed_b}):
        a = [c for c in listed_a if c["kind"] == kind]
        b = [c for c in listed_b if c["kind"] == kind]
        count_a, count_b = sum(c["count"] for c in a), sum(c["count"] for c in b)
        bytes_a, bytes_b = sum(c["bytes_per_device"] for c in a), sum(c["bytes_per_device"] for c in b)
        moved = f" ({signed_kib(bytes_b - bytes_a)} per device)" if bytes_a != bytes_b else ""
        if count_a != count_b:
            parts.add(f"{kind} {count_a} -> {count_b}{moved}")
        elif collective_groups(a) != collective_groups(b):
            parts.add(f"{kind} over {collective_groups(a)} -> {collective_groups(b)}{moved}")
        elif moved:  # the same collectives moving other bytes: a byte figure, judged by the band
            parts.add_bytes(f"{kind} {count_a}{moved}", bytes_a, bytes_b)
    return parts
