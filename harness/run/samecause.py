"""Failures of one cause shown whole once: the rest of them by their first lines.

One torch_xla change fails many cases the same way (a sync in every FSDPv2 block: 23 failures,
each with its child's traceback and log, its cost drift and the bytes it only lists: 907 lines
of output before the findings said "13 case(s): compilations per step grew"). Under pytest's
default traceback style and with more than MAX_WHOLE failures, the FAILURES section shows the
first failure of each cause (harness.findings' grouping, the one the findings section uses) as
pytest would, and every later failure of the same cause as its first lines, where it failed, and
which failure above it repeats. `--tb=long` (or any style asked for) and `-vv` show every failure
whole; the findings and FAILED lines read the whole failure (harness.run.findings.whole_longrepr),
so they say what they would have said. The reports
are put back after the summary (harness.run.failedlines.WholeFailedLines keeps the originals).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from harness import findings as causes
from harness.judges.costcheck import COST_CHECK_SECTION
from harness.run.failedlines import WHOLE_LINES_VERBOSITY, WholeFailedLines
from harness.run.findings import WHOLE_FAILURE, failed_cases
from harness.run.session import SESSION_KEY

MAX_WHOLE = 5  # failures a run shows whole whatever their causes: a few failures are read one by one
FIRST_LINES = 3  # of a repeated failure's message where its first line announces a list, and of the cost check


class SameCauseShownOnce:
    """Registered by the plugin for an SPMD run's controlling process, beside WholeFailedLines."""

    def __init__(self, keeper: WholeFailedLines) -> None:
        self.keeper = keeper

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> Generator[None, None, None]:
        # The outermost wrapper: before pytest's own prints the FAILURES section.
        self._shorten_repeats(terminalreporter, config)
        return (yield)

    def _shorten_repeats(self, terminalreporter: Any, config: pytest.Config) -> None:
        harness_session = config.stash.get(SESSION_KEY, None)
        if harness_session is None or not (harness_session.active or harness_session.run_folder.exists()):
            return  # not an SPMD run
        if config.option.tbstyle != "auto" or config.option.verbose >= WHOLE_LINES_VERBOSITY:
            return  # a style asked for, or whole messages: every failure as pytest shows it
        failed = [r for r in terminalreporter.stats.get("failed", []) if getattr(r, "when", "") == "call"]
        if len(failed) <= MAX_WHOLE:
            return
        first_of: dict[tuple[str, str], pytest.TestReport] = {}
        for report, case in zip(failed, failed_cases(harness_session, failed)):
            cause = causes.cause_of(case)
            if cause not in first_of:
                first_of[cause] = report
                continue
            self.keeper.keep_original(report)
            setattr(report, WHOLE_FAILURE, (report.longrepr, list(report.sections)))  # what findings read
            report.longrepr = repeated(report, first_of[cause].nodeid, cause, config.rootpath)
            report.sections = []
            # xdist's "[gw0] linux -- Python ... <venv>" line, printed before each failure: the
            # first of the cause shows it; a repeat's line would only say it again.
            report.__dict__.pop("node", None)


def repeated(report: pytest.TestReport, first: str, cause: tuple[str, str], rootpath: Path) -> str:
    """A repeated failure as the FAILURES section shows it: its message's first lines (and the cost
    check's beside it), where it failed, and the failure above it that it repeats."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(longrepr)
    lines = _first_lines(message)
    beside = [text for title, text in report.sections if title == COST_CHECK_SECTION]
    if beside:
        lines += _first_lines(beside[0])
    where = ""
    if crash is not None:
        path = Path(crash.path)
        where = f"{path.relative_to(rootpath) if path.is_relative_to(rootpath) else path}:{crash.lineno}: "
    kind, direction = cause
    named = f"{kind} {direction}" if kind != "other" else "the same first line"
    lines.append(f"{where}the same cause as {first} ({named}), shown whole above; --tb=long shows each failure whole")
    return "\n".join(lines)


def _first_lines(text: str) -> list[str]:
    """The first line; where it announces a list (`cost drift: 9 item(s) differ ...:`), its first
    items (indented: an error's own next lines are not)."""
    lines = [line for line in text.splitlines() if line.strip()]
    shown = lines[:1]
    if lines and lines[0].rstrip().endswith(":"):
        shown += list(itertools.takewhile(lambda line: line.startswith((" ", "\t")), lines[1:FIRST_LINES]))
    return shown + ([f"  ... {len(lines) - len(shown)} more line(s)"] if len(lines) > len(shown) else [])
