"""The pod-log report block: round trip, and every way it can be missing or damaged."""

from __future__ import annotations

import pytest

from harness.gke import report_channel as rc

pytestmark = pytest.mark.selftest

REPORT = {"slice_id": 1, "host_id": 0, "records": [{"nodeid": "a::b", "shardings": {"w": "{replicated}"}}] * 50}


def test_round_trip_through_a_noisy_log() -> None:
    log = "pytest output\n" * 100 + rc.encode(REPORT) + "kubelet: container exited\n"
    assert rc.decode(log) == REPORT


def test_last_block_wins() -> None:
    log = rc.encode({"attempt": 1}) + "noise\n" + rc.encode({"attempt": 2})
    assert rc.decode(log) == {"attempt": 2}


def test_block_lines_are_short_and_framed() -> None:
    lines = rc.encode(REPORT).splitlines()
    assert lines[0].startswith("===== SPMD-HARNESS-REPORT BEGIN v1 sha256=")
    assert lines[-1] == "===== SPMD-HARNESS-REPORT END ====="
    assert all(len(line) <= 76 for line in lines[1:-1])


@pytest.mark.parametrize(
    "damage, error, message",
    [
        # no block at all: the worker never reached its end
        (lambda b: "only pytest output\n", rc.ReportMissing, "no report block"),
        # cut before the END marker: a truncated log
        (lambda b: b.rsplit("=====", 2)[0], rc.ReportCorrupt, "no END marker"),
        # one base64 character changed: checksum
        (lambda b: b.replace(b.splitlines()[2], "A" * len(b.splitlines()[2]), 1), rc.ReportCorrupt, "checksum|base64"),
        # another process's line interleaved inside the block
        (lambda b: b.replace("\n", "\nINFO interleaved\n", 2), rc.ReportCorrupt, "base64|checksum"),
        # a header from a future schema
        (lambda b: b.replace("BEGIN v1 ", "BEGIN v9 ", 1), rc.ReportCorrupt, "v9"),
        # a header without its checksum
        (lambda b: b.replace(" sha256=", " sha=", 1), rc.ReportCorrupt, "malformed"),
    ],
)
def test_damaged_blocks_are_reported_not_dropped(damage, error, message) -> None:
    with pytest.raises(error, match=message):
        rc.decode(damage(rc.encode(REPORT)))
