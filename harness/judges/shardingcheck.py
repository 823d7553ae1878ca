"""The plugin's side of the sharding baseline: which file, each passing case held to its entry,
and the rewrite of an update run.

Called by harness.plugin after the known-bug registry (an xfail is never compared) and before the
cost check (harness.judges.costcheck), which has the same shape. Whether a change fails a case, and how
it is shown: harness.judges.baseline.
"""

from __future__ import annotations

import pytest

from harness.baselinefile import BaselineSession
from harness.config import options
from harness.isolation.backend import Backend
from harness.isolation.case import SpmdRunner
from harness.judges import checked
from harness.judges.baseline import Baseline

SESSION_KEY = pytest.StashKey["ShardingSession"]()


class ShardingSession(BaselineSession[Baseline]):
    def __init__(self, config: pytest.Config, backend: Backend) -> None:
        option = options.value(config, Baseline.OPTION)
        super().__init__(config, backend, Baseline, option, config.getoption(options.UPDATE_SHARDINGS))


def configure(config: pytest.Config, backend: Backend) -> ShardingSession:
    session = ShardingSession(config, backend)
    config.stash[SESSION_KEY] = session
    return session


def session_of(config: pytest.Config) -> ShardingSession:
    return config.stash[SESSION_KEY]


def judge(
    item: pytest.Item,
    report: pytest.TestReport,
    case_id: str,
    shardings: dict[str, str],
    torch_xla: str | None,
    runner: SpmdRunner | None,
) -> list[str]:
    """A passing case's shardings against its baseline entry, or kept for the rewrite of an update
    run; the changes found, a line per tensor (the record's `sharding_changes`)."""
    session = session_of(item.config)
    if (
        report.outcome != "passed"
        or hasattr(report, "wasxfail")
        or runner is None
        or item.get_closest_marker("no_sharding_baseline")
        or not shardings
    ):
        return []
    if session.update:
        session.updates.observe(item.nodeid, case_id, shardings, torch_xla)
        return []
    base = session.baseline()
    if base is None:
        return []
    check = base.check(case_id, shardings, torch_xla, session.rewrite_command(item, base.path))
    if check is None:
        session.cases_without_entry.append(case_id)
        return []
    checked.mark(report, checked.SHARDING_BASELINE)
    if check.failure is not None:
        report.outcome = "failed"
        report.longrepr = check.failure
    elif check.changes:
        report.sections.append((check.heading, check.listing))
    return [str(c) for c in check.changes]
