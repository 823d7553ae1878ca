"""The one interface every judge of a case has, and the case they all judge (JudgedCase).

A judge takes the judged case and pytest's report of its call, may change the report's outcome
(a reproduced known bug becomes an xfail, a drift a failure) and leaves its finding on the case,
nowhere else: what a case measured (its shardings, its cost signatures) is gathered once onto the
case before any judge sees it, so no judge takes data from another; the case's record is written
from the case alone, each judge giving its own fields (record_fields); the sections a judge shows
beside the case's outcome are its own (JudgedCase.show), put on the report once every judge has
judged. The only finding a later judge reads is the registry's judgement (a reproduced known bug
excuses its own failure only: fail_besides). The run holds its judges in the order they judge
(HarnessSession.judges): the known-bug registry first, then the sharding baseline, the cost
baseline and the base build's run.

    judge(case, report)        every process that runs cases, once per case
    collect(report)            the process that owns the run: each case's report, whichever
                               process judged it. Whatever a judge prints at the end of the run
                               comes from here (a finding that travels on the report): under
                               xdist the workers judge and the controller prints
    finish(pytest_session)     every process, at the end of the run
    summarise(terminal)        the process that owns the run: its section at the end
    record_fields(case)        the case record's fields this judge fills (harness.run.writing)
    keep_files(folder, case, failed)  what it leaves in the run folder beside the record
    CHECKED                    the reference it held a case to, in the closing `spmd checked:` line
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness import costs
from harness.errors import CaseError
from harness.isolation.parent.case import CaseResult, SpmdRunner
from harness.judges import checked
from harness.records import results
from harness.registry import Judgement, JudgementKind, KnownBug

RUNNER_KEY = pytest.StashKey[SpmdRunner]()  # the case's runner, set by the spmd fixture
ENTRIES_KEY = pytest.StashKey[list[KnownBug]]()  # the entries the case names, read at collection


@dataclasses.dataclass(frozen=True)
class Section:
    """What a judge shows beside a case's outcome: a section of its report, under `title`."""

    title: str
    text: str
    reported_only: bool = False  # a change against a committed baseline, reported and not failed


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
    # What its bodies' cost meters recorded (harness.stepcosts), read once for every judge:
    costs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # each loop's cost signature
    cost_read_error: str | None = None  # a signature that is not one (the loops read before it are kept)
    cost_dumps: dict[str, str] = dataclasses.field(default_factory=dict)  # the partitioned modules read
    memray_captures: dict[str, str] = dataclasses.field(default_factory=dict)  # base64, by loop and step
    # The judges' findings, each written by one judge:
    judgement: Judgement | None = None  # the registry's, for a case that names entries
    sharding_changes: list[str] = dataclasses.field(default_factory=list)  # against its baseline entry
    cost_changes: list[str] = dataclasses.field(default_factory=list)  # steady state and baseline lines
    sections: list[Section] = dataclasses.field(default_factory=list)  # in the order the judges showed them
    # A judge that failed the case against a newer reference than the committed baselines (the
    # base build's run) says so: their "reported, not failed" sections would show the same change
    # again, against an older reference (the record keeps them).
    reported_superseded: bool = False

    @classmethod
    def of(cls, item: pytest.Item, call: pytest.CallInfo[None] | None = None) -> JudgedCase:
        runner = item.stash.get(RUNNER_KEY, None)
        ran = runner.results if runner else []
        reported = [r.torch_xla for r in ran if r.torch_xla]
        shardings: dict[str, str] = {}
        for result in ran:
            shardings.update(result.shardings)
        case = cls(
            item=item,
            case_id=results.item_case_id(item),
            runner=runner,
            entries=item.stash.get(ENTRIES_KEY, []),
            torch_xla=reported[-1] if reported else None,
            shardings=shardings,
            evidence=evidence_of(call) if call is not None else None,
            body_passed=call is not None and call.excinfo is None,
        )
        case._read_costs()
        return case

    def _read_costs(self) -> None:
        """Every loop's signature the case's bodies recorded, and their dumps (a failing body's too)."""
        try:
            for result in self.results:
                values = result.values  # a copy: what the bodies sent stays as it came
                self.cost_dumps.update(values.pop(costs.DUMPS_VALUE, None) or {})
                self.memray_captures.update(values.pop(costs.CAPTURES_VALUE, None) or {})
                for label, signature in (values.get(costs.SIGNATURES_VALUE) or {}).items():
                    where = f"cost signature {label!r} from the case's child"
                    self.costs[label] = costs.check_signature(signature, where)
        except costs.CostReadError as exc:
            self.cost_read_error = str(exc)

    @property
    def results(self) -> list[CaseResult]:
        return self.runner.results if self.runner else []

    def recorded_costs(self) -> dict[str, dict[str, Any]]:
        """Each loop's signature as a record keeps it: comparable, with its native growth per step (a
        later run compared with this one judges its own growth against it)."""
        return {label: costs.with_native(signature) for label, signature in self.costs.items()}

    def has_marker(self, name: str) -> bool:
        return self.item.get_closest_marker(name) is not None

    def show(self, title: str, text: str, reported_only: bool = False) -> None:
        """A section beside the case's outcome, from the judge that calls it (judge_case puts them on
        the report)."""
        self.sections.append(Section(title, text, reported_only))


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


def fail_besides(case: JudgedCase, report: pytest.TestReport, entry: str, changes: list[str], against: str) -> None:
    """A case that reproduced its known bug and changed besides: the bug excuses its own failure,
    not the change, which fails the case (and the run) like any other, the bug named first."""
    if not changes:
        return
    listing = "\n".join(f"  {line}" for line in changes)
    if not is_xfail(report):  # an earlier judge failed it already: this finding goes beside it
        case.show(f"{BESIDES} ({against})", listing)
        return
    del report.wasxfail
    report.outcome = "failed"
    report.longrepr = (
        f"XFAIL {entry} {BESIDES}: {changes[0]}\n"
        f"known bug {entry} reproduced as expected; besides it, against {against}:\n{listing}\n"
        "(a known bug excuses its own failure only: what else the case measured is judged as in a passing case)"
    )


class Judge:
    """What every judge has; a judge overrides the parts it takes part in."""

    CHECKED: ClassVar[str | None] = None  # the reference it holds a case to, in `spmd checked:`

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        """Judge one case: change the report's outcome where the finding fails or excuses it,
        and leave the finding on the case."""

    def collect(self, report: pytest.TestReport) -> None:
        """The owning process: a case's report, with what its judge put on it for this process."""

    def finish(self, pytest_session: pytest.Session) -> None:
        """The end of the run, in every process."""

    def summarise(self, terminalreporter: Any) -> None:
        """The owning process: this judge's section at the end of the run."""

    def record_fields(self, case: JudgedCase) -> dict[str, Any]:
        """The fields of the case's record (harness.records.results.CaseRecord) this judge fills."""
        return {}

    def keep_files(self, folder: Path, case: JudgedCase, failed: bool) -> None:
        """What this judge leaves in the run folder beside the case's record."""

    def held(self, report: pytest.TestReport) -> None:
        """This case was held to the judge's reference (CHECKED), said on the report for the owner."""
        assert self.CHECKED is not None, f"{type(self).__name__} holds cases to no reference"
        checked.mark(report, self.CHECKED)


def judge_case(
    judges: list[Judge], item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport
) -> JudgedCase:
    """Every judge in turn, on one carrier; then the sections they showed, on the report."""
    case = JudgedCase.of(item, call)
    for judge in judges:
        judge.judge(case, report)
    report.sections += [
        (section.title, section.text)
        for section in case.sections
        if not (section.reported_only and case.reported_superseded)
    ]
    return case
