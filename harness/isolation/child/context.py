"""What a case body receives in its child process: the run's settings and a place to put evidence.

A body is a plain function `body(ctx, **kwargs)`. It imports torch/torch_xla itself (the parent
never does), asserts what it needs, and records observations: sharding specs per named tensor,
HLO text, small JSON values. Those travel back to the parent in the verdict.
"""

from __future__ import annotations

import os
from typing import Any

from harness.errors import HarnessUsageError
from harness.isolation.wire import protocol


class CaseContext:
    def __init__(self, bodies_before: int = 0) -> None:
        # How many bodies this process ran before this one: graphs they compiled are cached here,
        # which a cost-measured loop must not find (harness.stepcosts.StepMeter).
        self.bodies_before = bodies_before
        self.backend = os.environ.get(protocol.BACKEND_ENV, "")
        self.devices = int(os.environ.get(protocol.DEVICES_ENV, "0") or 0)
        self.functionalization = os.environ.get("XLA_DISABLE_FUNCTIONALIZATION", "0") != "1"
        self.shardings: dict[str, str] = {}
        self.hlo: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.poisoned: list[str] = []

    def record_sharding(self, name: str, spec: str) -> str:
        """Keep the sharding spec text of a named tensor (see harness.xla.spec_of)."""
        self.shardings[name] = _checked_text("record_sharding", name, spec)
        return spec

    def record_hlo(self, name: str, text: str) -> str:
        self.hlo[name] = _checked_text("record_hlo", name, text)
        return text

    def record(self, key: str, value: Any) -> Any:
        """Keep a small JSON value (a loss curve, a count, a flag); the same object is returned,
        so a list recorded first and appended to later travels with what was appended."""
        _check_json("record", key, value)
        self.values[key] = value
        return value

    def poison(self, reason: str) -> None:
        """Say what this body did to its process (kept in the verdict). No process runs a second
        body any more (issue 51); cases that said so before still may."""
        self.poisoned.append(reason)

    def observations(self) -> dict[str, Any]:
        return {"shardings": self.shardings, "hlo": self.hlo, "values": self.values}


def _checked_text(method: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise HarnessUsageError(f"ctx.{method}({key!r}, ...): expected text, got {type(value).__name__}")
    return value


def _check_json(method: str, key: str, value: Any) -> None:
    """Strict JSON only: a repr or an Infinity would reach the results folder and break readers."""
    problem = protocol.json_problem(value)
    if problem:
        raise HarnessUsageError(
            f"ctx.{method}({key!r}, ...): the value is not strict JSON ({problem}); record numbers, text, "
            f"lists and dicts of them, and write NaN/Infinity as text (e.g. str(loss))"
        )
