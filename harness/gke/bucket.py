"""The optional second report channel: each GKE worker copies its host report to a GCS bucket.

Skipped unless configured (--gcs-uri or SPMD_HARNESS_GCS_URI, which the launcher sets in the pod
env). The pod log block is the channel the launcher reads; the bucket copy is for people and for
runs whose logs are gone. The worker image installs `google-cloud-storage` (pyproject's `tpu`
extra); the pods run on the host network, where Workload Identity Federation for GKE does not
apply, so the client's default credentials are the TPU node pools' service account (k8s/README.md,
Prerequisites). Tested with the real client against a local GCS emulator
(`STORAGE_EMULATOR_HOST`, tests/gke/test_gke_bucket.py). A failure is reported, never hidden.

The upload is bounded: the client's own retries (a 120 s deadline by default) are off, each
request has a timeout, and the whole upload, credential lookup included, gets `timeout_s` of wall
time in a daemon thread; past that the worker gives up and says so. The worker prints its report
block before uploading, so a pod torn down meanwhile still has its report in the log.
"""

from __future__ import annotations

import threading

UPLOAD_TIMEOUT_S = 30.0


def skip_reason(uri: str | None) -> str | None:
    """Why `uri` will not be uploaded to, known before trying; None if an upload will be tried."""
    if not uri:
        return "not configured"
    if not uri.startswith("gs://"):
        return f"not uploaded: {uri!r} is not a gs:// URI"
    try:
        from google.cloud import storage  # noqa: F401 - only whether it imports (optional, image-only)
    except ImportError:
        return "not uploaded: google-cloud-storage is not installed in the worker image"
    return None


def object_uri(uri: str, object_name: str) -> str:
    bucket_name, _, prefix = uri[len("gs://") :].partition("/")
    return f"gs://{bucket_name}/{prefix.rstrip('/')}/{object_name}" if prefix else f"gs://{bucket_name}/{object_name}"


def publish(uri: str | None, object_name: str, payload: bytes, timeout_s: float = UPLOAD_TIMEOUT_S) -> str:
    """Upload `payload` to `<uri>/<object_name>` within `timeout_s`; returns what happened, for the report."""
    skipped = skip_reason(uri)
    if skipped or uri is None:
        return skipped or "not configured"
    target = object_uri(uri, object_name)
    outcome: list[str] = []
    worker = threading.Thread(
        target=lambda: outcome.append(_upload(target, payload, timeout_s)), name="bucket-upload", daemon=True
    )  # daemon: an upload that hangs never holds exit
    worker.start()
    worker.join(timeout_s)
    return outcome[0] if outcome else f"not uploaded: no answer within {timeout_s:.0f}s from {target}; gave up"


def _upload(target: str, payload: bytes, timeout_s: float) -> str:
    from google.cloud import storage

    bucket_name, _, path = target[len("gs://") :].partition("/")
    try:
        blob = storage.Client().bucket(bucket_name).blob(path)
        blob.upload_from_string(payload, content_type="application/json", timeout=timeout_s, retry=None)
    except Exception as exc:  # any client/auth/network error: report it, the log block still counts
        return f"not uploaded: {type(exc).__name__}: {exc}"
    return f"uploaded {target}"
