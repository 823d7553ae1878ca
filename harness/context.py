"""What a case body receives in its child process: the run's settings and a place to put evidence.

A body is a plain function `body(ctx, **kwargs)`. It imports torch/torch_xla itself (the parent
never does), asserts what it needs, and records observations: sharding specs per named tensor,
HLO text, small JSON values. Those travel back to the parent in the verdict.
"""

from __future__ import annotations

import os
from typing import Any

from harness import protocol


class CaseContext:
    def __init__(self) -> None:
        self.backend = os.environ.get(protocol.BACKEND_ENV, "")
        self.devices = int(os.environ.get(protocol.DEVICES_ENV, "0") or 0)
        self.functionalization = os.environ.get("XLA_DISABLE_FUNCTIONALIZATION", "0") != "1"
        self.shardings: dict[str, str] = {}
        self.hlo: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def record_sharding(self, name: str, spec: str) -> str:
        """Keep the sharding spec text of a named tensor (see harness.xla.spec_of)."""
        self.shardings[name] = spec
        return spec

    def record_hlo(self, name: str, text: str) -> str:
        self.hlo[name] = text
        return text

    def record(self, key: str, value: Any) -> Any:
        """Keep a small JSON-serialisable value (a loss curve, a count, a flag)."""
        self.values[key] = value
        return value

    def observations(self) -> dict[str, Any]:
        return {"shardings": self.shardings, "hlo": self.hlo, "values": self.values}
