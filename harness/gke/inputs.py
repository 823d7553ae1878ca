"""The launcher's inputs, checked before the cluster is contacted.

What the API server or the kubelet would refuse is refused here, naming the flag: a bad image
reference otherwise surfaces as pods in InvalidImageName on TPU nodes that were scaled up for
them, a bad namespace as an HTTP 422 after the run began, a non-gs:// bucket URI as "not
uploaded" in every host report hours later.

The image grammar is the container image reference one (what the kubelet parses):
    [DOMAIN[:PORT]/]PATH[:TAG][@ALGORITHM:HEX]
PATH is lower-case components separated by '/', each joined inside by '.', '_', '__' or dashes.
"""

from __future__ import annotations

import re

from harness.errors import HarnessUsageError

_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"(?P<algorithm>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):(?P<hex>[0-9a-fA-F]{32,})"
_IMAGE_RE = re.compile(rf"^(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?$")
_NAME_MAX = 255
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
IMAGE_FORM = "[REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:HEX], repository in lower case"

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")


def check_image(image: str) -> str:
    """`image` if the kubelet can parse it, else a usage error naming --image."""
    problem = _image_problem(image)
    if problem:
        raise HarnessUsageError(
            f"--image {image!r} is not an image reference the nodes can pull: {problem}; "
            f"expected {IMAGE_FORM}, e.g. REGION-docker.pkg.dev/PROJECT/REPO/spmd-worker:TAG"
        )
    return image


def _image_problem(image: str) -> str | None:
    if image != image.strip() or any(c.isspace() for c in image):
        return "it contains whitespace"
    match = _IMAGE_RE.match(image)
    if not match:
        return "it does not follow the reference syntax"
    if len(match.group("name")) > _NAME_MAX:
        return f"the name part is longer than {_NAME_MAX} characters"
    wanted = _DIGEST_HEX.get((match.group("algorithm") or "").lower())
    if wanted and len(match.group("hex")) != wanted:
        return f"a {match.group('algorithm')} digest has {wanted} hex digits, this one {len(match.group('hex'))}"
    return None


def check_namespace(namespace: str) -> str:
    """`namespace` if the API server accepts it as a namespace name (a DNS-1123 label)."""
    if len(namespace) > DNS_LABEL_MAX or not _DNS_LABEL_RE.match(namespace):
        raise HarnessUsageError(
            f"--namespace {namespace!r} is not a valid namespace name: use at most {DNS_LABEL_MAX} lower-case "
            "letters, digits and '-', starting and ending with a letter or digit (e.g. spmd-harness)"
        )
    return namespace


def check_gcs_uri(uri: str | None) -> str | None:
    """`uri` if it is gs://BUCKET[/PREFIX] with a possible bucket name (None: no bucket copy)."""
    if uri is None or uri == "":
        return None
    problem = _gcs_problem(uri)
    if problem:
        raise HarnessUsageError(
            f"--gcs-uri {uri!r} {problem}; expected gs://BUCKET[/PREFIX], or leave it "
            "empty for no bucket copy (its default comes from SPMD_HARNESS_GCS_URI)"
        )
    return uri


def _gcs_problem(uri: str) -> str | None:
    if not uri.startswith("gs://"):
        return "is not a gs:// URI (the worker uploads with the Cloud Storage client only)"
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    # Bucket naming rules: 3-63 characters (222 with dots, 63 per dot-separated part).
    too_long = len(bucket) > 222 or any(len(part) > 63 for part in bucket.split("."))
    if len(bucket) < 3 or too_long or not _BUCKET_RE.match(bucket):
        return (
            f"names bucket {bucket!r}, which cannot exist: bucket names have 3-63 lower-case letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    if "\n" in prefix or "\r" in prefix:
        return "has a line break in its object prefix"
    return None
