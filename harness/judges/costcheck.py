"""The plugin's side of cost signatures: steady state, the cost baseline, records and dumps.

Called by harness.plugin next to the sharding comparison, so the order is the same: the registry
judges first (an xfail is never compared), then shardings, then costs. For every case whose body
recorded signatures (harness.stepcosts):

1. Steady state, whatever the baseline says: a step after the loop's warm-up that compiled a new
   graph fails the case, naming the step and what differs between the two graphs; so does one
   that left more XLA tensors, device bytes or host objects alive than the step before, naming
   what stayed alive.
2. The cost baseline (harness.costbaseline): a change fails on the baseline's release line, one
   line per item; elsewhere it is reported in a section of the test's report and in the record.
3. The partitioned modules the signatures were read from reach the results folder
   (`costs/<case>__<loop>_<graph>.after_optimizations.txt`) only when the case failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import costs
from harness.baselinefile import BaselineSession
from harness.config import options
from harness.costbaseline import CostBaseline
from harness.isolation.backend import Backend
from harness.isolation.case import CaseResult, SpmdRunner
from harness.judges import checked
from harness.records import results, runfolder

SESSION_KEY = pytest.StashKey["CostSession"]()
SIGNATURES_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()
DUMPS_KEY = pytest.StashKey[dict[str, str]]()
CHANGES_KEY = pytest.StashKey[list[str]]()
NO_COST_CHECK_MARKER = (
    "no_cost_check(reason): neither steady state nor the cost baseline judges this case "
    "(a self-test whose bodies record a cost regression on purpose)"
)


class CostSession(BaselineSession[CostBaseline]):
    def __init__(self, config: pytest.Config, backend: Backend) -> None:
        option = options.value(config, CostBaseline.OPTION)
        super().__init__(config, backend, CostBaseline, option, config.getoption(options.UPDATE_COSTS))


def configure(config: pytest.Config, backend: Backend, load: bool) -> None:
    """At configure time (the xdist controller too): a damaged baseline is a usage error now."""
    config.addinivalue_line("markers", NO_COST_CHECK_MARKER)
    session = CostSession(config, backend)
    config.stash[SESSION_KEY] = session
    if load:
        session.baseline()


def _signatures(item: pytest.Item, results_of_runs: list[CaseResult]) -> dict[str, dict[str, Any]]:
    """Every loop's signature the case's bodies recorded; their dumps move to the item's stash."""
    signatures: dict[str, dict[str, Any]] = {}
    dumps: dict[str, str] = {}
    for result in results_of_runs:
        values = result.values
        dumps.update(values.pop(costs.DUMPS_VALUE, None) or {})
        for label, signature in (values.get(costs.SIGNATURES_VALUE) or {}).items():
            signatures[label] = costs.check_signature(signature, f"cost signature {label!r} from the case's child")
    item.stash[DUMPS_KEY] = dumps
    item.stash[SIGNATURES_KEY] = signatures
    return signatures


def judge(
    item: pytest.Item, report: pytest.TestReport, runner: SpmdRunner | None, version: str | None, body_passed: bool
) -> None:
    """Steady state, then the baseline, for a case whose bodies passed and that is not an xfail."""
    session: CostSession = item.config.stash[SESSION_KEY]
    if runner is None:
        return
    try:
        signatures = _signatures(item, runner.results)  # a failing body's dumps are kept too
    except costs.CostReadError as exc:
        if body_passed and not hasattr(report, "wasxfail"):
            _fail(report, f"cost signature unreadable: {exc}")
        return
    if not body_passed or hasattr(report, "wasxfail") or report.skipped or item.get_closest_marker("no_cost_check"):
        return
    if not signatures:
        # A case that measures nothing is not judged, unless the baseline measures it: a body that
        # stopped running its meter, or wiped the harness's key, reads as "no longer measured".
        base = None if session.update else session.baseline()
        if base is None or not base.compare(results.item_case_id(item), signatures):
            return
    problems = [line for label, sig in sorted(signatures.items()) for line in costs.steady_state_problems(sig, label)]
    if problems:
        item.stash[CHANGES_KEY] = [f"steady state: {p}" for p in problems]
        _fail(
            report,
            "steady state: a step after the warm-up compiled a new graph (every step pays a compilation) "
            "or left more alive than the step before (every step leaks):\n" + "\n".join(f"  {p}" for p in problems),
        )
    case = results.item_case_id(item)
    if session.update:
        if not problems and report.passed:
            session.updates.observe(item.nodeid, case, signatures, version)  # kept if its teardown passes (settle)
        return
    base = session.baseline()
    if base is None:
        return
    changes = base.compare(case, signatures)
    if changes is None:
        session.cases_without_entry.append(case)
        return
    checked.mark(report, checked.COST_BASELINE)
    if not changes:
        return
    item.stash[CHANGES_KEY] = item.stash.get(CHANGES_KEY, []) + [str(c) for c in changes]
    moves = costs.listed(changes)  # bytes within the band, improvements: listed, never failed
    if moves:
        report.sections.append(
            (
                f"cost byte moves within the band ({costs.band_text()}) or improvements (listed, not failed)",
                "\n".join(f"  {c}" for c in moves),
            )
        )
    lines = [str(c) for c in costs.failing(changes)]
    if not lines:
        return
    listing = "\n".join(f"  {line}" for line in lines)
    if base.on_release_line(version) and report.passed:
        _fail(
            report,
            f"cost drift: {len(lines)} item(s) differ from {base.path.name} (taken on torch_xla "
            f"{base.torch_xla}; this run: {version}):\n{listing}\nIf the change is intended, rewrite the "
            f"entry: {session.rewrite_command(item, base.path)}",
        )
    else:
        why = (
            f"torch_xla {version} is not on {base.torch_xla}'s release line"
            if not base.on_release_line(version)
            else "the case failed already"
        )
        report.sections.append((f"cost changes (reported, not failed: {why})", listing))


def _fail(report: pytest.TestReport, message: str) -> None:
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:  # failed already (sharding drift): the cost finding is shown next to it
        report.sections.append(("cost check", message))


def record_fields(item: pytest.Item) -> dict[str, Any]:
    """The record's `costs` (comparable signatures) and `cost_changes` (lines, failed or reported)."""
    signatures = item.stash.get(SIGNATURES_KEY, {})
    changes = item.stash.get(CHANGES_KEY, [])
    return {
        "costs": {label: costs.with_native(sig) for label, sig in signatures.items()},
        "cost_changes": list(changes),
    }


def keep_dumps(folder: Path, item: pytest.Item, failed: bool) -> None:
    """The partitioned modules of a failing case, for reading what the partitioner did."""
    if failed:
        dumps = item.stash.get(DUMPS_KEY, {})
        results.keep_texts(
            folder / runfolder.COST_DUMPS_DIR, results.item_case_id(item), dumps, ".after_optimizations.txt"
        )
