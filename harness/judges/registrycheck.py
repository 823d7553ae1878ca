"""The known-bug registry's side in pytest: which entries a case names, its judgement put on the
case's report, and the case as every judge reads it (JudgedCase)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _pytest._code.code import ReprEntryNative  # pytest's own printable traceback entry

from harness import registry
from harness.errors import CaseError, RegistryError
from harness.isolation.case import CaseResult, SpmdRunner
from harness.records import results
from harness.registry import Judgement, JudgementKind, KnownBug

RUNNER_KEY = pytest.StashKey[SpmdRunner]()  # the case's runner, set by the spmd fixture
ENTRIES_KEY = pytest.StashKey[list[KnownBug]]()  # the entries the case names, read at collection


def entries_of(item: pytest.Item, registry_path: Path) -> list[KnownBug]:
    """The entries an item's known_bug markers name, each once; RegistryError if one is unknown
    or two could both claim the same build."""
    ids = []
    for marker in item.iter_markers("known_bug"):
        if len(marker.args) != 1 or not isinstance(marker.args[0], str):
            raise RegistryError(f"known_bug takes one entry id, got {marker.args!r}")
        if marker.args[0] not in ids:
            ids.append(marker.args[0])
    entries = [registry.get_entry(entry_id, registry_path) for entry_id in ids]
    registry.check_disjoint(entries)
    return entries


@dataclasses.dataclass
class JudgedCase:
    """One case as the plugin judges it, gathered once (after its call, or at a failed set-up):
    the registry and the baselines read it and add what they found, and its record is written
    from it."""

    case_id: str  # the stable name records and baselines use (results.case_id)
    runner: SpmdRunner | None  # None: the case never reached the spmd fixture
    entries: list[KnownBug]  # the known_bug entries it names
    torch_xla: str | None  # what its children ran: the last body that reported a version
    shardings: dict[str, str]  # what its bodies recorded (a later body's tensor wins)
    judgement: Judgement | None = None  # the registry's, for a case that names entries
    sharding_changes: list[str] = dataclasses.field(default_factory=list)  # against its baseline entry

    @classmethod
    def of(cls, item: pytest.Item) -> JudgedCase:
        runner = item.stash.get(RUNNER_KEY, None)
        ran = runner.results if runner else []
        reported = [r.torch_xla for r in ran if r.torch_xla]
        shardings: dict[str, str] = {}
        for result in ran:
            shardings.update(result.shardings)
        return cls(
            case_id=results.item_case_id(item),
            runner=runner,
            entries=item.stash.get(ENTRIES_KEY, []),
            torch_xla=reported[-1] if reported else None,
            shardings=shardings,
        )

    @property
    def results(self) -> list[CaseResult]:
        return self.runner.results if self.runner else []


def evidence_of(call: pytest.CallInfo[None]) -> str | None:
    """What the case's failure says: a child's evidence (cause first), else the exception line."""
    if call.excinfo is None:
        return None
    exc = call.excinfo.value
    if isinstance(exc, CaseError):
        return exc.evidence
    return call.excinfo.exconly()


def judge(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport, case: JudgedCase) -> None:
    """A case that names entries: the registry's judgement becomes its outcome (a reproduced bug
    is an xfail, an unexpected pass a failure) or leads its failure."""
    if not case.entries or report.skipped:
        return
    judgement = case.judgement = registry.judge(case.entries, case.torch_xla, evidence_of(call))
    judged = [("known_bug", judgement.entry or case.entries[0].id), ("registry_verdict", judgement.kind.value)]
    item.user_properties.extend(judged)
    report.user_properties.extend(judged)  # copied from the item before this judgement: for the run's closing line
    if judgement.kind is JudgementKind.REPRODUCED:
        report.outcome = "skipped"
        report.wasxfail = judgement.message
    elif judgement.kind is JudgementKind.UNEXPECTED_PASS:
        report.outcome = "failed"
        report.longrepr = judgement.message
    elif judgement.kind is not JudgementKind.PASSED:
        _lead_with_judgement(report, judgement.message)


def _lead_with_judgement(report: pytest.TestReport, message: str) -> None:
    """Put the registry's judgement first: the first lines of the failure, the FAILED summary line
    and the JUnit message, ahead of the traceback (which stays, below it)."""
    longrepr = report.longrepr
    chain = getattr(longrepr, "chain", None)
    first = chain[0][0] if chain else getattr(longrepr, "reprtraceback", None)
    entries = getattr(first, "reprentries", None)
    if entries is None:
        report.longrepr = f"{message}\n\n{longrepr}"
        return
    # ReprEntryNative prints its lines as they are and survives xdist's report serialization.
    entries.insert(0, ReprEntryNative([f"{message}\n\n"]))
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        crash.message = message
