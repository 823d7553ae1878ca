"""The one interface every judge of a case has, and the case they all judge (JudgedCase).

A judge takes the judged case and pytest's report of its call, may change the report's outcome
(a reproduced known bug becomes an xfail, a drift a failure) and leaves its finding on the case,
nowhere else: the case's record is written from the case alone (harness.run.writing), and a
later judge reads an earlier one's finding from the case (the base run's judge reads the
registry's judgement and the cost judge's signatures there). The run holds its judges in the
order they judge (HarnessSession.judges): the known-bug registry first, then the sharding
baseline, the cost baseline and the base build's run. A reproduced known bug (an xfail) excuses
its own failure only: the cost judge and the base run's judge still hold the case to what else it
measured, and a change there fails it (fail_besides).

    judge(case, report)      every process that runs cases, once per case
    collect(report)          the process that owns the run: each case's report, whichever
                             process judged it (a finding that travels on the report)
    finish(pytest_session)   every process, at the end of the run
    summarise(terminal)      the process that owns the run: its section at the end
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harness.errors import CaseError
from harness.isolation.case import CaseResult, SpmdRunner
from harness.records import results
from harness.registry import Judgement, JudgementKind, KnownBug

RUNNER_KEY = pytest.StashKey[SpmdRunner]()  # the case's runner, set by the spmd fixture
ENTRIES_KEY = pytest.StashKey[list[KnownBug]]()  # the entries the case names, read at collection


@dataclasses.dataclass
class JudgedCase:
    """One case as the judges see it, gathered once (after its call, or at a failed set-up), and
    what each judge found."""

    item: pytest.Item
    case_id: str  # the stable name records and baselines use (results.case_id)
    runner: SpmdRunner | None  # None: the case never reached the spmd fixture
    entries: list[KnownBug]  # the known_bug entries it names
    torch_xla: str | None  # what its children ran: the last body that reported a version
    shardings: dict[str, str]  # what its bodies recorded (a later body's tensor wins)
    evidence: str | None  # what its failure says, cause first (None: the call raised nothing)
    body_passed: bool  # the call raised nothing (before any judge changed its report)
    # The judges' findings, each written by one judge:
    judgement: Judgement | None = None  # the registry's, for a case that names entries
    sharding_changes: list[str] = dataclasses.field(default_factory=list)  # against its baseline entry
    costs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # each loop's cost signature
    cost_dumps: dict[str, str] = dataclasses.field(default_factory=dict)  # the partitioned modules read
    memray_captures: dict[str, str] = dataclasses.field(default_factory=dict)  # base64, by loop and step
    cost_changes: list[str] = dataclasses.field(default_factory=list)  # steady state and baseline lines

    @classmethod
    def of(cls, item: pytest.Item, call: pytest.CallInfo[None] | None = None) -> JudgedCase:
        runner = item.stash.get(RUNNER_KEY, None)
        ran = runner.results if runner else []
        reported = [r.torch_xla for r in ran if r.torch_xla]
        shardings: dict[str, str] = {}
        for result in ran:
            shardings.update(result.shardings)
        return cls(
            item=item,
            case_id=results.item_case_id(item),
            runner=runner,
            entries=item.stash.get(ENTRIES_KEY, []),
            torch_xla=reported[-1] if reported else None,
            shardings=shardings,
            evidence=evidence_of(call) if call is not None else None,
            body_passed=call is not None and call.excinfo is None,
        )

    @property
    def results(self) -> list[CaseResult]:
        return self.runner.results if self.runner else []

    def has_marker(self, name: str) -> bool:
        return self.item.get_closest_marker(name) is not None


def evidence_of(call: pytest.CallInfo[None]) -> str | None:
    """What the case's failure says: a child's evidence (cause first), else the exception line."""
    if call.excinfo is None:
        return None
    exc = call.excinfo.value
    if isinstance(exc, CaseError):
        return exc.evidence
    return call.excinfo.exconly()


def is_xfail(report: pytest.TestReport) -> bool:
    return hasattr(report, "wasxfail")


def reproduced_bug(case: JudgedCase, report: pytest.TestReport) -> str | None:
    """The registry entry a case reproduced (its xfail, unless an earlier judge failed it besides),
    None for any other outcome."""
    judgement = case.judgement  # reproduced: an xfail, or a failure an earlier judge found besides the bug
    if judgement is None or judgement.kind is not JudgementKind.REPRODUCED:
        return None
    return judgement.entry or (case.entries[0].id if case.entries else None)


BESIDES = "and besides"  # the words that lead a reproduced bug's other changes (harness.findings reads them)


def fail_besides(report: pytest.TestReport, entry: str, changes: list[str], against: str) -> None:
    """A case that reproduced its known bug and changed besides: the bug excuses its own failure,
    not the change, which fails the case (and the run) like any other, the bug named first."""
    if not changes:
        return
    listing = "\n".join(f"  {line}" for line in changes)
    if not is_xfail(report):  # an earlier judge failed it already: this finding goes beside it
        report.sections.append((f"{BESIDES} ({against})", listing))
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = (
        f"XFAIL {entry} {BESIDES}: {changes[0]}\n"
        f"known bug {entry} reproduced as expected; besides it, against {against}:\n{listing}\n"
        "(a known bug excuses its own failure only: what else the case measured is judged as in a passing case)"
    )


class Judge:
    """What every judge has; a judge overrides the steps it takes part in."""

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        """Judge one case: change the report's outcome where the finding fails or excuses it,
        and leave the finding on the case."""

    def collect(self, report: pytest.TestReport) -> None:
        """The owning process: a case's report, with what its judge put on it for this process."""

    def finish(self, pytest_session: pytest.Session) -> None:
        """The end of the run, in every process."""

    def summarise(self, terminalreporter: Any) -> None:
        """The owning process: this judge's section at the end of the run."""


def judge_case(
    judges: list[Judge], item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport
) -> JudgedCase:
    """Every judge in turn, on one carrier."""
    case = JudgedCase.of(item, call)
    for judge in judges:
        judge.judge(case, report)
    return case
