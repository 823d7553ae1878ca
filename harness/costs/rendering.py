"""Cost figures as people read them: sizes (kib), one line per signature (summary), the release
matrix's cell (held_cell).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.costs.signature import DEFAULT_LABEL, NATIVE_FIELDS, NATIVE_NAMES


def kib(count: int) -> str:
    """1536 -> '1.5 KiB', 100 -> '100 B': sizes a reader compares at a glance."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= size:
            return f"{count / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} B"


def signed_kib(count: int) -> str:
    return ("+" if count > 0 else "-") + kib(abs(count))


def collective_groups(entries: list[Mapping[str, Any]]) -> str:
    return " + ".join(
        f"{e['replica_groups']} x{e['count']}" for e in sorted(entries, key=lambda e: e["replica_groups"])
    )


def collectives_listing(listed: list[Mapping[str, Any]] | None) -> str:
    if listed is None:
        return "collectives not read"
    totals: dict[str, int] = {}
    for entry in listed:
        totals[entry["kind"]] = totals.get(entry["kind"], 0) + entry["count"]
    return ", ".join(f"{kind} {count}" for kind, count in sorted(totals.items())) or "no collectives"


def summary(signature: Mapping[str, Any]) -> str:
    """One line for a whole signature: '3 steps, 1 compilation(s); step0: all-gather 3, temp 7 KiB;
    per device parameters 1 KiB, ...; live after step2: 6 tensors (1.5 KiB per device)'."""
    graphs = signature.get("graphs", {})
    listed = "; ".join(
        f"{name}: {collectives_listing(g.get('collectives'))}"
        + "".join(f", {k} {kib(g['memory'][k])}" for k in ("temp", "peak") if k in g.get("memory", {}))
        for name, g in sorted(graphs.items())
    )
    memory = ", ".join(f"{k.replace('_', ' ')} {kib(v)}" for k, v in sorted(signature.get("memory", {}).items()))
    steps = signature.get("steps", [])
    last = steps[-1].get("live") if steps else None
    live = (
        f"; live after step{len(steps) - 1}: {last.get('tensors', 0)} tensors "
        f"({kib(last.get('bytes_per_device', 0))} per device)"
        if last
        else ""
    )
    return (
        f"{len(steps)} steps, {sum(s.get('compiles', 0) for s in steps)} "
        f"compilation(s); {listed or 'no graph read'}; per device {memory or 'memory not measured'}{live}"
    )


def held_cell(signature: Mapping[str, Any]) -> list[str]:
    """The release matrix's footprint and native figures of a record's signature (with_native):
    ['footprint 3.6 KiB, step peak 9.6 KiB', 'native heap +2 KiB, resident set +0 B per step']."""
    steps = signature.get("steps", [])
    live = (steps[-1].get("live") if steps else None) or {}
    parts = []
    held = [
        f"{name} {kib(live[field])}"
        for field, name in (
            ("footprint_bytes", "footprint"),
            # a record made before held_peak_bytes: its footprint + temp
            ("held_peak_bytes" if "held_peak_bytes" in live else "step_peak_bytes", "step peak"),
        )
        if field in live
    ]
    if held:
        parts.append(", ".join(held))
    native = signature.get("native") or {}
    if native:
        shown = ", ".join(f"{NATIVE_NAMES[f].split(' (')[0]} +{kib(native[f])}" for f in NATIVE_FIELDS if f in native)
        parts.append(f"{shown} per step")
    return parts


def label_prefix(label: str) -> str:
    return "" if label == DEFAULT_LABEL else f"{label}/"
