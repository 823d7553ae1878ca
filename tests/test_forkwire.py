"""The fork server's wire (harness.isolation.wire.forkwire): every message survives a round trip, and
a malformed one is refused with an error that says what is wrong, by the decoder and by a live
server."""

from __future__ import annotations

import socket
import sys

import pytest

from harness.isolation.parent.forkclient import EXEC_IMPORTS, ServerHandle
from harness.isolation.wire import forkwire, protocol
from harness.isolation.wire.forkwire import ForkWireError, ServerReady, Spawned, SpawnFailed, SpawnRequest

pytestmark = pytest.mark.selftest

MESSAGES = [
    ServerReady(pid=12, imported=["torch", "torch_xla"], threads=3, startup_s=4.25, containment="subreaper"),
    SpawnRequest(
        token="ab" * 32, env={protocol.RESULT_FD_ENV: "7", protocol.BACKEND_ENV: "cpu"}, fds=[7, 9], argv=None
    ),
    SpawnRequest(
        token="cd" * 32, env={"PATH": "/usr/bin"}, fds=[], argv=[sys.executable, "-m", "harness.isolation.child"]
    ),
    Spawned(pid=100, keeper=99),
    SpawnFailed(error="ValueError: a spawn request carries at least 3 descriptors, got 1"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_every_message_survives_a_round_trip(message):
    packet = forkwire.encode(message)
    assert len(packet) <= forkwire.MAX_MESSAGE_BYTES
    assert forkwire.decode(packet) == message
    assert forkwire.decode(packet, type(message)) == message


@pytest.mark.parametrize(
    "packet, says",
    [
        (b"\xff\xfe", "undecodable"),
        (b'{"kind": "spawned", "pid": 1', "undecodable"),
        (
            b'{"kind": "ready", "pid": 1, "imported": [], "threads": 1, "startup_s": NaN, "containment": ""}',
            "undecodable",
        ),
        (b"[1, 2]", "not a fork-server message"),
        (b'{"pid": 1, "keeper": 2}', "not a fork-server message"),
        (b'{"kind": "fork", "pid": 1}', "not a fork-server message"),
        (b'{"kind": "spawned", "pid": 1}', "missing keeper"),
        (b'{"kind": "spawned", "pid": 1, "keeper": 2, "extra": 3}', "unknown extra"),
        (b'{"kind": "spawned", "pid": "1", "keeper": 2}', "wrong type of pid"),
        (b'{"kind": "spawned", "pid": true, "keeper": 2}', "wrong type of pid"),
        (b'{"kind": "spawn", "token": "t", "env": {"A": 1}, "fds": [], "argv": null}', "wrong type of env"),
        (b'{"kind": "spawn", "token": "t", "env": {}, "fds": [3, "4"], "argv": null}', "wrong type of fds"),
        (b'{"kind": "spawn", "token": "t", "env": {}, "fds": []}', "missing argv"),
        (b'{"kind": "spawn", "env": {}, "fds": [], "argv": null}', "missing token"),
    ],
)
def test_a_malformed_message_is_refused_saying_what_is_wrong(packet, says):
    with pytest.raises(ForkWireError, match=says):
        forkwire.decode(packet)


def test_a_message_of_another_kind_than_expected_is_refused():
    with pytest.raises(ForkWireError, match="expected a 'spawned' message, got 'ready'"):
        forkwire.decode(forkwire.encode(MESSAGES[0]), Spawned)


def test_nan_is_not_sent():
    with pytest.raises(ValueError):
        forkwire.encode(ServerReady(pid=1, imported=[], threads=1, startup_s=float("nan"), containment=""))


def test_the_wire_errors_are_protocol_errors():
    assert issubclass(ForkWireError, protocol.ProtocolError)


@pytest.mark.parametrize("code", [0, 3, -6, -9])
def test_exit_status_lines_round_trip(code):
    assert forkwire.parse_status(forkwire.status_line(code)) == code


def test_a_garbled_exit_status_is_refused():
    with pytest.raises(ForkWireError, match="not an exit status"):
        forkwire.parse_status(b"SIGABRT\n")


def test_post_fork_variables_are_the_protocols_names():
    assert {
        protocol.BACKEND_ENV,
        protocol.DEVICES_ENV,
        protocol.PRELOAD_ENV,
        protocol.RESULT_FD_ENV,
        protocol.LIFELINE_FD_ENV,
    } <= forkwire.POST_FORK_VARIABLES
    assert protocol.KEEPER_PID_ENV not in forkwire.POST_FORK_VARIABLES  # the server sets it
    # The case user keys the server, which drops to it before it imports the build (issue 51).
    assert protocol.CASE_USER_ENV not in forkwire.POST_FORK_VARIABLES


def test_a_live_server_answers_a_malformed_request_with_spawn_failed_and_goes_on(tmp_path):
    server = ServerHandle(sys.executable, {}, EXEC_IMPORTS, tmp_path)
    try:
        for _ in range(2):  # the second connection: the server still serves
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.settimeout(30)
                sock.connect(server.address.path)
                assert isinstance(forkwire.decode(sock.recv(forkwire.MAX_MESSAGE_BYTES)), ServerReady)
                sock.send(b'{"kind": "spawn", "token": "t", "env": {}, "fds": []}')
                reply = forkwire.decode(sock.recv(forkwire.MAX_MESSAGE_BYTES), SpawnFailed)
                assert reply.error.startswith("ForkWireError: malformed 'spawn' message (missing argv)")
        assert server.is_alive()
    finally:
        server.close()
