"""The worker with a bucket that never answers: its report block must not wait for the upload.

The real worker runs as a process (`python -m harness.gke worker`) with the real google-cloud-storage
client pointed, through STORAGE_EMULATOR_HOST, at a socket that accepts connections and never
replies: what a worker sees when the bucket endpoint hangs. A pod torn down then (the JobSet is
deleted, the kubelet sends SIGKILL) must already have printed its block.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.gke import report_channel as rc
from harness.gke.collect import report_from_log

pytest.importorskip("google.cloud.storage", reason="google-cloud-storage comes with the test extra")

pytestmark = pytest.mark.selftest

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_SUITE = f"{sys.executable} {Path(__file__).with_name('gke_fake_suite.py')}"
END = "===== SPMD-HARNESS-REPORT END ====="
WAIT_S = 20.0  # well under the client's own 60 s timeout and 120 s retry deadline


@pytest.fixture
def silent_bucket() -> Iterator[str]:
    """host:port of a server that completes TCP handshakes (the kernel's backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


class Worker:
    """The worker process, its stdout collected line by line as the pod log would be."""

    def __init__(self, tmp_path: Path, bucket_host: str, *extra: str) -> None:
        env = {
            **os.environ,
            "MEGASCALE_SLICE_ID": "1",
            "MEGASCALE_NUM_SLICES": "2",
            "HARNESS_HOST_ID": "0",
            "HARNESS_POD_NAME": "p-1-0",
            "STORAGE_EMULATOR_HOST": bucket_host,
        }
        argv = [
            sys.executable,
            "-m",
            "harness.gke",
            "worker",
            "--results-dir",
            str(tmp_path / "results"),
            "--backend",
            "fake",
            "--suite-command",
            FAKE_SUITE,
            "--gcs-uri",
            "gs://nightly-reports/run-7",
            *extra,
        ]
        self.proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def test_the_block_is_printed_before_the_upload_so_a_teardown_during_it_keeps_the_report(tmp_path, silent_bucket):
    worker = Worker(tmp_path, silent_bucket)
    try:
        printed = worker.wait_for(END, WAIT_S)
        assert worker.proc.poll() is None, "the upload ended before the teardown: the test shows nothing"
    finally:
        worker.kill()  # the pod is torn down while the upload hangs
    assert printed, f"no report block within {WAIT_S:.0f}s while the upload hung:\n{worker.log[-2000:]}"
    report = rc.decode(worker.log)
    assert report["error"] is None and [r["outcome"] for r in report["records"]] == ["passed", "xfailed"]
    assert report["bucket"].startswith("uploading to gs://nightly-reports/run-7/slice1-host0.json")


def test_the_upload_is_bounded_and_its_outcome_follows_the_block(tmp_path, silent_bucket):
    started = time.monotonic()
    worker = Worker(tmp_path, silent_bucket, "--upload-timeout", "2s")
    try:
        code = worker.proc.wait(WAIT_S)
    finally:
        worker.kill()
    assert time.monotonic() - started < WAIT_S
    assert code == 0, worker.log[-2000:]  # the suite ran: a failed upload is reported, not fatal
    last = worker.lines[-1]
    assert last.startswith("[worker] bucket: not uploaded:") and "2s" in last, last
    # The launcher reads the line after the block into the host's report.
    report = report_from_log(worker.log, 1, 0, "p-1-0")
    assert report.error is None and report.bucket == last.removeprefix("[worker] bucket: ").strip()
