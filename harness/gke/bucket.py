"""The optional second report channel: each GKE worker copies its host report to a GCS bucket.

Skipped unless configured (--gcs-uri or SPMD_HARNESS_GCS_URI, which the launcher sets in the pod
env). The pod log block is the channel the launcher reads; the bucket copy is for people and for
runs whose logs are gone. The worker image installs `google-cloud-storage` (pyproject's `tpu`
extra); the pods run on the host network, where Workload Identity Federation for GKE does not
apply, so the client's default credentials are the TPU node pools' service account (k8s/README.md,
Prerequisites). Tested with the real client against a local GCS emulator
(`STORAGE_EMULATOR_HOST`, tests/gke/test_gke_bucket.py). A failure is reported, never hidden.
"""

from __future__ import annotations


def publish(uri: str | None, object_name: str, payload: bytes) -> str:
    """Upload `payload` to `<uri>/<object_name>`; returns what happened, for the report."""
    if not uri:
        return "not configured"
    if not uri.startswith("gs://"):
        return f"not uploaded: {uri!r} is not a gs:// URI"
    try:
        from google.cloud import storage  # type: ignore[import-not-found]  # optional, image-only
    except ImportError:
        return "not uploaded: google-cloud-storage is not installed in the worker image"
    bucket_name, _, prefix = uri[len("gs://") :].partition("/")
    path = f"{prefix.rstrip('/')}/{object_name}" if prefix else object_name
    try:
        storage.Client().bucket(bucket_name).blob(path).upload_from_string(payload, content_type="application/json")
    except Exception as exc:  # any client/auth/network error: report it, the log block still counts
        return f"not uploaded: {type(exc).__name__}: {exc}"
    return f"uploaded gs://{bucket_name}/{path}"
