"""Run the SPMD suite on N TPU slices: create the JobSet, watch it, collect, clean up.

    python -m harness.gke run --accelerator v6e --topology 4x4 --slices 2 --image IMAGE

The JobSet is deleted at the end, on timeout and on Ctrl-C (unless --keep); reports are read
from the pod logs before that, so a timed-out run still shows what each host got to.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import IO, Any

from harness.gke import aggregate as agg
from harness.gke import inputs, manifest, stuck
from harness.gke.accelerators import AcceleratorType
from harness.gke.collect import report_from_log
from harness.gke.errors import JobSetExistsError, PodStuckError
from harness.gke.hostreport import HostReport
from harness.gke.kube import RUN_ID_ANNOTATION, Kube, PodState

PHASES = ("Pending", "Running", "Succeeded", "Failed")


@dataclasses.dataclass
class RunConfig:
    accel: AcceleratorType
    slices: int
    image: str
    out_dir: Path
    namespace: str = manifest.BASE_NAME
    name: str = ""  # default: spmd-<random>, unique per run
    timeout_s: float = 3 * 3600.0
    keep: bool = False
    gcs_uri: str | None = None
    job_size: str | None = None  # the training job's decoder (--spmd-job-size); None: the suite's default
    watch_segment_s: float = 30.0  # longest quiet stretch between progress checks
    pull_error_grace_s: float = stuck.PULL_ERROR_GRACE_S  # how long ErrImagePull may last (harness/gke/stuck.py)

    def __post_init__(self) -> None:
        # Everything the API server or the nodes would refuse, refused before the cluster is contacted.
        self.name = manifest.check_name(self.name or f"spmd-{uuid.uuid4().hex[:8]}")
        self.image = inputs.check_image(self.image)
        self.namespace = inputs.check_namespace(self.namespace)
        self.gcs_uri = inputs.check_gcs_uri(self.gcs_uri)
        if self.job_size is not None:
            self.job_size = manifest.check_job_size(self.job_size)


def render(cfg: RunConfig) -> list[manifest.Manifest]:
    return manifest.render(
        cfg.accel,
        cfg.slices,
        cfg.image,
        name=cfg.name,
        namespace=cfg.namespace,
        gcs_uri=cfg.gcs_uri,
        job_size=cfg.job_size,
    )


def run(cfg: RunConfig, kube: Kube, out: IO[str]) -> agg.Aggregate:
    """The whole run; the Aggregate says whether it passed. Raises on API errors and Ctrl-C."""
    docs = render(cfg)
    jobset = manifest.find(docs, "JobSet")
    jobset["metadata"].setdefault("annotations", {})[RUN_ID_ANNOTATION] = uuid.uuid4().hex
    kube.check_jobset_installed()  # before anything is created
    for doc in docs:
        if doc["kind"] != "JobSet":
            kube.ensure(doc)
    try:
        kube.create_jobset(jobset)
    except JobSetExistsError:
        raise  # someone else's: never delete it
    except BaseException:
        _cleanup(cfg, kube, out)
        raise
    _say(
        out,
        f"created JobSet {cfg.namespace}/{cfg.name}: {cfg.slices} x {cfg.accel.name} {cfg.accel.topology} "
        f"({cfg.accel.hosts_per_slice} hosts per slice)",
    )
    try:
        problems = wait_for_end(cfg, kube, out)
        reports = collect(cfg, kube, out)
        result = agg.aggregate(reports, cfg.slices, cfg.accel.hosts_per_slice, problems)
        agg.write_all(result, cfg.out_dir, run_meta(cfg))
        return result
    finally:
        _cleanup(cfg, kube, out)


def run_meta(cfg: RunConfig) -> dict[str, Any]:
    return {
        "mode": "gke",
        "jobset": f"{cfg.namespace}/{cfg.name}",
        "accelerator": cfg.accel.gke_accelerator,
        "topology": cfg.accel.topology,
        "slices": cfg.slices,
        "hosts_per_slice": cfg.accel.hosts_per_slice,
        "image": cfg.image,
    }


def wait_for_end(cfg: RunConfig, kube: Kube, out: IO[str]) -> list[str]:
    """Watch until Completed/Failed, a pod that cannot start, or the deadline; returns the run-level
    problems (none if Completed). Pods are looked at on every JobSet change and at least once per
    watch segment, so a stuck one is seen within about watch_segment_s."""
    deadline = time.monotonic() + cfg.timeout_s
    progress = PodProgress(out, cfg.slices)
    stuck_pods = stuck.StuckWatch(cfg.namespace, cfg.pull_error_grace_s)
    while (remaining := deadline - time.monotonic()) > 0:
        for jobset in kube.watch_jobset(cfg.namespace, cfg.name, min(cfg.watch_segment_s, remaining)):
            if jobset is None:
                return [f"JobSet {cfg.namespace}/{cfg.name} disappeared before finishing (deleted by someone?)"]
            pods = kube.list_pods(cfg.namespace, cfg.name)
            progress.show(pods)
            try:
                stuck_pods.check(pods)
            except PodStuckError as exc:
                _say(out, f"stopping the run: {exc}")
                return [str(exc)]
            state, message = terminal_state(jobset)
            if state == "Completed":
                _say(out, "JobSet Completed")
                return []
            if state == "Failed":
                _say(out, f"JobSet Failed: {message}")
                return [f"JobSet Failed: {message}"]
            if time.monotonic() >= deadline:
                break
    _say(out, f"timeout: JobSet not finished after {cfg.timeout_s:.0f}s; collecting what the hosts reported")
    return [f"timeout: JobSet {cfg.namespace}/{cfg.name} did not finish within {cfg.timeout_s:.0f}s"]


def terminal_state(jobset: manifest.Manifest) -> tuple[str | None, str]:
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Completed", "Failed") and cond.get("status") == "True":
            return cond["type"], f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return None, ""


def collect(cfg: RunConfig, kube: Kube, out: IO[str]) -> list[HostReport]:
    """Every pod's report; pods that are missing show up as failed hosts in aggregate()."""
    reports = []
    for pod in kube.list_pods(cfg.namespace, cfg.name):
        log = kube.read_log(cfg.namespace, pod.name)
        status = f"pod {pod.phase}" + (f", {pod.detail}" if pod.detail else "")
        report = report_from_log(log, pod.slice_id, pod.host_id, pod.name, status)
        if pod.phase == "Failed" and not report.error:
            report.error = f"pod failed after reporting ({pod.detail or 'no detail'})"
        reports.append(report)
    _say(out, f"collected {len(reports)} host report(s)")
    return reports


def _cleanup(cfg: RunConfig, kube: Kube, out: IO[str]) -> None:
    if cfg.keep:
        _say(out, f"kept JobSet (--keep); delete it with: kubectl delete jobset {cfg.name} -n {cfg.namespace}")
        return
    try:
        deleted = kube.delete_jobset(cfg.namespace, cfg.name)
    except Exception as exc:  # never mask the run's own outcome or exception
        _say(
            out,
            f"WARNING: could not delete JobSet {cfg.namespace}/{cfg.name}: {exc}; "
            f"run: kubectl delete jobset {cfg.name} -n {cfg.namespace}",
        )
        return
    _say(out, f"deleted JobSet {cfg.namespace}/{cfg.name}" if deleted else "JobSet already gone")


class PodProgress:
    """One line per change: pods pending/running/succeeded/failed per slice."""

    def __init__(self, out: IO[str], slices: int) -> None:
        self._out, self._slices, self._last, self._start = out, slices, "", time.monotonic()

    def show(self, pods: list[PodState]) -> None:
        line = " | ".join(self._slice(s, pods) for s in range(self._slices))
        if line != self._last:
            self._last = line
            _say(self._out, f"[{time.monotonic() - self._start:6.0f}s] {line}")

    @staticmethod
    def _slice(slice_id: int, pods: list[PodState]) -> str:
        mine = [p for p in pods if p.slice_id == slice_id]
        counts = ", ".join(f"{sum(p.phase == ph for p in mine)} {ph.lower()}" for ph in PHASES)
        return f"slice {slice_id}: {counts}"


def _say(out: IO[str], line: str) -> None:
    out.write(line + "\n")
    out.flush()
