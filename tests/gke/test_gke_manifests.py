"""k8s/ and the launcher's render: goldens, `kubectl kustomize` equality, schema and structure.

Goldens are the `--dry-run` output. Regenerate them (and review the diff) with:
    for s in v4:2x2x2 v6e:4x4 v6e:2x4; do a=${s%:*}; t=${s#*:}; PYTHONPATH=. python -m harness.gke run \
      --dry-run --accelerator $a --topology $t --slices 2 --image spmd-harness-worker --name spmd-harness \
      > tests/gke/golden/$a-$t.yaml; done
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml

from harness.gke import accelerators, manifest
from harness.gke.__main__ import main

pytestmark = pytest.mark.selftest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.34"  # oldest core schema kubernetes-validate ships that GKE TPU node pools run
SHAPES = [pytest.param(a, id=a.overlay) for a in accelerators.ACCELERATORS]


def dry_run(accel: accelerators.AcceleratorType) -> str:
    out = io.StringIO()
    code = main(
        [
            "run",
            "--dry-run",
            "--accelerator",
            accel.name,
            "--topology",
            accel.topology,
            "--slices",
            "2",
            "--image",
            manifest.BASE_IMAGE,
            "--name",
            manifest.BASE_NAME,
        ],
        out=out,
    )
    assert code == 0
    return out.getvalue()


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("accel", SHAPES)
def test_dry_run_matches_golden(accel: accelerators.AcceleratorType) -> None:
    golden = GOLDEN / f"{accel.overlay}.yaml"
    assert dry_run(accel) == golden.read_text(), f"regenerate {golden} (command in this file's docstring)"


def test_every_golden_and_overlay_has_a_table_row() -> None:
    overlays = {p.name for p in (REPO / "k8s" / "overlays").iterdir()}
    goldens = {p.stem for p in GOLDEN.glob("*.yaml")}
    assert overlays == goldens == {a.overlay for a in accelerators.ACCELERATORS}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("accel", SHAPES)
def test_launcher_render_equals_kubectl_kustomize(accel: accelerators.AcceleratorType) -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "k8s" / "overlays" / accel.overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    from_kustomize = by_kind(list(yaml.safe_load_all(built)))
    from_launcher = by_kind(manifest.render(accel, 2, manifest.BASE_IMAGE))
    assert from_launcher == from_kustomize


@pytest.mark.parametrize("accel", SHAPES)
def test_pod_and_job_templates_pass_the_kubernetes_schema(accel: accelerators.AcceleratorType) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="comes with the test extra")
    docs = by_kind(list(yaml.safe_load_all(dry_run(accel))))
    jobset = docs["JobSet"]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "slice"},
        "spec": manifest.replicated_job(jobset)["template"]["spec"],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "host"}, **manifest.pod_template(jobset)}
    for doc in (job, pod, docs["Namespace"], docs["ServiceAccount"]):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_can_fail() -> None:
    """Guards the test above: a misspelt field must be rejected."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="comes with the test extra")
    jobset = manifest.find(manifest.render(accelerators.ACCELERATORS[0], 2, "img"), "JobSet")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, **manifest.pod_template(jobset)}
    pod["spec"]["hostNetwrk"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("accel", SHAPES)
def test_jobset_shape(accel: accelerators.AcceleratorType, slices: int) -> None:
    jobset = manifest.find(manifest.render(accel, slices, "img:1", name="run-1", namespace="ns"), "JobSet")
    rjob = manifest.replicated_job(jobset)
    job = rjob["template"]["spec"]
    pod = manifest.pod_template(jobset)["spec"]
    container = manifest.worker_container(jobset)
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["metadata"]["name"] == "run-1"
    assert (
        jobset["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"]
        == "cloud.google.com/gke-nodepool"
    )
    assert rjob["replicas"] == slices
    assert job["parallelism"] == job["completions"] == accel.hosts_per_slice
    assert job["backoffLimit"] == 0 and job["completionMode"] == "Indexed"
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert jobset["spec"]["ttlSecondsAfterFinished"] > 0
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accel.gke_accelerator,
        "cloud.google.com/gke-tpu-topology": accel.topology,
    }
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["restartPolicy"] == "Never"
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["resources"]["limits"] == {"google.com/tpu": accel.chips_per_host}
    assert container["image"] == "img:1"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env["MEGASCALE_NUM_SLICES"] == "metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"
    assert env["MEGASCALE_SLICE_ID"] == "metadata.labels['jobset.sigs.k8s.io/job-index']"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "metadata.labels['jobset.sigs.k8s.io/coordinator']"
    assert jobset["spec"]["coordinator"] == {"replicatedJob": "slice", "jobIndex": 0, "podIndex": 0}
    assert container["command"][:4] == ["python", "-m", "harness.gke", "worker"]


def test_namespace_and_bucket_are_applied_everywhere() -> None:
    docs = manifest.render(accelerators.ACCELERATORS[1], 2, "img", namespace="nightly", gcs_uri="gs://b/p")
    assert by_kind(docs)["Namespace"]["metadata"]["name"] == "nightly"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"nightly"}
    env = manifest.worker_container(by_kind(docs)["JobSet"])["env"]
    assert {"name": manifest.GCS_ENV, "value": "gs://b/p"} in env


def test_the_job_size_reaches_the_pods_and_only_a_known_one() -> None:
    env = manifest.worker_container(
        by_kind(manifest.render(accelerators.ACCELERATORS[1], 2, "img", job_size="medium"))["JobSet"]
    )["env"]
    assert {"name": "SPMD_JOB_SIZE", "value": "medium"} in env
    plain = manifest.worker_container(by_kind(manifest.render(accelerators.ACCELERATORS[1], 2, "img"))["JobSet"])["env"]
    assert not [e for e in plain if e["name"] == "SPMD_JOB_SIZE"]  # the suite's default, tiny
    with pytest.raises(manifest.HarnessUsageError, match="job size 'huge' is not one of tiny, small, medium"):
        manifest.render(accelerators.ACCELERATORS[1], 2, "img", job_size="huge")


@pytest.mark.parametrize("name", ["Bad_Name", "1abc", "abc-"])
def test_bad_jobset_names_are_usage_errors(name: str) -> None:
    with pytest.raises(manifest.HarnessUsageError, match="DNS label"):
        manifest.render(accelerators.ACCELERATORS[0], 2, "img", name=name)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("accel", SHAPES)
def test_the_name_limit_fits_each_overlays_coordinator_label(accel: accelerators.AcceleratorType) -> None:
    """The longest accepted name makes a coordinator label of at most 63 characters in the JobSet
    that `kubectl kustomize` renders for the overlay; one character more is refused, with the numbers."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "k8s" / "overlays" / accel.overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    jobset = by_kind(list(yaml.safe_load_all(built)))["JobSet"]
    limit = manifest.max_name_length(jobset)
    longest = "a" * limit
    assert len(manifest.coordinator_label(jobset, longest)) <= 63
    assert manifest.render(accel, 2, "img", name=longest)
    with pytest.raises(manifest.HarnessUsageError, match=f"has {limit + 1} characters; at most {limit} fit"):
        manifest.render(accel, 2, "img", name=longest + "a")
    assert len(manifest.coordinator_label(jobset, longest + "a")) > 63


def test_dockerfile_installs_the_pinned_tpu_pair_and_the_worker() -> None:
    """Structure only: there is no docker engine here to build it."""
    text = (REPO / "k8s" / "image" / "Dockerfile").read_text()
    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    version = re.search(r"torch_xla\[[^\]]*\]==([\d.]+)", " ".join(pinned)).group(1)
    assert f"ARG TORCH_XLA_VERSION={version}" in text
    assert '"torch_xla[tpu,pallas]==${TORCH_XLA_VERSION}"' in text
    assert 'ENTRYPOINT ["python", "-m", "harness.gke", "worker"]' in text
    for source in re.findall(r"^COPY (\S+)", text, flags=re.M):
        assert (REPO / source.rstrip("/")).exists() or source == "README.md", f"COPY {source}: not in the repo"


@pytest.mark.parametrize("accel", SHAPES)
def test_the_worker_runs_unprivileged_which_needs_gke_1_28(accel: accelerators.AcceleratorType) -> None:
    """GKE gives unprivileged containers the TPU chips from 1.28 on; k8s/README.md states that minimum."""
    jobset = by_kind(manifest.render(accel, 2, "img"))["JobSet"]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert all(not (c.get("securityContext") or {}).get("privileged") for c in pod["containers"])
    assert "GKE 1.28 or newer" in (REPO / "k8s" / "README.md").read_text()


def test_the_prerequisites_name_everything_the_nightly_reads() -> None:
    """Every repository variable the nightly workflow reads, and the roles and versions it depends
    on, are in the one prerequisites section that README links to."""
    readme = (REPO / "README.md").read_text()
    assert "k8s/README.md#prerequisites-for-the-nightly-multi-slice-run" in readme
    k8s_readme = (REPO / "k8s" / "README.md").read_text()
    section = k8s_readme[k8s_readme.index("## Prerequisites for the nightly multi-slice run") :]
    workflow = (REPO / ".github" / "workflows" / "nightly-multislice.yml").read_text()
    variables = set(re.findall(r"\bvars\.([A-Z_]+)", workflow))
    assert variables, "the nightly reads no repository variables?"
    for needed in sorted(variables) + [
        "roles/container.clusterViewer",
        "roles/container.developer",
        "roles/artifactregistry.writer",
        "JobSet 0.6",
        "2.336.0",
        "Workload Identity",
    ]:
        assert needed in section, f"k8s/README.md's prerequisites do not mention {needed}"


def test_the_bucket_prerequisite_fits_workers_on_the_host_network(capsys: pytest.CaptureFixture[str]) -> None:
    """Workload Identity Federation for GKE does not serve hostNetwork pods: their metadata requests
    reach the Compute Engine metadata server, so the workers' bucket copy runs as the TPU node pools'
    service account, and a Workload Identity binding of the pods' ServiceAccount does nothing. While
    the workers run on the host network, what the prerequisites, the ServiceAccount and the CLI say
    about the bucket must follow from that."""
    jobset = by_kind(manifest.render(accelerators.ACCELERATORS[0], 2, "img"))["JobSet"]
    assert manifest.pod_template(jobset)["spec"]["hostNetwork"] is True
    k8s_readme = (REPO / "k8s" / "README.md").read_text()
    section = k8s_readme[k8s_readme.index("## Prerequisites for the nightly multi-slice run") :]
    bucket = " ".join(section[section.index("- Optionally a bucket") :].split("\n\n")[0].split("\n- ")[0].split())
    for needed in ["hostNetwork", "node pools' service account", "roles/storage.objectCreator", "cloud-platform"]:
        assert needed in bucket, f"the bucket prerequisite does not mention {needed}: {bucket}"
    assert "annotation" not in (REPO / "k8s" / "base" / "serviceaccount.yaml").read_text()
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    gcs_help = " ".join(capsys.readouterr().out.rsplit("--gcs-uri GCS_URI", 1)[1].split("--kubeconfig")[0].split())
    assert "node pools' service account" in gcs_help and "Workload Identity" not in gcs_help, gcs_help
