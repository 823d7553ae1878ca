"""What one host hands back: its placement, how its suite ended, and its case records."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.records.results import CaseRecord

SCHEMA = 1


@dataclasses.dataclass
class HostReport:
    slice_id: int
    host_id: int
    pod: str = ""  # pod name on GKE, "local-s<slice>-h<host>" under --local
    suite_command: list[str] = dataclasses.field(default_factory=list)
    exit_code: int | None = None  # the suite's exit code; None if it never ran or was killed
    signal: str | None = None  # e.g. "SIGABRT" when the suite died of a signal
    timed_out: bool = False
    duration_s: float = 0.0
    records: list[CaseRecord] = dataclasses.field(default_factory=list)
    log_tail: list[str] = dataclasses.field(default_factory=list)
    bucket: str = "not configured"  # what the optional bucket channel did
    # Why this host as a whole failed (suite crashed, report missing or corrupt, pod failed).
    error: str | None = None

    @property
    def label(self) -> str:
        return f"slice{self.slice_id}.host{self.host_id}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["schema"] = SCHEMA
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostReport:
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        fields["records"] = [CaseRecord.from_dict(r) for r in data.get("records", [])]
        return cls(**fields)

    @classmethod
    def failed(
        cls, slice_id: int, host_id: int, pod: str, reason: str, log_tail: list[str] | None = None
    ) -> HostReport:
        """A host that produced no usable report: counted as failed with `reason`."""
        return cls(slice_id=slice_id, host_id=host_id, pod=pod, error=reason, log_tail=log_tail or [])
