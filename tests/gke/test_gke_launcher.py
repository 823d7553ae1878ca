"""The launcher against kmock over real HTTP, driven by the real `kubernetes` client.

The test plays the JobSet controller (gke_controller.py): it creates the pods with their logs and
patches the JobSet status. Faults (409, 5xx, 410) are injected by the emulator (gke_emulator.py).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kmock", reason="the kmock emulator comes with the test extra")
pytest.importorskip("kubernetes", reason="the launcher's client comes with the gke/test extras")

from gke_controller import FakeJobSetController, Host, Scenario
from gke_emulator import JOBSETS, PODS, EmulatorThread, Fault, is_create, is_delete, is_list
from kubernetes import client

from harness.gke import accelerators, launcher, manifest
from harness.gke.__main__ import main
from harness.gke.errors import JobSetExistsError, JobSetNotInstalledError, KubeApiError
from harness.gke.kube import Kube

pytestmark = pytest.mark.selftest

V4 = accelerators.lookup("v4", "2x2x2")


def config(tmp_path: Path, **kwargs) -> launcher.RunConfig:
    defaults = dict(
        accel=V4,
        slices=2,
        image="img:1",
        out_dir=tmp_path / "out",
        namespace="nightly",
        name="spmd-test",
        timeout_s=20,
        watch_segment_s=2,
    )
    return launcher.RunConfig(**{**defaults, **kwargs})


def run(
    emulator: EmulatorThread, api: client.ApiClient, kube: Kube, cfg: launcher.RunConfig, scenario: Scenario
) -> tuple[launcher.agg.Aggregate, str]:
    out = io.StringIO()
    with FakeJobSetController(emulator.emulator, api, scenario):
        result = launcher.run(cfg, kube, out)
    return result, out.getvalue()


def jobset_exists(emulator: EmulatorThread, name: str = "spmd-test") -> bool:
    return any(k[0] == JOBSETS and k[2] == name and not o.deleted for k, o in emulator.emulator.objects.items())


def seen(emulator: EmulatorThread, action: str, plural: str) -> int:
    return sum(1 for a, p, _ in emulator.emulator.requests_seen if (a, p) == (action, plural))


def test_success_collects_every_host_and_cleans_up(emulator, api, kube, tmp_path) -> None:
    result, out = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert [(r.slice_id, r.host_id) for r in result.hosts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # How many intermediate lines show depends on timing; the last one does not.
    assert "slice 0: 0 pending, 0 running, 2 succeeded, 0 failed | slice 1: 0 pending, 0 running, 2 succeeded" in out
    assert "JobSet Completed" in out and "deleted JobSet nightly/spmd-test" in out
    assert not jobset_exists(emulator)
    created = emulator.emulator.objects[JOBSETS, "nightly", "spmd-test"].history[0].raw
    assert manifest.replicated_job(created)["replicas"] == 2
    assert set(emulator.emulator.namespaces) == {"nightly"}
    assert emulator.emulator.objects[PODS.__class__("", "v1", "serviceaccounts"), "nightly", "spmd-harness"]
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert 'classname="slice1.host1.cases.test_fake_family"' in junit
    assert json.loads((tmp_path / "out" / "results.json").read_text())["ok"] is True


def test_failed_pod_fails_the_run(emulator, api, kube, tmp_path) -> None:
    scenario = Scenario(
        final="Failed",
        hosts={
            (1, 0): Host(phase="Failed", signal="SIGABRT"),  # reported, then exited non-zero
            (1, 1): Host(phase="Failed", log=lambda block: "killed\n", detail=("OOMKilled", 137)),  # never reported
        },
    )
    result, _ = run(emulator, api, kube, config(tmp_path), scenario)
    assert not result.ok
    failures = "\n".join(result.failures)
    assert "slice1.host0" in failures and "SIGABRT" in failures
    assert "slice1.host1" in failures and "no report block" in failures and "OOMKilled exit 137" in failures
    assert "JobSet Failed: FailedJobs: jobset failed" in failures
    assert not jobset_exists(emulator)


@pytest.mark.parametrize(
    "damage, reason",
    [
        # the block is missing entirely
        (lambda block: "pytest output only\n", "no report block"),
        # the block is there but a line of it was altered
        (lambda block: block.replace(block.splitlines()[1], block.splitlines()[1][::-1]), "checksum"),
    ],
)
def test_missing_or_corrupt_block_is_a_failed_host(emulator, api, kube, tmp_path, damage, reason) -> None:
    scenario = Scenario(hosts={(0, 1): Host(log=damage)})
    result, _ = run(emulator, api, kube, config(tmp_path), scenario)
    [host] = [h for h in result.hosts if h.error]
    assert (host.slice_id, host.host_id) == (0, 1) and reason in host.error and "pod Succeeded" in host.error
    assert len(result.hosts) == 4 and not result.ok


def test_disagreeing_shardings_fail_and_name_both(emulator, api, kube, tmp_path) -> None:
    scenario = Scenario(hosts={(1, 1): Host(sharding="{replicated}")})
    result, _ = run(emulator, api, kube, config(tmp_path), scenario)
    [line] = result.failures
    assert "test_sharded[func-on]" in line and "'fc.weight'" in line
    assert "slice0.host0, slice0.host1, slice1.host0 saw '{devices=[4,1]0,1,2,3}'" in line
    assert "slice1.host1 saw '{replicated}'" in line


def test_5xx_are_retried(emulator, api, kube, kube_log, tmp_path) -> None:
    emu = emulator.emulator
    emu.fail_next(Fault(is_create(JOBSETS), 503, times=2))
    emu.fail_next(Fault(is_list(PODS), 500, times=1))
    emu.fail_next(Fault(is_delete(JOBSETS), 502, times=1))
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert sum("HTTP 503" in line for line in kube_log) == 2
    assert any("HTTP 500" in line for line in kube_log) and any("HTTP 502" in line for line in kube_log)
    assert not jobset_exists(emulator)


def test_lost_create_answer_then_409_adopts_our_jobset(emulator, api, kube, kube_log, tmp_path) -> None:
    emulator.emulator.fail_next(Fault(is_create(JOBSETS), 500, after_effect=True))
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert seen(emulator, "CREATE", "jobsets") == 2  # the lost one and the 409
    assert any("earlier attempt; using it" in line for line in kube_log)


def test_transient_409_on_create_is_retried(emulator, api, kube, kube_log, tmp_path) -> None:
    emulator.emulator.fail_next(Fault(is_create(JOBSETS), 409))
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok and any("conflict while the old one is going away" in line for line in kube_log)


def test_409_from_someone_elses_jobset_is_an_error_and_leaves_it(emulator, api, kube, tmp_path) -> None:
    theirs = manifest.find(manifest.render(V4, 2, "theirs", name="spmd-test", namespace="nightly"), "JobSet")
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        manifest.JOBSET_GROUP, manifest.JOBSET_VERSION, "nightly", manifest.JOBSET_PLURAL, theirs
    )
    with pytest.raises(JobSetExistsError, match="kubectl delete jobset spmd-test -n nightly"):
        launcher.run(config(tmp_path), kube, io.StringIO())
    assert jobset_exists(emulator)
    assert seen(emulator, "DELETE", "jobsets") == 0


def test_expired_watch_relists(emulator, api, kube, kube_log, tmp_path) -> None:
    emulator.emulator.expire_watches(2)
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert sum("HTTP 410" in line for line in kube_log) == 2
    assert seen(emulator, "LIST", "jobsets") >= 3  # the first list and one re-list per 410


def test_timeout_collects_and_deletes(emulator, api, kube, tmp_path) -> None:
    cfg = config(tmp_path, timeout_s=1.5, watch_segment_s=0.5)
    result, out = run(emulator, api, kube, cfg, Scenario(final=None))
    assert not result.ok
    assert any("did not finish within 2s" in f for f in result.failures)
    assert all("no report block" in h.error and "pod Running" in h.error for h in result.hosts)
    assert "deleted JobSet nightly/spmd-test" in out and not jobset_exists(emulator)


def test_keep_leaves_the_jobset(emulator, api, kube, tmp_path) -> None:
    result, out = run(emulator, api, kube, config(tmp_path, keep=True), Scenario())
    assert result.ok and jobset_exists(emulator) and "kubectl delete jobset spmd-test -n nightly" in out


@pytest.mark.parametrize(
    "reason, message, hint",
    [
        # the reference passed the CLI's check but not the node's parser (e.g. a runtime that is stricter)
        ("InvalidImageName", 'Failed to apply default image tag "img:1": invalid reference format', "fix --image"),
        # the tag does not exist, or the node pools' service account may not pull it
        ("ImagePullBackOff", 'Back-off pulling image "img:1"', "roles/artifactregistry.reader"),
        # the pod references a Secret or ConfigMap that is not there
        ("CreateContainerConfigError", 'secret "gcs-key" not found', "Secret or ConfigMap"),
        # the runtime refused to create the container
        ("CreateContainerError", "failed to reserve container name", "container runtime"),
    ],
)
def test_a_container_that_cannot_start_fails_the_run_at_once(
    emulator, api, kube, tmp_path, reason, message, hint
) -> None:
    scenario = Scenario(final=None, hosts={(1, 0): Host(waiting=(reason, message))})
    started = time.monotonic()
    result, out = run(emulator, api, kube, config(tmp_path, timeout_s=15, watch_segment_s=0.5), scenario)
    assert time.monotonic() - started < 8, "it waited for the timeout"
    cause = f"pod nightly/spmd-test-slice-1-0-x10: container worker (image 'img:1') cannot start: {reason}: {message}"
    assert cause in out and hint in out
    assert [f for f in result.failures if f.startswith(cause)], result.failures
    assert not any("did not finish within" in f for f in result.failures)
    # The host's own row says why it has no report; the JobSet is gone; summary and JUnit name the cause.
    [host] = [h for h in result.hosts if (h.slice_id, h.host_id) == (1, 0)]
    assert f"waiting: {reason}" in host.error
    assert "deleted JobSet nightly/spmd-test" in out and not jobset_exists(emulator)
    assert cause in (tmp_path / "out" / "summary.md").read_text()
    assert reason in (tmp_path / "out" / "junit.xml").read_text()


def test_err_image_pull_gets_a_grace_then_fails(emulator, api, kube, tmp_path) -> None:
    scenario = Scenario(final=None, hosts={(0, 1): Host(waiting=("ErrImagePull", "429 Too Many Requests"))})
    cfg = config(tmp_path, timeout_s=15, watch_segment_s=0.5, pull_error_grace_s=1.5)
    started = time.monotonic()
    result, out = run(emulator, api, kube, cfg, scenario)
    assert 1.5 <= time.monotonic() - started < 8
    assert "container worker (image 'img:1') cannot start: ErrImagePull for 2s or more: 429 Too Many Requests" in out
    assert not result.ok and not jobset_exists(emulator)


class InterruptOnProgress(io.StringIO):
    def write(self, text: str) -> int:
        if "pending" in text:
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_deletes_the_jobset(emulator, api, kube, tmp_path) -> None:
    with FakeJobSetController(emulator.emulator, api, Scenario(final=None)):
        with pytest.raises(KeyboardInterrupt):
            launcher.run(config(tmp_path), kube, InterruptOnProgress())
    assert not jobset_exists(emulator)


def test_cli_end_to_end(emulator, api, tmp_path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": emulator.url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
            }
        )
    )
    out = io.StringIO()
    with FakeJobSetController(emulator.emulator, api, Scenario(hosts={(0, 0): Host(sharding="{replicated}")})):
        code = main(
            [
                "run",
                "--accelerator",
                "v4",
                "--topology",
                "2x2x2",
                "--image",
                "img:1",
                "--name",
                "spmd-cli",
                "--timeout",
                "20s",
                "--kubeconfig",
                str(kubeconfig),
                "--out",
                str(tmp_path / "o"),
            ],
            out=out,
        )
    assert code == 1, out.getvalue()
    assert "VERDICT: FAILED (1 failure(s) over 4 hosts" in out.getvalue()
    assert not jobset_exists(emulator, "spmd-cli")


# -- permissions and prerequisites -------------------------------------------------------------------


def test_an_existing_namespace_is_read_not_created(emulator, api, kube, tmp_path) -> None:
    emulator.emulator.namespaces["nightly"] = {"metadata": {"name": "nightly"}}
    emulator.emulator.namespace_statuses["CREATE"] = 403  # this account may not create namespaces
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert seen(emulator, "CREATE", "namespaces") == 0 and seen(emulator, "FETCH", "namespaces") == 1


def test_a_missing_namespace_that_may_not_be_created_names_the_permission(emulator, api, kube, tmp_path) -> None:
    emulator.emulator.namespace_statuses["CREATE"] = 403
    with pytest.raises(
        KubeApiError,
        match="Namespace nightly does not exist and this account may not create it: it lacks `create` on namespaces",
    ):
        launcher.run(config(tmp_path), kube, io.StringIO())
    assert not jobset_exists(emulator)


def test_a_namespace_that_may_be_neither_read_nor_created_is_assumed_to_exist(
    emulator, api, kube, kube_log, tmp_path
) -> None:
    emulator.emulator.namespace_statuses.update(FETCH=403, CREATE=403)
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert any("cannot read or create Namespace nightly (HTTP 403); assuming it exists" in line for line in kube_log)


def test_jobset_not_installed_is_found_before_anything_is_created(emulator, api, kube, tmp_path) -> None:
    emulator.emulator.crds.clear()
    with pytest.raises(
        JobSetNotInstalledError,
        match=r"JobSet is not installed on this cluster \(no "
        r"CustomResourceDefinition jobsets.jobset.x-k8s.io\). Install "
        r"JobSet 0.6 or newer",
    ):
        launcher.run(config(tmp_path), kube, io.StringIO())
    assert [a for a, _, _ in emulator.emulator.requests_seen] == ["FETCH"], "it created something first"


def test_a_jobset_without_spec_coordinator_is_refused_as_too_old(emulator, api, kube, tmp_path) -> None:
    crd = emulator.emulator.crds["jobsets.jobset.x-k8s.io"]
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["coordinator"]
    with pytest.raises(
        JobSetNotInstalledError, match="older than 0.6: its CRD jobsets.jobset.x-k8s.io has no spec.coordinator"
    ):
        launcher.run(config(tmp_path), kube, io.StringIO())
    assert not jobset_exists(emulator)


def test_an_account_that_may_not_read_crds_goes_ahead(emulator, api, kube, kube_log, tmp_path) -> None:
    emulator.emulator.crd_read_status = 403
    result, _ = run(emulator, api, kube, config(tmp_path), Scenario())
    assert result.ok, result.failures
    assert any("cannot read CustomResourceDefinition jobsets.jobset.x-k8s.io (HTTP 403)" in line for line in kube_log)


@pytest.mark.parametrize(
    "crd_installed, crd_read_status, expected",
    [
        # The CRD went away between the check and the create: say what to install.
        (False, 0, r"JobSet is not installed on this cluster"),
        # JobSet is there, so the 404 can only be the namespace.
        (True, 0, r"although JobSet is installed: namespace nightly does not exist"),
        # Neither can be told apart: name both.
        (True, 403, r"either JobSet is not installed .* or namespace nightly does not exist"),
    ],
)
def test_a_404_on_create_says_which_prerequisite_is_missing(
    emulator, api, kube, tmp_path, crd_installed, crd_read_status, expected
) -> None:
    emulator.emulator.fail_next(Fault(is_create(JOBSETS), 404))
    if not crd_installed:
        # As if the CRD went away after the up-front check.
        emulator.emulator.crds.clear()
        kube.check_jobset_installed = lambda: None
    emulator.emulator.crd_read_status = crd_read_status
    with pytest.raises(KubeApiError, match=expected):
        launcher.run(config(tmp_path), kube, io.StringIO())


def test_no_permission_to_create_jobsets_names_it(emulator, api, kube, tmp_path) -> None:
    emulator.emulator.fail_next(Fault(is_create(JOBSETS), 403))
    with pytest.raises(KubeApiError, match="lacks `create` on jobsets.jobset.x-k8s.io in namespace nightly"):
        launcher.run(config(tmp_path), kube, io.StringIO())
