"""What each judge checked a case against, put on the case's report (it travels from an xdist worker
to the controller, as pytest's reports do), for the run's closing "spmd checked:" line
(harness.run.findings)."""

from __future__ import annotations

from typing import Any

PROPERTY = "spmd_checked"  # a report's user property, once per judge that held the case to a reference
SHARDING_BASELINE = "sharding baseline"
COST_BASELINE = "cost baseline"
BASE_RUN = "base run"


def mark(report: Any, what: str) -> None:
    report.user_properties.append((PROPERTY, what))


def of(report: Any) -> set[str]:
    return {str(value) for name, value in getattr(report, "user_properties", ()) if name == PROPERTY}
