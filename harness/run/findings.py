"""The end of an SPMD run: one finding per cause, not one per failed case.

One change in torch_xla (an extra mark_step in every training step) fails every case that trains,
each in its own words: 18 failures, read one by one, bury the one thing that changed. This
section, the last before pytest's short summary, groups the failed cases by cause (harness.findings:
the kind of figure that moved and its direction, with what the records say of it), the largest
group first, and leaves the lines in the run folder for spmd-report's summary.md:

    18 case(s): compilations per step grew
      diagnosis: the step graph split: each step now runs more graphs ...

Known bugs that behaved as expected are one line per registry entry, not an XFAIL line per case.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable
from typing import Any

import pytest

from harness import findings as causes
from harness.judges import basecheck, basecompare, checked
from harness.records import results, runfolder
from harness.run.session import SESSION_KEY, HarnessSession, checked_labels

MAX_ITEMS_SHOWN = 6  # lines of one finding; the rest is in each failure and in comparison.json
# `step0:parameter(3)` and `parameter(7)`: the numbers XLA gives a step graph's parameters move
# when a graph gains or loses one, so the same change reads alike whatever the numbering.
PARAMETER_NUMBER = re.compile(r"parameter\(\d+\)")


# What every line against a base run starts with, the harness's wrapper of a child's error, and
# the registry's word on a case marked with a known bug that failed otherwise (harness.registry:
# `failed on torch_xla 2.9.0; not the signature of <entry>: <cause>`, or on a release the entry names
# `torch_xla 2.9.0 carries <entry>, but this failure matches none of its signatures (...): a new
# failure: <cause>`, said whole above the summary):
# words every such failure shares, not its cause.
BOILERPLATE = re.compile(
    r"^(?:(?:harness\.errors\.)?CaseFailed: )?(?:failed on [^;\n]*; not the signature of [^:\n]*: )?"
    r"(?:[^\n]*? carries \S+, but this failure matches none of its signatures \([^\n]*?\): a new failure: )?"
    r"(?:base \S+ -> this build \S+: )?"
)


def first_item(text: str) -> str:
    """A failure's first line; where that line announces a list ("sharding drift: 1 tensor(s) differ
    ...:" and indented items), with its first item, so one line says what changed. An error whose
    message ends in ':' (`RuntimeError: Check failed: tensor_data:`) is not a list: the line after it
    (`(raised by case <id> in its child)`) would make each case's cause its own."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].rstrip().endswith(":") and lines[1].startswith((" ", "\t")):
        return f"{lines[0].strip()} {lines[1].strip()}"
    return lines[0].strip() if lines else ""


def finding_of(report: pytest.TestReport) -> tuple[str, ...]:
    """What failed this case: the items that differ from the base run (without the build names,
    which every such line shares), else the failure's first line."""
    properties = dict(report.user_properties)
    compared = json.loads(str(properties.get(basecheck.PROPERTY, "{}")))
    if compared.get("differences"):
        return tuple(PARAMETER_NUMBER.sub("parameter(N)", item) for item in compared["differences"])
    longrepr = whole_longrepr(report)
    crash = getattr(longrepr, "reprcrash", None)
    return (BOILERPLATE.sub("", first_item(crash.message if crash is not None else str(longrepr))),)


# A failure the FAILURES section shows by its first lines (harness.run.samecause) keeps its whole
# longrepr and sections here until the summary is over: what it says is read from the whole of it.
WHOLE_FAILURE = "spmd_whole_failure"


def whole_longrepr(report: pytest.TestReport) -> Any:
    whole = getattr(report, WHOLE_FAILURE, None)
    return report.longrepr if whole is None else whole[0]


def whole_sections(report: pytest.TestReport) -> list[tuple[str, str]]:
    whole = getattr(report, WHOLE_FAILURE, None)
    return list(report.sections) if whole is None else list(whole[1])


def checked_line(reports: Iterable[pytest.TestReport]) -> str:
    """What the run held its cases to: the registry entries judged, the references compared."""
    calls = [r for r in reports if getattr(r, "when", "") == "call"]
    entries = {str(v) for r in calls for name, v in r.user_properties if name == "known_bug"}
    verdicts = collections.Counter(str(v) for r in calls for name, v in r.user_properties if name == "registry_verdict")
    held = collections.Counter(what for r in calls for what in checked.of(r))
    parts = [f"{len(calls)} case(s) ran"]
    parts.append(
        f"{len(entries)} known-bug registry entr{'y' if len(entries) == 1 else 'ies'} judged"
        + (f" ({', '.join(f'{n} {v}' for v, n in sorted(verdicts.items()))})" if verdicts else "")
    )
    for what in checked_labels():
        parts.append(f"{held[what]} held to the {what}")
    return "spmd checked: " + "; ".join(parts)


def failed_cases(harness_session: HarnessSession, failed: list[pytest.TestReport]) -> list[causes.FailedCase]:
    """The run's failed cases as the findings see them (harness.findings), one per report in its
    order, with their records' signatures and the base run's beside them for the diagnoses."""
    records: dict[str, Any] = {}
    found: dict[str, str] = {}  # each record's digest, as read
    if harness_session.run_folder.exists():
        try:  # the records the run wrote (a case can damage them: then the findings go without signatures)
            records = {
                r.nodeid: r for r in results.read_records(harness_session.run_folder.path, unreadable=[], digests=found)
            }
        except (OSError, ValueError):
            records = {}
    base = harness_session.base_run_judge.base.records if harness_session.base_run_judge is not None else {}
    cases = []
    for report in failed:
        case_id = str(dict(report.user_properties).get("spmd_case_id", report.nodeid))
        # Only the record its case's process wrote (the digest its report carries): a later case
        # can rewrite one, and the findings would lead with what it wrote.
        vouched = dict(report.user_properties).get(results.RECORD_DIGEST_PROPERTY)
        record = records.get(case_id) if vouched is not None and found.get(case_id) == vouched else None
        items = list(finding_of(report))
        if record is not None and len(items) == 1:  # its own lines, where no base run listed them
            items += list(record.cost_changes) + list(record.sharding_changes)
        if record is None:
            cases.append(causes.FailedCase(case_id, items))
        else:
            cases.append(causes.from_record(record, items, base.get(case_id)))
    return cases


def cause_lines(harness_session: HarnessSession, failed: list[pytest.TestReport]) -> list[str]:
    """The run's failed cases by cause (harness.findings)."""
    hint = "--spmd-update-costs / --spmd-update-shardings (the committed baselines), or a new base run"
    try:
        found = causes.lines(failed_cases(harness_session, failed), hint)
    except Exception as exc:  # noqa: BLE001 - the failures stay listed above; their grouping is lost, said
        found = [f"findings by cause unavailable ({type(exc).__name__}: {exc}); the failures above stand"]
    return [basecompare.printable(line) for line in found]


def _asked_for_xfails(config: pytest.Config) -> bool:
    """-rx, -ra or -rA on the command line itself (the project's addopts' -ra is not asking)."""
    args = [str(a) for a in config.invocation_params.args]
    chars = "".join(a[2:] for a in args if a.startswith("-r") and not a.startswith("--")) + "".join(
        args[i + 1] for i, a in enumerate(args[:-1]) if a == "-r"
    )
    return any(c in chars for c in "xaA")


def _expected_xfails(terminalreporter: Any, config: pytest.Config) -> None:
    """Known bugs that behaved as expected: one line per registry entry with its count, in place of
    pytest's XFAIL line per case (which pushes the failures out of a terminal's view), unless asked."""
    xfailed = terminalreporter.stats.get("xfailed", [])
    if not xfailed or _asked_for_xfails(config):
        return
    terminalreporter.reportchars = terminalreporter.reportchars.replace("x", "")
    entries = collections.Counter(
        str(dict(r.user_properties).get("known_bug", "not a registry entry (pytest.mark.xfail)")) for r in xfailed
    )
    listing = ", ".join(f"{entry} x{n}" for entry, n in sorted(entries.items(), key=lambda e: (-e[1], e[0])))
    terminalreporter.write_line(f"known bugs reproduced as expected ({len(xfailed)} xfail, -rx lists them): {listing}")


class Findings:
    """Registered by the plugin for the controlling process: the section at the end of the run."""

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        harness_session = config.stash.get(SESSION_KEY, None)
        if harness_session is None or not (harness_session.active or harness_session.run_folder.exists()):
            return
        failed = [r for r in terminalreporter.stats.get("failed", []) if getattr(r, "when", "") == "call"]
        shown = cause_lines(harness_session, failed) if failed else []
        if failed:
            changes = sum(1 for line in shown if not line.startswith((" ", "if ")))
            title = f"spmd findings: {len(failed)} failed case(s), {changes} finding(s) by cause"
            terminalreporter.section(title, red=True)
            for line in shown:
                terminalreporter.line(line, red=not line.startswith(" "))
        if harness_session.run_folder.exists():  # for spmd-report's summary.md, which leads with them
            # Written with no failure too (empty): one a case planted must not read as this run's.
            try:
                runfolder.replace_file(
                    harness_session.run_folder.path / causes.FILE_NAME, "".join(f"{line}\n" for line in shown)
                )
            except OSError as exc:  # a full disk, a folder put there: the run's end says so
                terminalreporter.line(f"spmd harness: could not keep the findings ({exc})", red=True)
        _expected_xfails(terminalreporter, config)
        reports = [r for key in ("passed", "failed", "xfailed", "xpassed") for r in terminalreporter.stats.get(key, [])]
        terminalreporter.write_line(checked_line(reports))
