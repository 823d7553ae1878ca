"""A host's report, carried in its pod log as a framed, compressed, checksummed block.

`kubectl cp` cannot reach a finished pod, but its log stays readable while the Pod object exists,
so the worker prints the report as the last thing it does:

    ===== SPMD-HARNESS-REPORT BEGIN v1 sha256=<hex of the gzip bytes> size=<gzip byte count> =====
    <base64 of gzip(JSON), 76 characters a line>
    ===== SPMD-HARNESS-REPORT END =====

With a bucket configured, one line follows the block: `[worker] bucket: <outcome>` (the upload
runs after the block is printed, so that a pod torn down during it keeps its report).

The checksum catches a truncated or interleaved log; a missing block means the worker never got
to the end (killed, evicted, OOM). Both become a failed host with the reason, never a dropped one.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from typing import Any

from harness.gke.errors import ReportError

VERSION = 1
_BEGIN = "===== SPMD-HARNESS-REPORT BEGIN"
_END = "===== SPMD-HARNESS-REPORT END ====="
_BEGIN_RE = re.compile(r"^===== SPMD-HARNESS-REPORT BEGIN v(\d+) sha256=([0-9a-f]{64}) size=(\d+) =====$")
_LINE = 76
BUCKET_LINE = "[worker] bucket: "


class ReportMissing(ReportError):
    """No report block in the log."""


class ReportCorrupt(ReportError):
    """A report block that does not decode or does not match its checksum."""


def encode(report: dict[str, Any]) -> str:
    """The block for `report`, ending with a newline; print it in one write."""
    packed = gzip.compress(json.dumps(report, sort_keys=True).encode(), mtime=0)
    text = base64.b64encode(packed).decode()
    body = [text[i : i + _LINE] for i in range(0, len(text), _LINE)]
    header = f"{_BEGIN} v{VERSION} sha256={hashlib.sha256(packed).hexdigest()} size={len(packed)} ====="
    return "\n".join([header, *body, _END]) + "\n"


def decode(log: str) -> dict[str, Any]:
    """The report in the last block of `log`; ReportMissing/ReportCorrupt say why there is none."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_BEGIN)]
    if not starts:
        raise ReportMissing("no report block in the pod log (the worker did not finish: killed, evicted or OOM?)")
    start = starts[-1]  # a restarted container could leave an earlier, partial block
    match = _BEGIN_RE.match(lines[start].strip())
    if not match:
        raise ReportCorrupt(f"malformed report header: {lines[start][:120]!r}")
    version, digest, size = int(match.group(1)), match.group(2), int(match.group(3))
    if version != VERSION:
        raise ReportCorrupt(f"report block v{version}; this launcher reads v{VERSION}: use matching images")
    try:
        end = lines.index(_END, start + 1)
    except ValueError:
        raise ReportCorrupt("report block has no END marker (log truncated?)") from None
    return _unpack("".join(line.strip() for line in lines[start + 1 : end]), digest, size)


def bucket_outcome(log: str) -> str | None:
    """What the upload after the last block did, if the worker got to say so."""
    lines = log.splitlines()
    after = max((i for i, line in enumerate(lines) if line == _END), default=len(lines))
    outcomes = [line[len(BUCKET_LINE) :] for line in lines[after + 1 :] if line.startswith(BUCKET_LINE)]
    return outcomes[-1] if outcomes else None


def _unpack(text: str, digest: str, size: int) -> dict[str, Any]:
    try:
        packed = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ReportCorrupt(f"report block is not base64: {exc}") from None
    if len(packed) != size or hashlib.sha256(packed).hexdigest() != digest:
        raise ReportCorrupt(
            f"report block checksum mismatch ({len(packed)} bytes, header says {size}): "
            "the log was altered or interleaved"
        )
    try:
        report = json.loads(gzip.decompress(packed))
    except (OSError, ValueError) as exc:
        raise ReportCorrupt(f"report block does not decompress to JSON: {exc}") from None
    if not isinstance(report, dict):
        raise ReportCorrupt("report block holds no JSON object")
    return report
