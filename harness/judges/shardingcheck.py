"""The plugin's side of the sharding baseline: which file, each passing case held to its entry,
and the rewrite of an update run.

The second judge (harness.judges.judging): after the known-bug registry (a case that reproduced
its known bug is held to the shardings it recorded, harness.judges.judging.fail_besides) and before the cost check (harness.judges.costcheck), which has the same shape. Whether
a change fails a case, and how it is shown: harness.judges.baseline.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.config import options
from harness.isolation.backend import Backend
from harness.judges.baseline import Baseline
from harness.judges.baselinestate import BaselineCheck
from harness.judges.judging import Judge, JudgedCase, fail_besides, is_xfail, reproduced_bug


class ShardingJudge(BaselineCheck[Baseline], Judge):
    CHECKED = "sharding baseline"

    def __init__(self, config: pytest.Config, backend: Backend) -> None:
        option = options.value(config, Baseline.OPTION)
        super().__init__(config, backend, Baseline, option, config.getoption(options.UPDATE_SHARDINGS))

    def judge(self, case: JudgedCase, report: pytest.TestReport) -> None:
        """A passing case's shardings against its baseline entry, or kept for the rewrite of an
        update run; the changes found, a line per tensor, go on the case (its record's
        `sharding_changes`)."""
        entry = reproduced_bug(case, report)
        if (
            (report.outcome != "passed" or is_xfail(report))
            and entry is None
            or case.runner is None
            or case.has_marker("no_sharding_baseline")
            or not case.shardings
        ):
            return
        item = case.item
        if self.update:
            self.updates.observe(item.nodeid, case.case_id, case.shardings, case.torch_xla)
            return
        base = self.baseline()
        if base is None:
            return
        check = base.check(case.case_id, case.shardings, case.torch_xla, self.rewrite_command(item, base.path))
        if check is None:
            self.note_without_entry(report, case.case_id)
            return
        self.held(report)
        if entry is not None:  # the bug excuses its failure, not a drift
            drift = [str(c) for c in check.changes if c.before is not None]
            if check.failure is not None:
                fail_besides(case, report, entry, drift, f"the sharding baseline {base.path.name}")
        elif check.failure is not None:
            report.outcome = "failed"
            report.longrepr = check.failure
        elif check.changes:
            case.show(check.heading, check.listing, reported_only=True)
        case.sharding_changes = [str(c) for c in check.changes]

    def record_fields(self, case: JudgedCase) -> dict[str, Any]:
        """The changes against the case's entry, and whether the baseline holds the case at all."""
        return {
            "sharding_changes": case.sharding_changes,
            "sharding_baseline": not case.has_marker("no_sharding_baseline"),
        }
