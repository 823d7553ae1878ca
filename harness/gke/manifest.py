"""Render the run's manifests from k8s/base plus one accelerator table entry.

k8s/ is the single source of truth: the launcher loads the same base files `kubectl apply -k`
uses and sets at the same paths what each overlay patches (tests/gke/test_manifests.py checks that
the two agree for every overlay). Manifests are data: dicts in, YAML out through PyYAML.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import yaml

from harness.config.options import JOB_SIZE_ENV, JOB_SIZES
from harness.errors import HarnessUsageError
from harness.gke.accelerators import AcceleratorType

Manifest = dict[str, Any]

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
BASE_NAME = "spmd-harness"  # the JobSet name and namespace in k8s/base
BASE_IMAGE = "spmd-harness-worker"  # the image name kustomize's `images:` replaces
REPLICATED_JOB = "slice"
CONTAINER = "worker"
GCS_ENV = "SPMD_HARNESS_GCS_URI"
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63


def k8s_dir() -> Path:
    """k8s/ of this checkout (or SPMD_HARNESS_K8S_DIR when the harness is installed elsewhere)."""
    override = os.environ.get("SPMD_HARNESS_K8S_DIR")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "k8s"


def load_base(base_dir: Path | None = None) -> list[Manifest]:
    """The documents k8s/base/kustomization.yaml lists, in its order."""
    base = base_dir or k8s_dir() / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    docs: list[Manifest] = []
    for resource in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((base / resource).read_text()) if d)
    return docs


def coordinator_label(jobset: Manifest, name: str) -> str:
    """The value JobSet puts in the `jobset.sigs.k8s.io/coordinator` label for a JobSet `name`:
    `<name>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`, the subdomain defaulting to the name."""
    coordinator = jobset["spec"]["coordinator"]
    subdomain = (jobset["spec"].get("network") or {}).get("subdomain") or name
    return f"{name}-{coordinator['replicatedJob']}-{coordinator['jobIndex']}-{coordinator['podIndex']}.{subdomain}"


def max_name_length(jobset: Manifest) -> int:
    """The longest JobSet name whose coordinator label fits a 63-character label value.

    JobSet 0.11+ rejects a longer label when the JobSet is created; older versions accept the
    JobSet and then fail to create its Jobs. Computed from the template, so a change of the
    replicatedJob name or the subdomain moves the limit with it.
    """
    length = 1
    while len(coordinator_label(jobset, "a" * (length + 1))) <= DNS_LABEL_MAX:
        length += 1
    return length


def check_name(name: str, jobset: Manifest | None = None) -> str:
    """`name` if it can name the JobSet rendered from k8s/base, else a usage error with the numbers."""
    template = jobset or find(load_base(), "JobSet")
    limit = max_name_length(template)
    if not _NAME_RE.match(name):
        raise HarnessUsageError(
            f"JobSet name {name!r} must be a DNS label: lower-case letters, digits and '-', starting "
            f"with a letter and ending with a letter or digit, at most {limit} characters"
        )
    if len(name) > limit:
        raise HarnessUsageError(
            f"JobSet name {name!r} has {len(name)} characters; at most {limit} fit: JobSet labels every pod "
            f"with the coordinator address {coordinator_label(template, name)!r} "
            f"({len(coordinator_label(template, name))} characters), and a label value may have {DNS_LABEL_MAX}"
        )
    return name


def render(
    accel: AcceleratorType,
    slices: int,
    image: str,
    *,
    name: str = BASE_NAME,
    namespace: str = BASE_NAME,
    gcs_uri: str | None = None,
    job_size: str | None = None,
) -> list[Manifest]:
    """Namespace, ServiceAccount and JobSet for `slices` slices of `accel`; with job_size, the
    training-job cases train a decoder of that size (--spmd-job-size, through its variable)."""
    docs = copy.deepcopy(load_base())
    for doc in docs:
        _set_namespace(doc, namespace)
        if doc["kind"] == "JobSet":
            doc["metadata"]["name"] = check_name(name, doc)
            _shape_jobset(doc, accel, slices)
            _set_container(doc, image, gcs_uri, job_size)
    return docs


def _set_namespace(doc: Manifest, namespace: str) -> None:
    if doc["kind"] == "Namespace":
        doc["metadata"]["name"] = namespace
    else:
        doc["metadata"]["namespace"] = namespace


def _shape_jobset(jobset: Manifest, accel: AcceleratorType, slices: int) -> None:
    """Exactly what each overlay's patch sets, from the table."""
    rjob = replicated_job(jobset)
    rjob["replicas"] = slices
    job_spec = rjob["template"]["spec"]
    job_spec["parallelism"] = accel.hosts_per_slice
    job_spec["completions"] = accel.hosts_per_slice
    pod_spec = job_spec["template"]["spec"]
    pod_spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] = accel.gke_accelerator
    pod_spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = accel.topology
    worker_container(jobset)["resources"]["limits"]["google.com/tpu"] = accel.chips_per_host


def _set_container(jobset: Manifest, image: str, gcs_uri: str | None, job_size: str | None = None) -> None:
    container = worker_container(jobset)
    container["image"] = image
    if gcs_uri:
        container["env"].append({"name": GCS_ENV, "value": gcs_uri})
    if job_size:
        container["env"].append({"name": JOB_SIZE_ENV, "value": check_job_size(job_size)})


def check_job_size(size: str) -> str:
    if size not in JOB_SIZES:
        raise HarnessUsageError(f"job size {size!r} is not one of {', '.join(JOB_SIZES)} (cases/jobsize.py)")
    return size


def replicated_job(jobset: Manifest) -> Manifest:
    for rjob in jobset["spec"]["replicatedJobs"]:
        if rjob["name"] == REPLICATED_JOB:
            return rjob
    raise KeyError(f"k8s/base JobSet has no replicatedJob {REPLICATED_JOB!r}")


def pod_template(jobset: Manifest) -> Manifest:
    return replicated_job(jobset)["template"]["spec"]["template"]


def worker_container(jobset: Manifest) -> Manifest:
    for container in pod_template(jobset)["spec"]["containers"]:
        if container["name"] == CONTAINER:
            return container
    raise KeyError(f"k8s/base JobSet has no container {CONTAINER!r}")


def find(docs: list[Manifest], kind: str) -> Manifest:
    return next(d for d in docs if d["kind"] == kind)


def dump(docs: list[Manifest]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=True, default_flow_style=False)
