"""The entrypoint each TPU host runs: the SPMD suite, then its report block on stdout.

    python -m harness.gke worker --results-dir /results [--backend tpu] [-- EXTRA_PYTEST_ARGS]

It always prints a report block (then, with a bucket configured, one line saying whether the
bucket copy was uploaded), also when the suite crashed, hung past
--suite-timeout or could not start: the launcher must be able to tell "host failed, here is why"
from "host never reported". Its exit code says whether the harness worked (0: the suite ran and
judged its cases; 1: it did not, see the report's error), not whether cases passed: verdicts travel
in the report.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from harness.errors import HarnessUsageError
from harness.gke import bucket, report_channel
from harness.gke.hostreport import HostReport
from harness.isolation.system import processes
from harness.records import runfolder
from harness.records.results import CaseRecord, read_records, suite_exit_problem

DEFAULT_SUITE = "{python} -m pytest -m spmd"
TAIL_LINES = 40
KILL_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where this host sits, from the env its pod gets (k8s/base/jobset.yaml) or --local sets."""

    slice_id: int
    host_id: int
    num_slices: int
    pod: str

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Placement:
        host = env.get("HARNESS_HOST_ID") or env.get("TPU_WORKER_ID") or env.get("JOB_COMPLETION_INDEX") or "0"
        return cls(
            slice_id=_int_env(env, "MEGASCALE_SLICE_ID", "0"),
            host_id=_int_value("HARNESS_HOST_ID/TPU_WORKER_ID", host),
            num_slices=_int_env(env, "MEGASCALE_NUM_SLICES", "1"),
            pod=env.get("HARNESS_POD_NAME") or socket.gethostname(),
        )


def _int_env(env: dict[str, str], name: str, default: str) -> int:
    return _int_value(name, env.get(name) or default)


def _int_value(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise HarnessUsageError(f"{name}={value!r} is not an integer; check the pod's env wiring") from None


@dataclasses.dataclass
class WorkerOptions:
    results_dir: Path
    backend: str = "tpu"
    suite_command: str = DEFAULT_SUITE  # "{python}" becomes this interpreter
    suite_timeout_s: float = 4 * 3600.0
    extra_args: Sequence[str] = ()
    gcs_uri: str | None = None
    upload_timeout_s: float = bucket.UPLOAD_TIMEOUT_S


def suite_argv(opts: WorkerOptions) -> list[str]:
    base = shlex.split(opts.suite_command.replace("{python}", shlex.quote(sys.executable)))
    results = str(opts.results_dir)
    # --opt=value: pytest picks its rootdir and config before plugin options exist, so a separate
    # value (/results) would be read as a test path and the repo's pytest config dropped.
    return [
        *base,
        f"--spmd-backend={opts.backend}",
        f"--spmd-results-dir={results}",
        f"--junitxml={opts.results_dir / runfolder.JUNIT_NAME}",
        *opts.extra_args,
    ]


def run_worker(opts: WorkerOptions, env: dict[str, str], out: IO[str]) -> int:
    """Run the suite, print its output and then the report block to `out`; 0 if the suite ran.

    `env` is the whole environment (placement is read from it; the suite runs with it). Whatever
    fails in between (bad env, unreadable verdicts), the block is still printed.
    """
    report = HostReport(slice_id=-1, host_id=-1, pod=env.get("HARNESS_POD_NAME", ""))
    try:
        placement = Placement.from_env(env)
        _check_results_dir(opts.results_dir)
        argv = suite_argv(opts)
        print(
            f"[worker] {placement.pod}: slice {placement.slice_id} of {placement.num_slices}, "
            f"host {placement.host_id}: {shlex.join(argv)}",
            file=out,
            flush=True,
        )
        report = _run_suite(argv, placement, opts, env, out)
        report.records = _tagged_records(opts.results_dir, placement)
        report.error = report.error or _suite_error(report)
    except Exception as exc:  # turned into the report's error, never lost
        report.error = report.error or f"worker error: {type(exc).__name__}: {exc}"
    finally:
        _publish(report, opts, out)
    return 0 if report.error is None else 1


def _check_results_dir(results_dir: Path) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    if runfolder.resolve(results_dir) is not None:  # the host's records would be mixed with older ones
        raise HarnessUsageError(f"{results_dir} already holds verdicts; give the worker an empty --results-dir")


def _run_suite(
    argv: list[str], placement: Placement, opts: WorkerOptions, env: dict[str, str], out: IO[str]
) -> HostReport:
    report = HostReport(slice_id=placement.slice_id, host_id=placement.host_id, pod=placement.pod, suite_command=argv)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    start = time.monotonic()
    try:
        proc = processes.start_in_session(argv, env=env, stdout=subprocess.PIPE, text=True)
    except OSError as exc:
        report.error = f"could not start the suite: {exc}"
        return report
    with proc:  # closes the pipe however the suite ended
        pump = threading.Thread(target=_pump, args=(proc.stdout, out, tail), daemon=True)
        pump.start()
        report.timed_out = not _wait(proc, opts.suite_timeout_s)
        pump.join(KILL_GRACE_S)
    report.duration_s = round(time.monotonic() - start, 3)
    report.log_tail = list(tail)
    _set_exit(report, proc.returncode)
    return report


def _pump(stream: IO[str] | None, out: IO[str], tail: collections.deque[str]) -> None:
    """Copy the suite's output to ours line by line (the pod log) and keep its tail."""
    assert stream is not None
    for line in stream:
        out.write(line)
        out.flush()
        tail.append(line.rstrip("\n"))


def _wait(proc: subprocess.Popen[str], timeout_s: float) -> bool:
    """Wait for the suite; past the timeout, end its process group (SIGTERM, then SIGKILL). True if it ended."""
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        processes.terminate_group(proc, KILL_GRACE_S)
        return False
    finally:
        processes.kill_group_now(proc)  # whatever the suite left behind goes with it


def _set_exit(report: HostReport, returncode: int | None) -> None:
    if returncode is not None and returncode < 0:
        report.signal = processes.signal_name(-returncode)
    elif returncode is not None:
        report.exit_code = returncode


def _suite_error(report: HostReport) -> str | None:
    if report.timed_out:
        return f"suite still running after the suite timeout; killed ({report.signal or 'exited'})"
    if report.signal:
        return f"suite died of {report.signal}"
    problem = suite_exit_problem(report.exit_code)
    if problem:
        return f"suite: {problem}"
    if not report.records:
        return "suite ran but recorded no case (is the spmd plugin installed and --spmd-results-dir honoured?)"
    return None


def _tagged_records(results_dir: Path, placement: Placement) -> list[CaseRecord]:
    try:
        records = list(read_records(results_dir))
    except ValueError as exc:  # a verdict line cut short by a crash
        raise RuntimeError(f"unreadable verdicts in {results_dir}: {exc}") from exc
    for record in records:
        record.slice_id, record.host_id = placement.slice_id, placement.host_id
    return records


def _publish(report: HostReport, opts: WorkerOptions, out: IO[str]) -> None:
    """report.json next to the JUnit XML, the block in one write, then the optional bucket copy.

    The block goes first: the upload can take until its timeout, and a pod torn down meanwhile
    (the JobSet deleted, a node drained) keeps its report. The upload's outcome follows as one
    line the launcher reads after the block (report_channel.BUCKET_LINE)."""
    name = f"slice{report.slice_id}-host{report.host_id}.json"
    skipped = bucket.skip_reason(opts.gcs_uri)
    report.bucket = skipped or (
        f"uploading to {bucket.object_uri(opts.gcs_uri or '', name)} after the report was "
        "printed; the outcome is on the line after the block"
    )
    payload = json.dumps(report.to_dict(), sort_keys=True, indent=1)
    try:
        (opts.results_dir / "report.json").write_text(payload)
    except OSError as exc:  # the log block below is the channel that counts
        print(f"[worker] could not write report.json: {exc}", file=out)
    out.write(report_channel.encode(report.to_dict()))
    out.flush()
    if skipped is None:
        outcome = bucket.publish(opts.gcs_uri, name, payload.encode(), opts.upload_timeout_s)
        out.write(f"{report_channel.BUCKET_LINE}{outcome}\n")
        out.flush()
