"""FAILED lines that lead with their cause and fit a terminal.

pytest's short test summary prints `FAILED <case> - <message>`, cut at the terminal's width (80
columns when the output is piped, `pytest ... | tee log`): a verdict such as `base 2.9.0 -> this
build 2.9.0: step2: sharding drift: 80 tensor(s) differ ... compiled a new graph` showed its
boilerplate and lost its cause. An SPMD run's short summary gives each failure one line of at
most MAX_COLUMNS (or the terminal's width, if narrower) whose message is the failure's cause as
harness.findings reads it (the item of the kind of figure that moved first, `step2: compiles 1
-> 4, executions 1 -> 4`, the build names every such line shares left out), then how many other
items it has; a failure no figure explains keeps its first line. The whole failure is printed
above the summary and its findings at the end; the messages are put back after the summary.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

import pytest

from harness import findings as causes
from harness.judges.basecompare import printable
from harness.judges.costcheck import COST_CHECK_SECTION
from harness.run.findings import BOILERPLATE, WHOLE_FAILURE, finding_of, first_item, whole_longrepr, whole_sections
from harness.run.session import SESSION_KEY

WHOLE_LINES_VERBOSITY = 2  # what pytest's short summary needs to print a failure's message uncut
MAX_COLUMNS = 120  # of a FAILED line, however wide the terminal or the log
MIN_MESSAGE = 40  # characters of the cause however long the case's id
MAX_LINES_READ = 200  # of a failure's message, looking for its cause
# `__main__.ChangedSinceCollection: ...`: the error's name is enough, not its module's.
_MODULE_OF_ERROR = re.compile(r"^(?:\w+\.)+(?=\w+: )")
# An absolute path, as an error names the file it is about: its last part is what the line needs.
_LONG_PATH = re.compile(r"(?<![\w.])/(?:[^\s/:'\"]+/)+([^\s/:'\"]+)")


def shown_id(nodeid: str) -> str:
    """The case's id as its FAILED line shows it: whole where it leaves MIN_MESSAGE of MAX_COLUMNS
    for the cause, else its middle elided (`cases/test_costs.py::test_steady_s...per_parameter_per_step`):
    both ends still find it, and the failure's whole id heads its section above the summary. (On a
    narrower terminal the cause is cut, not the id.)"""
    room = MAX_COLUMNS - len("FAILED  - ") - MIN_MESSAGE
    if len(nodeid) <= room:
        return nodeid
    tail = max(0, room // 2 - 2)
    return nodeid[: room - tail - 3] + "..." + nodeid[len(nodeid) - tail :]


def cause_first(report: pytest.TestReport, message: str, columns: int) -> str:
    """The failure's message for its FAILED line: its cause first, the line (with the case's id as
    shown_id() shows it) within `columns`."""
    items = list(finding_of(report))
    differences = len(items) > 1  # against the base run, one item each (else the failure's own lines)
    if not differences:
        # The message, and a cost check's lines put beside a failure it did not cause (a split step's
        # compilations beside the sharding drift of its renumbered parameters).
        beside = [text for title, text in whole_sections(report) if title == COST_CHECK_SECTION]
        lines = [line.strip() for line in "\n".join([message, *beside]).splitlines()[:MAX_LINES_READ] if line.strip()]
        items = [BOILERPLATE.sub("", line) for line in lines] or items
    kind, direction = causes.cause_of(causes.FailedCase(report.nodeid, items))
    lead = next((i for i in items if causes.classify(i) == (kind, direction)), "") if kind != "other" else ""
    lead = BOILERPLATE.sub("", lead or first_item(message))
    more = f" (+{len(items) - 1} more)" if differences else ""
    room = max(MIN_MESSAGE, columns - len(f"FAILED {shown_id(report.nodeid)} - "))
    lead = lead.replace(f"case {report.nodeid}: ", "", 1)  # a case error names its case: the line already does
    text = printable(_LONG_PATH.sub(r".../\1", _MODULE_OF_ERROR.sub("", lead)))
    if len(text) + len(more) > room:
        text = text[: max(0, room - len(more) - 3)].rstrip() + "..."
    return text + more


class WholeFailedLines:
    """Registered by the plugin for an SPMD run's controlling process."""

    def __init__(self) -> None:
        self.saved_verbosity: int | None = None
        # Each report this process changed for the summary, as it was: put back after it.
        self.originals: dict[int, tuple[Any, Any, str | None, str, list[tuple[str, str]], Any]] = {}

    def keep_original(self, report: pytest.TestReport) -> None:
        """Before a change for the summary (the first one counts): report, longrepr, its crash's
        message, node id, sections and xdist's worker node (whose line the report prints first)."""
        if id(report) not in self.originals:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.originals[id(report)] = (
                report,
                report.longrepr,
                crash.message if crash is not None else None,
                report.nodeid,
                list(report.sections),
                report.__dict__.get("node"),
            )

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> Generator[None, None, None]:
        # The innermost wrapper: after every other summary (the findings read the whole messages),
        # just before pytest's own wrapper writes the short summary.
        result = yield
        self._cause_first(terminalreporter, config)
        return result

    def _cause_first(self, terminalreporter: Any, config: pytest.Config) -> None:
        harness_session = config.stash.get(SESSION_KEY, None)
        if harness_session is None or not (harness_session.active or harness_session.run_folder.exists()):
            return  # not an SPMD run: pytest's output is left as it is
        if config.option.verbose >= WHOLE_LINES_VERBOSITY:
            return  # asked for whole messages (-vv): pytest prints them as they are
        columns = MAX_COLUMNS
        if terminalreporter.isatty():
            columns = min(columns, terminalreporter._tw.fullwidth)
        self.saved_verbosity = config.option.verbose
        config.option.verbose = WHOLE_LINES_VERBOSITY  # pytest cuts no line: each is made to fit
        for report in terminalreporter.stats.get("failed", []):
            self.keep_original(report)
            longrepr = whole_longrepr(report)  # a repeated failure shown by its first lines: the whole
            crash = getattr(longrepr, "reprcrash", None)
            # The message is the code under test's text: escaped as the findings are, so it cannot
            # clear the screen or colour the log.
            if isinstance(longrepr, str):
                report.longrepr = cause_first(report, longrepr, columns)
            elif crash is not None:
                report.longrepr = longrepr  # the whole one, put back after the summary as it was
                crash.message = cause_first(report, crash.message, columns)
            report.nodeid = shown_id(report.nodeid)  # put back after the summary, as the message is

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            if self.saved_verbosity is not None:
                session.config.option.verbose = self.saved_verbosity
                self.saved_verbosity = None
            for report, longrepr, message, nodeid, sections, node in self.originals.values():
                if hasattr(report, WHOLE_FAILURE):
                    delattr(report, WHOLE_FAILURE)
                report.longrepr = longrepr
                report.nodeid = nodeid
                report.sections = sections
                if node is not None:
                    report.node = node
                if message is not None:
                    longrepr.reprcrash.message = message
            self.originals.clear()
