"""The wire format between the parent (pytest) and a child process.

Requests go to the child's stdin, one JSON object per line. Answers come back on a dedicated
pipe (file descriptor number in HARNESS_RESULT_FD), never on stdout: torch_xla, XLA and JAX
print to stdout/stderr freely, and those go to the child's log file untouched.

Messages from the child:
    {"kind": "ready", "pid": ..., "torch_xla": "2.9.0" | null, "preloaded": [...], "startup_s": ...}
    {"kind": "verdict", "case": "...", "outcome": "ok" | "error", "exception": {...} | null,
     "observations": {...}, "duration_s": ...}
"""

from __future__ import annotations

import dataclasses
from typing import Any

RESULT_FD_ENV = "HARNESS_RESULT_FD"
PRELOAD_ENV = "HARNESS_PRELOAD"  # comma-separated "module:function" set-up hooks run at start
BACKEND_ENV = "HARNESS_BACKEND"
DEVICES_ENV = "HARNESS_DEVICES"
FAKE_VERSION_ENV = "HARNESS_FAKE_TORCH_XLA"  # the torch_xla version a fake-backend child claims


@dataclasses.dataclass(frozen=True)
class BodyRef:
    """Where the child finds a case body: import `module` with `root` on sys.path."""

    module: str
    qualname: str
    root: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ChildException:
    type: str  # qualified name, e.g. "TypeError" or "torch_xla.SomeError"
    message: str
    traceback: str

    @property
    def line(self) -> str:
        """`Type: message`, the form registry signatures are written against."""
        return f"{self.type}: {self.message}"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "ChildException | None":
        return cls(**data) if data else None
