"""The known-bug registry's side in pytest: which entries each case names (read at collection,
with --spmd-bug's selection), and its judgement of the case (the first judge: harness.judges.judging)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import ReprEntryNative  # pytest's own printable traceback entry

from harness import registry
from harness.config import activation, options
from harness.errors import RegistryError
from harness.judges.judging import ENTRIES_KEY, Judge, JudgedCase
from harness.registry import JudgementKind, KnownBug

ENTRY_PROPERTY = "known_bug"  # a report's user properties: the entry that judged the case,
JUDGEMENT_PROPERTY = "registry_verdict"  # and its judgement (the name records keep)


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


def read_entries(config: pytest.Config, items: list[pytest.Item], registry_path: Path) -> None:
    """At collection: the entries each SPMD case names, kept on the item. Unknown or overlapping
    known_bug entries refuse the run before any case runs (exit 4, usage error), each problem once
    with the cases that share it (a misspelt id on a parametrised case is one mistake); then only
    the cases of --spmd-bug's entry are kept."""
    problems: dict[str, list[str]] = {}
    for item in items:
        if not activation.is_spmd(item):
            continue  # a foreign test's known_bug marker is its own
        try:
            item.stash[ENTRIES_KEY] = entries_of(item, registry_path)
        except RegistryError as exc:
            problems.setdefault(str(exc), []).append(item.nodeid)
    if problems:
        raise pytest.UsageError(
            "known-bug registry:\n  "
            + "\n  ".join(f"{_cases_named(nodeids)}: {problem}" for problem, nodeids in problems.items())
        )
    bug = options.value(config, "spmd_bug")
    if bug:
        _select_bug(config, items, bug, registry_path)


def _cases_named(nodeids: list[str]) -> str:
    shown = ", ".join(nodeids[:3])
    return shown + (f" and {len(nodeids) - 3} more case(s)" if len(nodeids) > 3 else "")


def check_bug_option(config: pytest.Config, registry_path: Path) -> None:
    """--spmd-bug=ID names an entry of the registry, or the run is refused (exit 4). At configure
    time: under xdist a worker's refusal at collection ended the run as an INTERNALERROR."""
    bug = options.value(config, "spmd_bug")
    if not bug or getattr(config.option, "help", False):
        return
    try:
        registry.get_entry(bug, registry_path)
    except RegistryError as exc:
        raise pytest.UsageError(f"--spmd-bug={bug}: {exc}") from None


def _select_bug(config: pytest.Config, items: list[pytest.Item], bug: str, registry_path: Path) -> None:
    """--spmd-bug=ID: the SPMD cases whose known_bug markers name registry entry ID, and nothing else."""
    check_bug_option(config, registry_path)
    keep = [item for item in items if activation.is_spmd(item) and bug in {e.id for e in item.stash[ENTRIES_KEY]}]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


class RegistryJudge(Judge):
    """A case that names entries: the registry's judgement becomes its outcome (a reproduced bug
    is an xfail, an unexpected pass a failure) or leads its failure."""

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        if not case.entries or report.skipped:
            return
        judgement = case.judgement = registry.judge(case.entries, case.torch_xla, case.evidence)
        judged = [(ENTRY_PROPERTY, judgement.entry or case.entries[0].id), (JUDGEMENT_PROPERTY, judgement.kind.value)]
        report.user_properties.extend(judged)  # for the run's closing line (harness.run.findings)
        case.item.user_properties.extend(judged)  # for JUnit's <properties>, which come from the teardown report
        if judgement.kind is JudgementKind.REPRODUCED:
            report.outcome = "skipped"
            report.wasxfail = judgement.message
        elif judgement.kind is JudgementKind.UNEXPECTED_PASS:
            report.outcome = "failed"
            report.longrepr = judgement.message
        elif judgement.kind is not JudgementKind.PASSED:
            _lead_with_judgement(report, judgement.message)

    def record_fields(self, case: JudgedCase) -> dict[str, Any]:
        """The entries the case names and the registry's judgement of it (none before its call)."""
        judgement, entries = case.judgement, case.entries
        return {
            "known_bug": judgement.entry if judgement and judgement.entry else entries[0].id if entries else None,
            "known_bugs": [entry.id for entry in entries],
            "registry_verdict": judgement.kind.value if judgement else None,
            "signature": judgement.signature if judgement else None,
        }


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
