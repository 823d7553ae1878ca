"""One finding per cause: failed cases grouped by what changed, with what the records say it is.

One change in torch_xla fails many cases, each in its own words: a step that stopped donating
its parameters fails 12 loops with `step0: outputs 36.5 KiB -> 55.2 KiB per device`, the peak
beside it going down; a leak per `xs.mark_sharding` call fails every loop that marks, as
steady state in one case, against the base run in another. Grouping by exact text gives many
groups; this groups by the kind of figure that moved and its direction (the case's first cause,
in the order below), then says what the records allow about the cause:

    donation lost      the step module aliases fewer parameters than the base run's (the records keep
                       both counts), its outputs grew by the parameters' bytes
    a step graph split compilations or executions per step went up (and the step graph's
                       parameters renumbered: their sharding lines are a consequence, not a cause)
    a native leak      the native heap grew by the same amount per step in every loop

Pure functions over plain data: the pytest process (harness.run.findings) and spmd-report use it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

MAX_CASES_SHOWN = 6
EXAMPLE_CHARACTERS = 160  # of one case's line: the rest is in its failure
HEADLINE_CHARACTERS = 100  # of a failure's first words, where no figure moved (an exception message)
FILE_NAME = "findings.txt"  # in the run folder: the end of the run's findings, for spmd-report
_BYTES_TOLERANCE = 0.02  # "by the parameters' bytes": within 2% (XLA pads a scalar or two)


@dataclasses.dataclass
class FailedCase:
    """A failed case as the findings see it."""

    case: str
    items: list[str]  # what failed it, one line per item (base-run differences, else its own lines)
    costs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # this run's signatures, by loop
    base_costs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the base run's, where compared
    known_bug: str | None = None  # the entry it reproduced besides (an "XFAIL ... and besides" case)


# (kind, pattern, direction from the match): the first kind a case's items show is its cause.
# A number as the harness prints it: digits, one point at most (a case's message can say "1.2.3 KiB").
_NUMBER = r"\d+(?:\.\d+)?"
_NUMBERS = rf"(?P<before>{_NUMBER} ?[KMG]?i?B|\d+) -> (?P<after>{_NUMBER} ?[KMG]?i?B|\d+)"
KINDS: list[tuple[str, re.Pattern[str]]] = [
    # first: its line ends in the steady-state rule's words, which name compilations
    ("native stack judge", re.compile(r"\bthe stack judge did not run\b")),
    # torch_xla.compile(full_graph=True) refusing a sync inside the step is a split step graph too
    (
        "compilations per step",
        re.compile(rf"\bcompiles {_NUMBERS}|compiled \d+ new graph|Unexpected execution happens inside the compiled"),
    ),
    ("executions per step", re.compile(rf"\bexecutions {_NUMBERS}")),
    ("native memory per step", re.compile(r"native heap|resident set|native stack holding more blocks")),
    ("step graph outputs", re.compile(rf"\boutputs {_NUMBERS}")),
    ("step graph arguments", re.compile(rf"\barguments {_NUMBERS}")),
    ("donated arguments", re.compile(rf"\bdonated \(arguments whose buffers the outputs reuse\) {_NUMBERS}")),
    (
        "collectives",
        re.compile(rf"\b(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)\S* {_NUMBERS}"),
    ),
    ("kept alive per step", re.compile(r"XLA tensors|host objects|device footprint|left more alive")),
    ("step graph temp and peak", re.compile(rf"\b(temp|peak) {_NUMBERS}")),
    ("shardings", re.compile(r"\{[^}]*\} -> \{|sharding drift|: gone|: new, ")),
    # cases/test_costs.py's self-checks: a change they plant did not do on this build what it should
    ("self-checks", re.compile(r"\bthe planted change \(")),
]
_DIRECTIONS = {
    "shardings": "changed",
    "self-checks": "found their planted change acting otherwise",
    "native stack judge": "did not run",
}
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _amount(text: str) -> float:
    number, _, unit = text.replace(" ", " ").partition(" ")
    if not unit and text[-1:] == "B":
        number, unit = text[:-3] if text.endswith("iB") else text[:-1], text[-3:] if text.endswith("iB") else "B"
    return float(number) * _UNITS.get(unit.strip(), 1)


def classify(item: str) -> tuple[str, str]:
    """(kind of figure, direction): ("step graph outputs", "grew"); ("other", first words) otherwise."""
    for kind, pattern in KINDS:
        found = pattern.search(item)
        if not found:
            continue
        groups = found.groupdict()
        if groups.get("before") and groups.get("after"):
            try:
                before, after = _amount(groups["before"]), _amount(groups["after"])
            except ValueError:  # not a figure the harness printed: a case's own words
                continue
            return kind, "grew" if after > before else "went down" if after < before else "moved"
        return kind, _DIRECTIONS.get(kind, "grew")
    return "other", " ".join(item.split()[:8])[:HEADLINE_CHARACTERS]


def cause_of(case: FailedCase) -> tuple[str, str]:
    """The case's first cause, in KINDS' order (a split graph before the sharding lines it renumbers)."""
    found = [classify(item) for item in case.items] or [("other", "no item recorded")]
    order = {kind: index for index, (kind, _) in enumerate(KINDS)}
    growths = [f for f in found if f[1] != "went down"] or found  # a decrease never leads a growth
    return min(growths, key=lambda f: order.get(f[0], len(order)))


def group(cases: Iterable[FailedCase]) -> list[tuple[tuple[str, str], list[FailedCase]]]:
    groups: dict[tuple[str, str], list[FailedCase]] = collections.defaultdict(list)
    for case in cases:
        groups[cause_of(case)].append(case)
    return sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))


def lines(cases: list[FailedCase], update_hint: str = "") -> list[str]:
    """The findings, each: `N case(s): <kind> <direction>` then its diagnosis, what else moved, its cases."""
    out: list[str] = []
    for (kind, direction), members in group(cases):
        loops = sum(max(1, len(c.costs)) for c in members)
        headline = (
            f"{len(members)} case(s): {kind} {direction}" if kind != "other" else f"{len(members)} case(s): {direction}"
        )
        out.append(headline + (f" ({loops} loop(s))" if kind != "other" and loops != len(members) else ""))
        out += [f"  {line}" for line in diagnose(kind, direction, members)]
        bugs = sorted({c.known_bug for c in members if c.known_bug})
        if bugs:
            out.append(
                f"  in case(s) that also reproduced their known bug: {', '.join(bugs)} (the bug does not excuse this)"
            )
        example = next((item for item in members[0].items if classify(item) == (kind, direction)), "")
        if example:
            out.append(f"  e.g. {members[0].case}: {example[:EXAMPLE_CHARACTERS]}")
        beside = _beside(members, (kind, direction))
        if beside:
            out.append(f"  beside it: {beside}")
        names = [c.case for c in members]
        out.append(
            "  cases: "
            + ", ".join(names[:MAX_CASES_SHOWN])
            + (f" and {len(names) - MAX_CASES_SHOWN} more" if len(names) > MAX_CASES_SHOWN else "")
        )
    # The update is offered only where a figure moved: it cannot answer an exception or an assertion.
    if update_hint and any(kind != "other" for (kind, _), _members in group(cases)):
        out.append(f"if these changes are intended (and only then): {update_hint}")
    return out


def _beside(members: list[FailedCase], cause: tuple[str, str]) -> str:
    """The other kinds of figure that moved in these cases, a decrease beside a growth said as such."""
    counts = collections.Counter(
        found
        for c in members
        for found in {classify(item) for item in c.items}
        if found != cause and found[0] != "other"
    )
    parts = [f"{kind} {direction} in {n}" for (kind, direction), n in sorted(counts.items(), key=lambda p: -p[1])]
    if any(direction == "went down" for _, direction in counts) and cause[1] == "grew":
        parts.append("(a figure that went down beside a growth is not an improvement)")
    return ", ".join(parts)


def diagnose(kind: str, direction: str, members: list[FailedCase]) -> list[str]:
    if (kind, direction) in (("step graph outputs", "grew"), ("donated arguments", "went down")):
        return donation_lost(members)
    if kind in ("compilations per step", "executions per step") and direction == "grew":
        return graph_split(members)
    if kind == "native memory per step":
        return native_leak(members)
    return []


def _loops(members: list[FailedCase]) -> Iterable[tuple[FailedCase, str, Mapping[str, Any], Mapping[str, Any]]]:
    for case in members:
        for label, signature in sorted(case.costs.items()):
            base = case.base_costs.get(label)
            if isinstance(signature, Mapping) and isinstance(base, Mapping):
                yield case, label, base, signature


def _graph_memory(signature: Mapping[str, Any], field: str) -> dict[str, int]:
    graphs = signature.get("graphs") or {}
    return {
        name: g["memory"][field]
        for name, g in graphs.items()
        if isinstance(g, Mapping) and isinstance(g.get("memory"), Mapping) and isinstance(g["memory"].get(field), int)
    }


def donation_lost(members: list[FailedCase]) -> list[str]:
    """Outputs that grew by the parameters' bytes: the updated parameters are no longer written
    into their input buffers (aliased, donated), so a device holds old and new ones. Said from the
    step modules themselves where both runs' records keep their aliasing (harness.hlo's reader)."""
    fewer, compared = _aliases_lost(members)
    matched, measured, example = _bytes_matched(members)
    if fewer:
        said = "; the outputs grew by the parameters' bytes" + (f" ({example})" if example else "")
        return [
            f"diagnosis: donation lost: {fewer[0]}, in {len(fewer)} of {compared} compared step module(s)"
            + (said if matched else "")
            + ": the step no longer aliases the updated parameters onto their input buffers, so a device holds "
            "old and new parameters during every step"
        ]
    if not measured:
        return []
    if matched == measured:
        aliased = " (the records keep no step module aliasing to confirm it)" if not compared else ""
        return [
            f"diagnosis: donation lost? in {matched} of {measured} loop(s) the outputs grew by the parameters' "
            f"bytes ({example}): the step no longer aliases the updated parameters onto their input buffers, "
            f"so a device holds old and new parameters during every step{aliased}"
        ]
    return [f"the outputs grew by the parameters' bytes in {matched} of {measured} loop(s) only"]


def _aliases_lost(members: list[FailedCase]) -> tuple[list[str], int]:
    """Each step module that aliases fewer parameters than the base run's of the same name, said as
    "the build's step module aliases 0 of 12 parameters (base: 12)" (the case, loop and graph after
    it), and how many modules both runs' records keep the aliasing of."""
    fewer, compared = [], 0
    for case, label, base, this in _loops(members):
        before, after = _graph_aliases(base), _graph_aliases(this)
        for graph in sorted(set(before) & set(after)):
            compared += 1
            (donated_a, count_a), (donated_b, count_b) = before[graph], after[graph]
            if donated_b < donated_a:
                was = f"{donated_a}" + (f" of {count_a}" if count_a != count_b else "")
                fewer.append(
                    f"the build's step module aliases {donated_b} of {count_b} parameters (base: {was}) "
                    f"({case.case} {label} {graph})"
                )
    return fewer, compared


def _graph_aliases(signature: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    graphs = signature.get("graphs") or {}
    found = {}
    for name, graph in graphs.items():
        aliases = graph.get("aliases") if isinstance(graph, Mapping) else None
        if isinstance(aliases, Mapping) and all(isinstance(aliases.get(k), int) for k in ("donated", "parameters")):
            found[name] = (aliases["donated"], aliases["parameters"])
    return found


def _bytes_matched(members: list[FailedCase]) -> tuple[int, int, str]:
    """Loops whose outputs grew by the parameters' bytes, loops whose outputs grew, an example."""
    matched, measured, example = 0, 0, ""
    for case, label, base, this in _loops(members):
        parameters = (this.get("memory") or {}).get("parameters")
        before, after = _graph_memory(base, "outputs"), _graph_memory(this, "outputs")
        for graph in sorted(set(before) & set(after)):
            grew = after[graph] - before[graph]
            if grew <= 0 or not isinstance(parameters, int) or parameters <= 0:
                continue
            measured += 1
            if abs(grew - parameters) <= parameters * _BYTES_TOLERANCE:
                matched += 1
                example = example or f"{case.case} {label} {graph}: outputs +{grew:,} B, parameters {parameters:,} B"
    return matched, measured, example


def graph_split(members: list[FailedCase]) -> list[str]:
    """Compilations and executions per step that went up: the step graph is cut into more graphs."""
    shown = []
    for case, label, base, this in _loops(members):
        warmup = this.get("warmup", 2)
        steps_before, steps_after = base.get("steps") or [], this.get("steps") or []
        if len(steps_before) > warmup and len(steps_after) > warmup:
            b, a = steps_before[warmup], steps_after[warmup]
            shown.append(f"{case.case} {label}: executions per step {b.get('executions')} -> {a.get('executions')}")
    lines = [
        "diagnosis: the step graph split: each step now runs more graphs (a sync or a graph break inside the "
        "step); the step graph's parameters are renumbered, so their sharding lines in these cases follow from "
        "the split (matched by sharding, never by position: see basecompare)"
    ]
    return lines + [f"  {line}" for line in shown[:3]]


_PER_STEP = re.compile(rf"native heap \(malloc in use\) \+(?P<amount>{_NUMBER} ?[KMG]?i?B) per step")


def native_leak(members: list[FailedCase]) -> list[str]:
    """Native heap growth per step, loop by loop: about one rate everywhere is one allocation kept
    per call of something every loop calls once per step; rates in ratio are calls per step, which
    the records count for torch_xla's SPMD API (harness.metering.spmdcalls): a rate that is one amount per
    call of one API in every loop names that API."""
    rates, calls = [], []
    for case in members:
        found = next((m for m in map(_PER_STEP.search, case.items) if m), None)
        if found:
            rates.append(_amount(found.group("amount")))
            calls.append(_calls_of(case))
    if not rates:
        return []
    shown = f"+{_kib(min(rates))}" + (f" to +{_kib(max(rates))}" if max(rates) > min(rates) else "")
    ratios = sorted({round(rate / min(rates), 1) for rate in rates}) if min(rates) > 0 else []
    head = f"diagnosis: native memory kept on every step, {shown} per step across {len(rates)} loop(s)"
    per_call = per_call_of(rates, calls)
    if per_call:
        head += f", {per_call}"
    elif max(rates) <= min(rates) * 1.15:
        head += ": about the same amount in every loop, one allocation kept per call of something each step calls once"
    else:
        head += (
            f": rates x{', x'.join(map(str, ratios[:6]))} of the least, in proportion to how often each step "
            "calls what leaks (compare the loops' spmd calls per step)"
        )
    return [head, "  memray's stacks (under each case) show only allocations it tracks: read the rate, not the stack"]


def _calls_of(case: FailedCase) -> dict[str, int]:
    """The SPMD calls per step of the case's loop (its first loop that counted any)."""
    for _label, signature in sorted(case.costs.items()):
        calls = signature.get("spmd_calls") if isinstance(signature, Mapping) else None
        if isinstance(calls, Mapping) and calls:
            return {k: v for k, v in calls.items() if isinstance(k, str) and isinstance(v, int) and v > 0}
    return {}


PER_CALL_SPREAD = 0.2  # a loop's amount per call within 20% of the median fits (healthy drift is tens of KiB)


def per_call_of(rates: list[float], calls: list[dict[str, int]]) -> str:
    """ "1 to 4 mark_sharding calls per step: ~256.0 KiB per call" where, in two thirds of the loops or
    more (two at least), the rate divided by the loop's calls of one API is about one amount (within
    PER_CALL_SPREAD of their median); "" where no API's calls explain the rates. Not every loop: a
    loop whose calls the meter did not count (a compiled step) or whose healthy drift is large would
    hide a cause that 19 of 21 loops name."""
    needed = max(2, -(-2 * len(rates) // 3))
    best: tuple[int, str, list[float], list[int]] | None = None
    for api in sorted({api for c in calls for api in c}):
        counted = [(rate / c[api], c[api]) for rate, c in zip(rates, calls) if c.get(api)]
        if not counted:
            continue
        middle = statistics.median(each for each, _ in counted)
        fits = [(each, n) for each, n in counted if abs(each - middle) <= PER_CALL_SPREAD * middle]
        if len(fits) >= needed and (best is None or len(fits) > best[0]):
            best = (len(fits), api, [each for each, _ in fits], sorted({n for _, n in fits}))
    if best is None:
        return ""
    fitted, api, each, counts = best
    said = f"{counts[0]}" + (f" to {counts[-1]}" if len(counts) > 1 else "")
    plural = "s" if counts[-1] > 1 else ""
    line = f"{said} {api} call{plural} per step: ~{_kib(sum(each) / len(each))} per call"
    return line + (f" (in {fitted} of {len(rates)} loops)" if fitted < len(rates) else "")


def _kib(count: float) -> str:
    return f"{count / 1024:.1f} KiB" if count < 1 << 20 else f"{count / (1 << 20):.1f} MiB"


BESIDE_A_GROWTH = "went down beside a growth: not an improvement"


def no_improvement_beside_growth(changes: list[Any]) -> list[Any]:
    """harness.costs.CostChange list: where a figure grew beyond the band, a figure that went down
    beside it is not called an improvement (build A's peak and temp went down as its outputs grew
    by the parameters' bytes: the growth is the finding, the decrease its side effect)."""
    if not any(c.fails for c in changes):
        return changes
    return [dataclasses.replace(c, judgement=BESIDE_A_GROWTH) if c.judgement == "improvement" else c for c in changes]


def from_record(record: Any, items: list[str], base_record: Any = None) -> FailedCase:
    """A FailedCase from a harness.records.results.CaseRecord (and its base run's record)."""
    return FailedCase(
        case=record.nodeid,
        items=items,
        costs=record.costs or {},
        base_costs=(base_record.costs or {}) if base_record is not None else {},
        known_bug=record.known_bug if "and besides" in (record.reason or "") else None,
    )
