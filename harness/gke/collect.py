"""Turn one host's log into a HostReport (GKE pods and --local processes alike)."""

from __future__ import annotations

from harness.gke import report_channel
from harness.gke.errors import ReportError
from harness.gke.hostreport import HostReport

TAIL_LINES = 30


def report_from_log(log: str | None, slice_id: int, host_id: int, pod: str, status: str = "") -> HostReport:
    """The host's decoded report; a failed HostReport naming why if there is none to trust.

    `status` is how the pod/process ended (e.g. "pod Failed, terminated: OOMKilled exit 137"); it
    goes into the reason so a missing block comes with its most likely cause.
    """
    where = f" ({status})" if status else ""
    if log is None:
        return HostReport.failed(slice_id, host_id, pod, f"pod log unavailable{where}")
    try:
        report = HostReport.from_dict(report_channel.decode(log))
    except ReportError as exc:
        return HostReport.failed(slice_id, host_id, pod, f"{exc}{where}", _tail(log))
    except (TypeError, ValueError) as exc:  # decodes, but is not a HostReport
        return HostReport.failed(
            slice_id, host_id, pod, f"report block has unexpected fields: {exc}{where}", _tail(log)
        )
    if (report.slice_id, report.host_id) != (slice_id, host_id):
        report.error = (
            f"report says slice {report.slice_id} host {report.host_id} but it came from slice "
            f"{slice_id} host {host_id}: the MEGASCALE/worker-id env wiring is wrong"
        )
        report.slice_id, report.host_id = slice_id, host_id
    report.pod = pod
    report.bucket = report_channel.bucket_outcome(log) or report.bucket
    return report


def _tail(log: str) -> list[str]:
    return log.splitlines()[-TAIL_LINES:]
