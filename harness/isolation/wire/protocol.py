"""The wire format between the parent (pytest) and a child process.

Requests go to the child's stdin, answers come back on a dedicated pipe (file descriptor number
in HARNESS_RESULT_FD), never on stdout: torch_xla, XLA and JAX print freely, and that goes to the
child's log untouched. Every message is one line of strict JSON (no NaN/Infinity).

    parent -> child   {"kind": "request", "id": 7, "case": "...", "body": {...}, "kwargs": {...}}
    child  -> parent  {"kind": "ready", "pid": ..., "torch_xla": "2.9.0" | null, ...}     once, at start
                      {"kind": "startup-failed", "exception": {...}}                        instead of ready
                      {"kind": "started", "id": 7}                                        request 7 read
                      {"kind": "verdict", "id": 7, "outcome": "ok" | "error", ...}          request 7 done

The last is a ChildAnswer: the child's verdict on the body it ran (not the known-bug registry's
judgement of the case, which the parent makes from it).

The ids let the parent check that every answer belongs to the case in flight: a second verdict,
a verdict with another id or bytes that do not decode are a protocol failure of that case. The
"started" acknowledgement draws the line between two cases run by one child: a child that dies
after verdict 7 but before it acknowledged request 8 died of case 7, not of case 8.

A message is at most MAX_MESSAGE_BYTES long; the child refuses to send larger observations with
an error that says so, and the parent treats a longer line as a protocol failure.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from harness.errors import HarnessError

RESULT_FD_ENV = "HARNESS_RESULT_FD"
LIFELINE_FD_ENV = "HARNESS_LIFELINE_FD"  # read end of a pipe only the parent can write: EOF = parent gone
KEEPER_PID_ENV = "HARNESS_KEEPER_PID"  # the child's keeper: what it adopts are the child's escaped helpers
PRELOAD_ENV = "HARNESS_PRELOAD"  # comma-separated "module:function" set-up hooks run at start
BACKEND_ENV = "HARNESS_BACKEND"
DEVICES_ENV = "HARNESS_DEVICES"
# "<uid>:<gid>" a child drops to before it runs anything (--spmd-case-user; the run has root)
CASE_USER_ENV = "HARNESS_CASE_USER"
FAKE_VERSION_ENV = "HARNESS_FAKE_TORCH_XLA"  # the torch_xla version a fake-backend child claims
# Where a child's XLA dumps go (harness.xla.enable_step_dumps): a folder in the run's folder that
# the controlling pytest process removes at the end of the run. A forked child leaves through
# os._exit, so a folder a child made in /tmp for itself would outlive it.
XLA_DUMP_ROOT_ENV = "HARNESS_XLA_DUMP_ROOT"

# 128 MiB: room for the HLO of a large model; past it, record less (a graph's excerpt, not all).
MAX_MESSAGE_BYTES = 128 * 1024 * 1024


class ProtocolError(HarnessError):
    """A line on the result pipe that is not a valid message (forkwire.ForkWireError: a packet
    between a fork server and its client)."""


@dataclasses.dataclass(frozen=True)
class BodyRef:
    """Where the child finds a case body: import `module` with `root` on sys.path. `sha256`: the
    module file's content when the run collected it; the child imports exactly that or refuses."""

    module: str
    qualname: str
    root: str
    sha256: str = ""

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
    def from_dict(cls, data: dict[str, Any] | None) -> ChildException | None:
        return cls(**data) if data else None


@dataclasses.dataclass(frozen=True)
class Request:
    kind: ClassVar[str] = "request"
    id: int
    case: str
    body: dict[str, str]
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Ready:
    kind: ClassVar[str] = "ready"
    pid: int
    torch_xla: str | None
    preloaded: list[str]
    startup_s: float


@dataclasses.dataclass(frozen=True)
class StartupFailed:
    kind: ClassVar[str] = "startup-failed"
    exception: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Started:
    kind: ClassVar[str] = "started"
    id: int


@dataclasses.dataclass(frozen=True)
class ChildAnswer:
    """The child's answer to request `id` once its body is done: how the body ended, what it
    recorded, and whether it left anything running. Its kind on the wire is "verdict". A child
    answers one request in its life (issue 51): there is no "may run another case"."""

    kind: ClassVar[str] = "verdict"
    id: int
    case: str
    outcome: str  # "ok" | "error"
    exception: dict[str, str] | None
    observations: dict[str, Any]
    duration_s: float
    # What the body said of its process (ctx.poison) or left running: in the child's record only.
    poisoned: str = ""
    # False when the body left a thread or a process running: the parent ends the child before
    # the next case begins, and charges to this case whatever they did until then.
    quiet: bool = True


MESSAGE_TYPES: dict[str, type[Any]] = {t.kind: t for t in (Request, Ready, StartupFailed, Started, ChildAnswer)}


def json_problem(value: Any) -> str | None:
    """Why `value` cannot travel in a message (a set, an object, NaN or Infinity), or None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def encode(message: Any) -> bytes:
    """One line of strict JSON; ValueError for NaN/Infinity, TypeError for non-JSON values."""
    data = {"kind": message.kind, **dataclasses.asdict(message)}
    return (json.dumps(data, allow_nan=False) + "\n").encode("utf-8")


def decode(line: bytes) -> Any:
    """The message a line holds; ProtocolError naming what is wrong with it otherwise."""
    try:
        data = strict_loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"undecodable line ({exc}): {preview(line)}") from None
    if not isinstance(data, dict) or data.get("kind") not in MESSAGE_TYPES:
        raise ProtocolError(f"not a harness message: {preview(line)}")
    cls = MESSAGE_TYPES[data.pop("kind")]
    try:
        return cls(**data)
    except TypeError as exc:
        raise ProtocolError(f"malformed {cls.kind} message ({exc}): {preview(line)}") from None


def strict_loads(data: bytes) -> Any:
    """UTF-8 JSON without NaN or Infinity; UnicodeDecodeError or ValueError otherwise."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply to be read") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def preview(line: bytes, limit: int = 200) -> str:
    """The start of a bad message, for the error that names it."""
    text = repr(bytes(line[:limit]))
    return text + (f" ... ({len(line)} bytes)" if len(line) > limit else "")


class LineBuffer:
    """Splits a byte stream into lines in linear time, refusing lines over `max_bytes`.

    Only the bytes added since the last search are scanned for a newline, and consumed lines are
    dropped from the front in one step, so an 80 MB message costs one pass, not one per chunk.
    """

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._data = bytearray()
        self._start = 0  # first unconsumed byte
        self._scanned = 0  # bytes from _start already known to hold no newline

    def feed(self, chunk: bytes) -> None:
        if self._start and self._start > len(self._data) // 2:
            del self._data[: self._start]
            self._start = 0
        self._data += chunk

    def pending(self) -> int:
        return len(self._data) - self._start

    def next_line(self) -> bytes | None:
        """The next complete line (without its newline), or None; ProtocolError when too long."""
        at = self._data.find(b"\n", self._start + self._scanned)
        if at < 0:
            self._scanned = len(self._data) - self._start
            if self._scanned > self.max_bytes:
                raise ProtocolError(f"a message longer than the {self.max_bytes} byte limit")
            return None
        line = bytes(self._data[self._start : at])
        self._start = at + 1
        self._scanned = 0
        if len(line) > self.max_bytes:
            raise ProtocolError(f"a message of {len(line)} bytes, over the {self.max_bytes} byte limit")
        return line
