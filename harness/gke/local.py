"""--local: the GKE worker entrypoint as local processes, one per (slice, host), on the CPU backend.

Each process gets the environment its pod would get: the env entries of the rendered JobSet's
container are resolved here the way the downward API resolves them on GKE (from the JobSet labels
and the Job completion index), plus the TPU_WORKER_* variables GKE injects. Logs go to files and
are read back through the same report channel and aggregation as on GKE.

What it does not do: the processes do not form one multi-slice job (there is no DCN on CPU);
it checks the wiring, the report channel and the cross-host comparison, not MegaScale itself.
Each real worker imports torch_xla (about 5 s and 0.9 GB): --parallel bounds how many run at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from harness.errors import HarnessUsageError
from harness.gke import aggregate as agg
from harness.gke import manifest
from harness.gke.accelerators import AcceleratorType
from harness.gke.collect import report_from_log
from harness.gke.hostreport import HostReport
from harness.gke.worker import DEFAULT_SUITE
from harness.isolation.system import processes

LOCAL_COORDINATOR = "localhost"  # what pod 0 of slice 0 is to every other host, on one machine
_FIELD_RE = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
EXIT_GRACE_S = 60.0  # on top of the suite timeout: the worker's own kill and report block


@dataclasses.dataclass
class LocalConfig:
    accel: AcceleratorType
    slices: int
    out_dir: Path
    parallel: int = 1
    backend: str = "cpu"
    suite_command: str = DEFAULT_SUITE
    suite_timeout_s: float = 3600.0
    extra_args: Sequence[str] = ()
    name: str = "spmd-local"
    job_size: str | None = None  # as RunConfig.job_size: set in each host's env, as the manifest sets it

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise HarnessUsageError(f"--parallel {self.parallel}: must be at least 1")


def pod_metadata(name: str, slices: int, slice_id: int, host_id: int) -> dict[str, Any]:
    """The labels/annotations JobSet and the Job controller put on that pod (the ones the env uses)."""
    return {
        "name": f"{name}-slice-{slice_id}-{host_id}",
        "labels": {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(slices),
            "jobset.sigs.k8s.io/job-index": str(slice_id),
            "jobset.sigs.k8s.io/coordinator": LOCAL_COORDINATOR,
        },
        "annotations": {"batch.kubernetes.io/job-completion-index": str(host_id)},
    }


def resolve_env(container: manifest.Manifest, meta: dict[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet would set it for a pod with `meta`."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "metadata.name":
            env[entry["name"]] = meta["name"]
            continue
        match = _FIELD_RE.match(path)
        if not match or match.group(2) not in meta[match.group(1)]:
            raise HarnessUsageError(f"--local cannot resolve env {entry['name']} from {path}; teach local.pod_metadata")
        env[entry["name"]] = meta[match.group(1)][match.group(2)]
    return env


def worker_container(cfg: LocalConfig) -> manifest.Manifest:
    """The worker container of the JobSet a real run would create with these settings."""
    jobset = manifest.render(cfg.accel, cfg.slices, "local", name=cfg.name, job_size=cfg.job_size)
    return manifest.worker_container(manifest.find(jobset, "JobSet"))


def host_env(cfg: LocalConfig, container: manifest.Manifest, slice_id: int, host_id: int) -> dict[str, str]:
    env = resolve_env(container, pod_metadata(cfg.name, cfg.slices, slice_id, host_id))
    env["TPU_WORKER_ID"] = str(host_id)  # GKE injects these two on TPU pods
    env["TPU_WORKER_HOSTNAMES"] = ",".join([LOCAL_COORDINATOR] * cfg.accel.hosts_per_slice)
    return env


def worker_argv(cfg: LocalConfig, container: manifest.Manifest, results_dir: Path) -> list[str]:
    """The container's command with this interpreter and a local results dir, plus --local's options."""
    argv = [sys.executable if a == "python" else a for a in container["command"]]
    argv[argv.index("--results-dir") + 1] = str(results_dir)
    argv += [
        "--backend",
        cfg.backend,
        "--suite-command",
        cfg.suite_command,
        "--suite-timeout",
        str(cfg.suite_timeout_s),
    ]
    return argv + (["--", *cfg.extra_args] if cfg.extra_args else [])


def run_local(cfg: LocalConfig, out: IO[str]) -> agg.Aggregate:
    container = worker_container(cfg)
    places = [(s, h) for s in range(cfg.slices) for h in range(cfg.accel.hosts_per_slice)]
    _say(
        out,
        f"--local: {cfg.slices} slices x {cfg.accel.hosts_per_slice} hosts, {cfg.parallel} at a time, "
        f"backend {cfg.backend}; logs in {cfg.out_dir}",
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.parallel) as pool:
        reports = list(pool.map(lambda p: _run_host(cfg, container, p[0], p[1], out), places))
    result = agg.aggregate(reports, cfg.slices, cfg.accel.hosts_per_slice)
    agg.write_all(
        result,
        cfg.out_dir,
        {
            "mode": "local",
            "accelerator": cfg.accel.gke_accelerator,
            "topology": cfg.accel.topology,
            "slices": cfg.slices,
            "hosts_per_slice": cfg.accel.hosts_per_slice,
            "backend": cfg.backend,
        },
    )
    return result


def _run_host(cfg: LocalConfig, container: manifest.Manifest, slice_id: int, host_id: int, out: IO[str]) -> HostReport:
    label = f"slice{slice_id}-host{host_id}"
    results_dir, log_path = cfg.out_dir / label, cfg.out_dir / f"{label}.log"
    results_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **host_env(cfg, container, slice_id, host_id)}
    start = time.monotonic()
    _say(out, f"[local] {label}: started")
    with log_path.open("w", encoding="utf-8") as log:
        status = _run(worker_argv(cfg, container, results_dir), env, log, cfg.suite_timeout_s + EXIT_GRACE_S)
    _say(out, f"[local] {label}: {status} after {time.monotonic() - start:.1f}s")
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return report_from_log(text, slice_id, host_id, env["HARNESS_POD_NAME"], f"process {status}")


def _run(argv: list[str], env: dict[str, str], log: IO[str], timeout_s: float) -> str:
    proc = processes.start_in_session(argv, env=env, stdout=log)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        processes.terminate_group(proc)
        return f"killed after {timeout_s:.0f}s"
    finally:  # Ctrl-C included: no host process outlives the launcher
        processes.terminate_group(proc)
    return processes.describe_exit(code)


def _say(out: IO[str], line: str) -> None:
    out.write(line + "\n")
    out.flush()
