"""The worker's bucket copy, through the real google-cloud-storage client against a local emulator.

gcp-storage-emulator serves the GCS JSON API over real HTTP on 127.0.0.1; the client talks to it
because STORAGE_EMULATOR_HOST is set. Both come with the test extra; without them the tests skip.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from harness.gke import bucket

pytestmark = pytest.mark.selftest
emulator_server = pytest.importorskip(
    "gcp_storage_emulator.server", reason="gcp-storage-emulator comes with the test extra"
)
storage = pytest.importorskip("google.cloud.storage", reason="google-cloud-storage comes with the test extra")

BUCKET = "nightly-reports"


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = emulator_server.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    try:
        yield storage.Client(project="test")
    finally:
        server.stop()


def test_a_host_report_lands_in_the_bucket(gcs) -> None:
    status = bucket.publish(f"gs://{BUCKET}/run-7", "slice1-host0.json", b'{"slice_id": 1}')
    assert status == f"uploaded gs://{BUCKET}/run-7/slice1-host0.json"
    blob = gcs.bucket(BUCKET).blob("run-7/slice1-host0.json")
    assert blob.download_as_bytes() == b'{"slice_id": 1}'
    blob.reload()
    assert blob.content_type == "application/json"


def test_a_missing_bucket_is_reported_not_raised(gcs) -> None:
    status = bucket.publish("gs://no-such-bucket", "slice0-host0.json", b"{}")
    assert status.startswith("not uploaded: NotFound"), status


@pytest.mark.parametrize(
    "uri, status",
    [
        (None, "not configured"),
        ("", "not configured"),
        ("s3://elsewhere/x", "not uploaded: 's3://elsewhere/x' is not a gs:// URI"),
    ],
)
def test_unconfigured_or_foreign_uris_upload_nothing(uri, status) -> None:
    assert bucket.publish(uri, "x.json", b"{}") == status
