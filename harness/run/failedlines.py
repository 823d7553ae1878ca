"""FAILED lines that keep their reason when pytest's output is not a terminal.

pytest cuts each line of its short test summary at the terminal's width, 80 columns when the
output is piped (`pytest ... | tee log`), so a verdict such as `base 2.10.0+git1111111 -> this
build 2.10.0+git2222222: step0: compiles 1 -> 4` lost its cause, or all of it. On CI pytest
prints them whole (its `running_on_ci()`, or -vv). An SPMD run whose output is not a terminal gets
the same: the verbosity is raised for the short summary alone (the last thing pytest writes before
its totals line) and put back after it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from harness.run.session import SESSION_KEY

WHOLE_LINES_VERBOSITY = 2  # what pytest's short summary needs to print a failure's message whole


class WholeFailedLines:
    """Registered by the plugin for an SPMD run's controlling process."""

    def __init__(self) -> None:
        self.saved: int | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        # trylast: after every other summary, just before pytest's own short summary is written.
        harness = config.stash.get(SESSION_KEY, None)
        if harness is None or not (harness.active or harness.run.exists()):
            return  # not an SPMD run: pytest's output is left as it is
        if terminalreporter.isatty() or config.option.verbose >= WHOLE_LINES_VERBOSITY:
            return
        self.saved = config.option.verbose
        config.option.verbose = WHOLE_LINES_VERBOSITY

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            if self.saved is not None:
                session.config.option.verbose = self.saved
                self.saved = None
