"""The fork server's wire: what harness.isolation.parent.forkclient and harness.isolation.server.forkserver say
to each other, and the names and limits both sides hold to.

A client connects to the server's listening Unix socket (SOCK_SEQPACKET: one message per packet,
file descriptors passed with it). Every message is one packet of strict JSON (no NaN/Infinity)
with a "kind" and exactly the fields of its dataclass below:

    server -> client  {"kind": "ready", "pid": ..., "imported": [...], ...}          once, on connecting
    client -> server  {"kind": "spawn", "token": "...", "env": {...}, "fds": [...], "argv": null | [...]}
                        + descriptors: stdin, log, exit-status pipe (FIXED_FDS), then those `fds` name
    server -> client  {"kind": "spawned", "pid": ..., "keeper": ...}                 the child is running
                      {"kind": "spawn-failed", "error": "ValueError: ..."}            instead

A server serves only its own run: its owner makes a random token and hands it to the server on an
inherited pipe (never in its environment or command line, which other processes of the user can
read), and to the run's other clients (xdist workers) with their addresses. A spawn request
without that token is refused and its connection closed: a body of another run that connects to
this run's socket cannot have a process started that this run's containment does not end.

The child's exit status does not come on the socket but on the exit-status pipe: one line with the
return code as Popen gives it, -N for signal N (`status_line`), written by the child's keeper or, if
the keeper died first, by the server. A packet that does not decode, names an unknown kind, lacks a
field, has one too many or one of the wrong type is a ForkWireError that says which.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, ClassVar, Union

from harness.isolation.wire import protocol
from harness.isolation.wire.protocol import ProtocolError, preview

# The server's own start-up environment: forkclient.ServerHandle.launch sets it, the server pops
# it. The one variable the server sets in a child, protocol.KEEPER_PID_ENV, is the child's.
IMPORTS_ENV = "HARNESS_FORKSERVER_IMPORTS"  # comma-separated modules to import before serving
LISTEN_FD_ENV = "HARNESS_FORKSERVER_LISTEN_FD"
CONTROL_FD_ENV = "HARNESS_FORKSERVER_CONTROL_FD"  # the server's lifeline: it ends when the owner's end closes
TOKEN_FD_ENV = "HARNESS_FORKSERVER_TOKEN_FD"  # a pipe holding the run's token; the server reads it, then closes it
# Other processes of the run the server watches for a body's SIGSTOP besides its owner (an xdist
# worker's controller: a worker's own server would not see it stopped otherwise).
RUN_PIDS_ENV = "HARNESS_FORKSERVER_RUN_PIDS"
GO_FD_ENV = "HARNESS_FORKSERVER_GO_FD"  # if set: a pipe the server waits on before it imports (a byte, or EOF)
TOKEN_BYTES = 32  # of randomness: the token is their hex
# Read by torch_xla (C++) or the harness at each use, so a forked child may set them. Seen for
# XLA_DISABLE_FUNCTIONALIZATION and CPU_NUM_DEVICES on torch_xla 2.6-2.9: forked children with
# either changed give the same shardings, outputs and losses as fresh processes. Every other
# variable keys the server (forkclient.server_key), the case user included: a server drops to it
# before it imports (harness.isolation.system.dropuser). A spawn request for a forked child carries
# these only; one for a fresh child (argv) carries the whole environment.
POST_FORK_VARIABLES = frozenset(
    {
        "XLA_DISABLE_FUNCTIONALIZATION",
        "CPU_NUM_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        protocol.BACKEND_ENV,
        protocol.DEVICES_ENV,
        protocol.PRELOAD_ENV,
        protocol.RESULT_FD_ENV,
        protocol.LIFELINE_FD_ENV,
    }
)

SOCKET_FOLDER_PREFIX = "spmd-fork-"  # the private temp folder holding a server's socket
LISTEN_BACKLOG = 64
MAX_MESSAGE_BYTES = 1 << 16  # one packet; a longer one arrives cut and does not decode
MAX_PASSED_FDS = 16
# The descriptors a spawn request carries before the client's own: stdin, log, exit-status pipe.
FIXED_FDS = 3


class ForkWireError(ProtocolError):
    """A fork-server packet or exit-status line that is not a valid message."""


@dataclasses.dataclass(frozen=True)
class ServerReady:
    """Sent on every connection once the server has imported what it serves."""

    kind: ClassVar[str] = "ready"
    pid: int
    imported: list[str]
    threads: int  # running after the imports; a fork copies only the thread that forks
    startup_s: float
    containment: str  # "subreaper", or why escaped helpers cannot be contained here


@dataclasses.dataclass(frozen=True)
class SpawnRequest:
    """A child with stdin, log and exit-status pipe from the FIXED_FDS, and the descriptors after
    them open. `fds` are the client's numbers of those descriptors: `*_FD` variables in `env` name
    them so, and the child's are renumbered. Without `argv`, the child is forked from the server
    and sets `env` (POST_FORK_VARIABLES) over the server's; with it, the child execs `argv` with
    `env` as its whole environment (a fresh process)."""

    kind: ClassVar[str] = "spawn"
    token: str  # the run's token: only the run's own clients know it
    env: dict[str, str]
    fds: list[int]
    argv: list[str] | None


@dataclasses.dataclass(frozen=True)
class Spawned:
    kind: ClassVar[str] = "spawned"
    pid: int  # the child
    keeper: int  # its parent, which reports its exit status


@dataclasses.dataclass(frozen=True)
class SpawnFailed:
    kind: ClassVar[str] = "spawn-failed"
    error: str  # "Type: message" of what the server raised


Message = ServerReady | SpawnRequest | Spawned | SpawnFailed
MESSAGE_TYPES: dict[str, type[Any]] = {t.kind: t for t in (ServerReady, SpawnRequest, Spawned, SpawnFailed)}


def encode(message: Message) -> bytes:
    """One packet of strict JSON; ValueError for NaN/Infinity, TypeError for non-JSON values."""
    return json.dumps({"kind": message.kind, **dataclasses.asdict(message)}, allow_nan=False).encode()


def decode(packet: bytes, *expected: type[Any]) -> Any:
    """The message a packet holds, of one of the `expected` types if any are named; ForkWireError
    naming what is wrong otherwise."""
    try:
        data = protocol.strict_loads(packet)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ForkWireError(f"undecodable fork-server message ({exc}): {preview(packet)}") from None
    if not isinstance(data, dict) or data.get("kind") not in MESSAGE_TYPES:
        raise ForkWireError(f"not a fork-server message: {preview(packet)}")
    cls = MESSAGE_TYPES[data.pop("kind")]
    if expected and cls not in expected:
        wanted = " or ".join(repr(t.kind) for t in expected)
        raise ForkWireError(f"expected a {wanted} message, got {cls.kind!r}: {preview(packet)}")
    hints = typing.get_type_hints(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    missing = [name for name in names if name not in data]
    unknown = sorted(set(data) - set(names))
    wrong = [name for name in names if name in data and not _conforms(data[name], hints[name])]
    if missing or unknown or wrong:
        problems = [
            f"{what} {', '.join(found)}"
            for what, found in (("missing", missing), ("unknown", unknown), ("wrong type of", wrong))
            if found
        ]
        raise ForkWireError(f"malformed {cls.kind!r} message ({'; '.join(problems)}): {preview(packet)}")
    return cls(**data)


def status_line(returncode: int) -> bytes:
    """What a keeper (or the server) writes on the exit-status pipe."""
    return f"{returncode}\n".encode()


def parse_status(line: bytes) -> int:
    """The return code on an exit-status line (newline included)."""
    try:
        return int(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ForkWireError(f"not an exit status: {preview(line)}") from None


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded JSON value has the type a message field is declared with."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, arm) for arm in args)
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
