"""The plugin's side of cost signatures: steady state, the cost baseline, records and dumps.

The third judge (harness.judges.judging): the registry judges first, then shardings, then costs.
A case that reproduced its known bug (an xfail) is held to the figures its bug does not name
(harness.judges.excused) and to the cost baseline; a change there fails it. For every case whose body recorded signatures (harness.stepcosts):

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

import functools
import importlib
from pathlib import Path
from typing import Any

import pytest

from harness import costs, findings
from harness.config import options
from harness.costbaseline import CostBaseline
from harness.isolation.backend import Backend
from harness.judges import excused
from harness.judges.baselinestate import BaselineCheck
from harness.judges.judging import Judge, JudgedCase, fail_besides, is_xfail, reproduced_bug
from harness.records import results, runfolder

COST_CHECK_SECTION = "cost check"  # a cost finding beside a failure another judge found (harness.run.failedlines)
NO_COST_CHECK_MARKER = (
    "no_cost_check(reason): neither steady state nor the cost baseline judges this case "
    "(a self-test whose bodies record a cost regression on purpose)"
)


class CostJudge(BaselineCheck[CostBaseline], Judge):
    CHECKED = "cost baseline"

    def __init__(self, config: pytest.Config, backend: Backend) -> None:
        """At configure time (the xdist controller too)."""
        config.addinivalue_line("markers", NO_COST_CHECK_MARKER)
        option = options.value(config, CostBaseline.OPTION)
        super().__init__(config, backend, CostBaseline, option, config.getoption(options.UPDATE_COSTS))

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        """Steady state, then the baseline, for a case whose bodies passed and that is not an
        xfail; the signatures, the dumps and the lines found go on the case."""
        if case.runner is None:
            return
        if case.cost_read_error is not None:  # read with the case (JudgedCase.of)
            if case.body_passed and not is_xfail(report):
                _fail(case, report, f"cost signature unreadable: {case.cost_read_error}")
            return
        if case.has_marker("no_cost_check"):
            return
        entry = reproduced_bug(case, report)
        if entry is not None and self.update:
            if case.costs and not self._besides(case, with_baseline=False):  # kept if its teardown passes
                self.updates.observe(case.item.nodeid, case.case_id, case.costs, case.torch_xla)
        elif entry is not None:
            fail_besides(case, report, entry, self._besides(case), "its steady state and the cost baseline")
        if not case.body_passed or is_xfail(report) or report.skipped:
            return
        signatures = case.costs
        if not signatures:
            # A case that measures nothing is not judged, unless the baseline measures it: a body that
            # stopped running its meter, or wiped the harness's key, reads as "no longer measured".
            base = None if self.update else self.baseline()
            if base is None or not base.compare(case.case_id, signatures):
                return
        problems = [
            line for label, sig in sorted(signatures.items()) for line in costs.steady_state_problems(sig, label)
        ]
        missing = [line for label, sig in sorted(signatures.items()) if (line := costs.stack_judge_missing(sig, label))]
        if missing and not _memray_imports():  # a long loop's stack judge must have run where memray imports
            missing = []
        problems += missing
        if problems:
            case.cost_changes = [f"steady state: {p}" for p in problems]
            # The cause first (a FAILED line shows the first line): the rule it breaks after it.
            rule = (
                "(steady state: a step after the warm-up that compiled a new graph pays a compilation every step; "
                "one that left more alive than the step before leaks every step)"
                if len(missing) < len(problems)
                else ""  # only an unjudged window: the rule of compilations and leaks is not what broke
            )
            _fail(case, report, f"steady state: {problems[0]}\n" + "".join(f"  {p}\n" for p in problems[1:]) + rule)
        if self.update:
            if not problems and report.passed:
                # kept if its teardown passes (settle)
                self.updates.observe(case.item.nodeid, case.case_id, signatures, case.torch_xla)
            return
        base = self.baseline()
        if base is None:
            return
        changes = base.compare(case.case_id, signatures)
        changes = None if changes is None else findings.no_improvement_beside_growth(changes)
        if changes is None:
            self.note_without_entry(report, case.case_id)
            return
        self.held(report)
        if changes:
            case.cost_changes += [str(c) for c in changes]
            self._report_changes(case, report, base, changes)

    def _besides(self, case: JudgedCase, with_baseline: bool = True) -> list[str]:
        """A reproduced known bug's case: the steady-state figures its entry does not name, and the
        cost baseline's failing items."""
        lines = [
            f"steady state: {problem}"
            for label, signature in sorted(case.costs.items())
            for problem in excused.unexcused_problems(signature, label, case.entries)
        ]
        base = self.baseline() if with_baseline else None
        # As for a passing case: only on the baseline's release line does a difference fail. Off it
        # a known bug often stops the loop earlier than on the baseline's release, where it passes
        # or fails later ("step0: no longer run" on 2.4.0 against 2.9.0's entry was a false alarm).
        if base is not None and case.costs and base.on_release_line(case.torch_xla):
            changes = base.compare(case.case_id, case.costs) or []
            lines += [f"{c} (cost baseline {base.path.name})" for c in costs.failing(changes)]
        case.cost_changes += lines
        return lines

    def _report_changes(
        self, case: JudgedCase, report: pytest.TestReport, base: CostBaseline, changes: list[costs.CostChange]
    ) -> None:
        moves = costs.listed(changes)  # bytes within the band, improvements: listed, never failed
        if moves:
            case.show(
                f"cost byte moves within the band ({costs.band_text()}) or improvements (listed, not failed)",
                "\n".join(f"  {c}" for c in moves),
            )
        lines = [str(c) for c in costs.failing(changes)]
        if not lines:
            return
        listing = "\n".join(f"  {line}" for line in lines)
        version = case.torch_xla
        if base.on_release_line(version):
            # A case that failed already (its shardings drifted, its body raised) fails on this too:
            # shown beside its failure as the cost check, which its FAILED line and findings read
            # (a split step graph leads the sharding drift of the parameters it renumbered).
            _fail(
                case,
                report,
                f"cost drift: {len(lines)} item(s) differ from {base.path.name} (taken on torch_xla "
                f"{base.torch_xla}; this run: {version}):\n{listing}\nIf the change is intended, rewrite the "
                f"entry: {self.rewrite_command(case.item, base.path)}",
            )
        else:
            why = f"torch_xla {version} is not on {base.torch_xla}'s release line"
            case.show(f"cost changes (reported, not failed: {why})", listing, reported_only=True)

    def record_fields(self, case: JudgedCase) -> dict[str, Any]:
        """The record's `costs` (comparable signatures) and `cost_changes` (lines, failed or reported)."""
        return {"costs": case.recorded_costs(), "cost_changes": list(case.cost_changes)}

    def keep_files(self, folder: Path, case: JudgedCase, failed: bool) -> None:
        """The partitioned modules of a failing case, for reading what the partitioner did."""
        if failed:
            dumps = folder / runfolder.COST_DUMPS_DIR
            results.keep_texts(dumps, case.case_id, case.cost_dumps, ".after_optimizations.txt")
            results.keep_captures(folder / runfolder.MEMRAY_DIR, case.case_id, case.memray_captures)


@functools.cache
def _memray_imports() -> bool:
    """memray imports where this pytest runs, so the case's process, of the same environment, could
    import it (imported, not only found: an installation that fails to import is not memray)."""
    try:
        importlib.import_module("memray")
    except Exception:  # noqa: BLE001 - any failure to import is "not here"
        return False
    return True


def _fail(case: JudgedCase, report: pytest.TestReport, message: str) -> None:
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:  # failed already (sharding drift): the cost finding is shown next to it
        case.show(COST_CHECK_SECTION, message)
