"""FAILED lines that keep their reason when pytest's output is not a terminal.

pytest cuts each line of its short test summary at the terminal's width, 80 columns when the
output is piped (`pytest ... | tee log`), so a verdict such as `base 2.10.0+git1111111 -> this
build 2.10.0+git2222222: step0: compiles 1 -> 4` lost its cause, or all of it. On CI pytest
prints the message whole (its `running_on_ci()`, or -vv), every line of it. An SPMD run whose
output is not a terminal gets one whole line per failure: for the short summary alone (the last
thing pytest writes before its totals line) the verbosity is raised and each failure's message is
its first line (harness.run.findings.first_item); both are put back after it. The failures above
the summary are printed whole before this.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from harness.judges.basecompare import printable
from harness.run.findings import first_item
from harness.run.session import SESSION_KEY

WHOLE_LINES_VERBOSITY = 2  # what pytest's short summary needs to print a failure's message uncut


class WholeFailedLines:
    """Registered by the plugin for an SPMD run's controlling process."""

    def __init__(self) -> None:
        self.saved_verbosity: int | None = None
        self.saved: list[tuple[Any, Any, str | None]] = []  # (report, its longrepr, its crash message)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        # trylast: after every other summary, just before pytest's own short summary is written.
        harness = config.stash.get(SESSION_KEY, None)
        if harness is None or not (harness.active or harness.run.exists()):
            return  # not an SPMD run: pytest's output is left as it is
        if terminalreporter.isatty() or config.option.verbose >= WHOLE_LINES_VERBOSITY:
            return
        self.saved_verbosity = config.option.verbose
        config.option.verbose = WHOLE_LINES_VERBOSITY
        for report in terminalreporter.stats.get("failed", []):
            longrepr = report.longrepr
            crash = getattr(longrepr, "reprcrash", None)
            self.saved.append((report, longrepr, crash.message if crash is not None else None))
            # The message is the code under test's text: escaped as the findings are, so it cannot
            # clear the screen or colour the log that now shows all of it.
            if isinstance(longrepr, str):
                report.longrepr = printable(first_item(longrepr))
            elif crash is not None:
                crash.message = printable(first_item(crash.message))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            if self.saved_verbosity is not None:
                session.config.option.verbose = self.saved_verbosity
                self.saved_verbosity = None
            for report, longrepr, message in self.saved:
                report.longrepr = longrepr
                if message is not None:
                    longrepr.reprcrash.message = message
            self.saved.clear()
