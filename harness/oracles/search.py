"""Parent side: the nightly search. Hypothesis draws batches of programs until the time budget is
spent; a failing batch is shrunk (hypothesis drops the passing programs and simplifies the failing
one), the smallest program is rerun twice in new children to confirm it fails the same way, and
each distinct finding is kept with its standalone script (harness.oracles.repro).

Each round is a separate hypothesis run with its own seed, so one finding does not end the
search: the next round draws afresh, and a finding already kept (`finding_key`) is not kept, nor
shrunk, twice. A failure a known-bug registry entry explains (carried by the build the children
run, its signature matching the failure's text, or for wrong numbers its class in
harness.oracles.knownclasses agreeing once the class's condition is taken away: `known_bugs`) is
counted and passed over: found again it is no finding (a nightly false alarm on every release that
carries it), and shrinking it would spend the round a new bug needs.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from harness.oracles import generate, knownclasses, repro, runner
from harness.registry import KnownBug

# A failing program and its verdict -> the registry entry that explains it, or None.
Explains = Callable[[dict[str, Any], dict[str, str]], str | None]


def finding_key(program: dict[str, Any], verdict: dict[str, str]) -> tuple[str, ...]:
    """What makes two findings the same: a crash's or an error's message with its numbers (times,
    addresses, line numbers) left out; a mismatch's set of ops."""
    if verdict["status"] == "mismatch":
        return ("mismatch", *sorted({op["op"] for op in program["ops"]}))
    message = verdict["detail"].splitlines()[0] if verdict["detail"] else ""
    message = message.split("] ", 1)[-1]  # after a C++ log prefix "F external/...h:127] "
    return verdict["status"], re.sub(r"[0-9]+", "N", message)[:200]


class _Failed(AssertionError):
    """Raised inside the property so that hypothesis shrinks; carries nothing itself."""


@dataclasses.dataclass
class Finding:
    program: dict[str, Any]
    verdict: dict[str, str]
    confirmations: list[str]  # the statuses of the reruns of the shrunk program

    @property
    def deterministic(self) -> bool:
        return all(status == self.verdict["status"] for status in self.confirmations)

    @property
    def key(self) -> tuple[str, ...]:
        return finding_key(self.program, self.verdict)

    def text(self) -> str:
        again = ", ".join(self.confirmations)
        note = "deterministic" if self.deterministic else "NOT deterministic"
        return f"[{note}: reruns gave {again}]\n{repro.report(self.program, self.verdict)}"


@dataclasses.dataclass
class SearchSummary:
    programs: int = 0  # programs checked while drawing (not counting shrinking)
    rounds: int = 0
    # Round r draws with hypothesis seed `seed + r`: a new seed each run (the clock), printed, so
    # that a night's search explores new programs and can still be repeated.
    seed: int = dataclasses.field(default_factory=lambda: int(time.time()) % 1_000_000_007)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    known: dict[str, int] = dataclasses.field(default_factory=dict)  # registry entry -> programs it explained

    def line(self) -> str:
        known = ", ".join(f"{entry} x{n}" for entry, n in sorted(self.known.items()))
        return (
            f"differential search: {self.programs} programs in {self.rounds} rounds (seed {self.seed}), "
            f"{len(self.findings)} findings" + (f"; known bugs passed over: {known}" if known else "")
        )


def known_bugs(
    spmd: Any, entries: Sequence[KnownBug], holds: Callable[[dict[str, Any]], bool] | None = None
) -> Explains:
    """The entry among `entries` carried by the torch_xla the children run (the last version a child
    reported) that explains a failing program, by id: its signature matches the verdict's text, or
    the program is of the entry's class and `holds` once the class's condition is taken away (by
    default: agrees with the CPU in a new child; the metamorphic oracle passes its relation). None
    before any child said its version, and for a failure no carried entry explains."""

    def agrees(variant: dict[str, Any]) -> bool:
        return bool(runner.check_programs(spmd, [variant], batch=1, fresh=True)[0]["status"] == "ok")

    def explains(program: dict[str, Any], verdict: dict[str, str]) -> str | None:
        version = next((r.torch_xla for r in reversed(spmd.results) if r.torch_xla), None)
        if version is None:
            return None
        carried = {entry.id: entry for entry in entries if entry.carried_by_release(version)}
        detail = verdict.get("detail") or ""
        for entry in carried.values():
            if entry.matching_signature(detail):
                return entry.id
        for known in knownclasses.candidates(program, verdict, carried.__contains__):
            if (holds or agrees)(known.without_condition(program)):
                return known.entry
        return None

    return explains


def registry_entries(config: Any) -> list[KnownBug]:
    """The entries of the registry the run judges with (--spmd-known-bugs, else the harness's own)
    that may explain a drawn program's failure (drawn_programs = true)."""
    from harness.config import options  # the pytest side's option table; cases ask through here
    from harness.registry import REGISTRY_PATH, load_registry

    entries = load_registry(Path(options.value(config, "spmd_known_bugs") or REGISTRY_PATH)).values()
    return [entry for entry in entries if entry.drawn_programs]


def budget(config: Any) -> float:
    """--spmd-fuzz-budget (its ini key, its default): how long the nightly search may draw programs."""
    from harness.config import options  # the pytest side's option table; cases ask through here

    return float(options.value(config, "spmd_fuzz_budget"))


def search(
    spmd: Any,
    devices: int,
    budget_s: float,
    batch: int = 8,
    examples: int = 6,
    fault: str | None = None,
    explains: Explains | None = None,
) -> SearchSummary:
    """Draw until budget_s is spent; fault (harness.oracles.faults) only to show the search can fail;
    explains (known_bugs): the failures the registry already names, passed over."""
    summary = SearchSummary()
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        found = _round(spmd, devices, summary, (batch, examples), deadline, fault, explains)
        summary.rounds += 1
        if found is not None and found.key not in {f.key for f in summary.findings}:
            summary.findings.append(found)
    return summary


def _round(
    spmd: Any,
    devices: int,
    summary: SearchSummary,
    sizes: tuple[int, int],
    deadline: float,
    fault: str | None,
    explains: Explains | None,
) -> Finding | None:
    batch, examples = sizes
    last_failure: dict[str, Any] = {}

    @hypothesis_seed(summary.seed + summary.rounds)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(st.lists(generate.programs(devices), min_size=1, max_size=batch))
    def property_all_agree(programs: list[dict[str, Any]]) -> None:
        if time.monotonic() > deadline and not last_failure:
            return  # the budget is spent: pass the rest of this round without running it
        if not last_failure:
            summary.programs += len(programs)  # checked while drawing, not while shrinking
        verdicts = runner.check_programs(spmd, programs, fault=fault, batch=len(programs))
        known = {finding.key for finding in summary.findings}
        for program, verdict in zip(programs, verdicts, strict=True):
            # A crash or error already found this run is not found again (its shrinking is slow:
            # a new child per step); a mismatch is, since its key needs the shrunk program.
            if verdict["status"] == "ok":
                continue
            entry = explains(program, verdict) if explains is not None else None
            if entry is not None:  # a known bug, found again: counted while drawing, never shrunk
                if not last_failure:
                    summary.known[entry] = summary.known.get(entry, 0) + 1
                continue
            if finding_key(program, verdict) not in known:
                last_failure.update(program=program, verdict=verdict)  # the last one is the shrunk one
                raise _Failed(verdict["status"])

    try:
        property_all_agree()
    except _Failed:
        program = last_failure["program"]
        # In new processes: a failure that needs the programs a reused child ran before is not this
        # program's (seen once: a mismatch of an unsharded tanh that a fresh process computes right).
        reruns = [
            runner.check_programs(spmd, [program], fault=fault, batch=1, fresh=True)[0]["status"] for _ in range(2)
        ]
        return Finding(program, last_failure["verdict"], reruns)
    return None
