"""What each judge checked a case against, put on the case's report (it travels from an xdist worker
to the controller, as pytest's reports do), for the run's closing "spmd checked:" line
(harness.run.findings). Each judge names its own reference (harness.judges.judging.Judge.CHECKED)."""

from __future__ import annotations

from typing import Any

PROPERTY = "spmd_checked"  # a report's user property, once per judge that held the case to a reference


def mark(report: Any, what: str) -> None:
    report.user_properties.append((PROPERTY, what))


def of(report: Any) -> set[str]:
    return {str(value) for name, value in getattr(report, "user_properties", ()) if name == PROPERTY}
