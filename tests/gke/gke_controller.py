"""The test playing the JobSet controller against the emulator, through the real client.

When the launcher's JobSet appears, it creates one pod per (slice, host) with the labels and
annotations JobSet and the Job controller set, moves them Pending -> Running -> their final phase,
stores each pod's log (the report block, or damage to it), and patches the JobSet status the way
the JobSet controller does. A Scenario says what each host does and how the JobSet ends.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from gke_emulator import PatchedEmulator
from kubernetes import client

from harness.gke import manifest, report_channel
from harness.gke.hostreport import HostReport
from harness.records.results import CaseRecord

CASE = "cases/test_fake_family.py::test_sharded[func-on]"
AGREED = "{devices=[4,1]0,1,2,3}"
WAIT_S = 10.0


@dataclasses.dataclass
class Host:
    phase: str = "Succeeded"
    sharding: str = AGREED
    log: Callable[[str], str] = lambda block: "pytest output\n" + block  # the pod log from the block
    detail: tuple[str, int] | None = None  # (terminated reason, exit code) override
    signal: str | None = None
    waiting: tuple[str, str] | None = None  # (reason, message): the container never starts, as the kubelet reports it


@dataclasses.dataclass
class Scenario:
    hosts: dict[tuple[int, int], Host] = dataclasses.field(default_factory=dict)
    final: str | None = "Completed"  # None: the JobSet never finishes (timeout)

    def host(self, s: int, h: int) -> Host:
        return self.hosts.get((s, h), Host())


class FakeJobSetController:
    def __init__(self, emulator: PatchedEmulator, api: client.ApiClient, scenario: Scenario) -> None:
        self.emulator, self.scenario = emulator, scenario
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.created = threading.Event()
        emulator.on_create["jobsets"] = self.created
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="fake-jobset-controller", daemon=True)

    def __enter__(self) -> FakeJobSetController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # if the launcher failed before creating the JobSet, do not wait for it
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "controller thread did not finish"
        if self.error is not None and exc[0] is None:
            raise self.error

    def _main(self) -> None:
        try:
            for _ in range(int(WAIT_S / 0.02)):  # bounded: at most WAIT_S
                if self.created.wait(0.02):
                    self._reconcile()
                    return
                if self._stop.is_set():
                    return
        except client.ApiException as exc:
            if exc.status != 404:  # 404: the launcher deleted the JobSet mid-run, as on Ctrl-C
                self.error = exc
        except BaseException as exc:  # surfaced in __exit__
            self.error = exc

    def _reconcile(self) -> None:
        items = self.custom.list_cluster_custom_object(
            manifest.JOBSET_GROUP, manifest.JOBSET_VERSION, manifest.JOBSET_PLURAL
        )["items"]
        if not items:
            return  # deleted already (Ctrl-C right after create): nothing to run
        [jobset] = items
        ns, name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
        rjob = manifest.replicated_job(jobset)
        places = [(s, h) for s in range(rjob["replicas"]) for h in range(rjob["template"]["spec"]["parallelism"])]
        image = manifest.worker_container(jobset)["image"]
        for s, h in places:
            self.core.create_namespaced_pod(ns, self._pod(ns, name, rjob["replicas"], s, h, image))
            self._phase(ns, name, s, h, "Pending")
        self._status(ns, name, {"active": len(places)})
        for s, h in places:
            waiting = self.scenario.host(s, h).waiting
            if waiting:  # stays Pending, no log: the kubelet never started the container
                self._phase(
                    ns, name, s, h, "Pending", waiting={"reason": waiting[0], "message": waiting[1]}, image=image
                )
                continue
            self._phase(ns, name, s, h, "Running")
            self.emulator.pod_logs[(ns, f"{name}-slice-{s}-{h}-x{s}{h}")] = "collected 2 items\n"
        if self.scenario.final is None or any(self.scenario.host(s, h).waiting for s, h in places):
            return  # hangs: the launcher must stop (time out, or see why), collect and clean up
        for s, h in places:
            self._finish(ns, name, s, h)
        self._end(ns, name)

    def _pod(self, ns: str, name: str, slices: int, s: int, h: int, image: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-slice-{s}-{h}-x{s}{h}",
                "namespace": ns,
                "labels": {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/job-index": str(s),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(slices),
                },
                "annotations": {"batch.kubernetes.io/job-completion-index": str(h)},
            },
            "spec": {"containers": [{"name": "worker", "image": image}]},
        }

    def _phase(
        self,
        ns: str,
        name: str,
        s: int,
        h: int,
        phase: str,
        terminated: dict | None = None,
        waiting: dict | None = None,
        image: str = "img",
    ) -> None:
        status: dict = {"phase": phase}
        if terminated or waiting:
            state = {"terminated": terminated} if terminated else {"waiting": waiting}
            status["containerStatuses"] = [
                {"name": "worker", "image": image, "imageID": "", "ready": False, "restartCount": 0, "state": state}
            ]
        self.core.patch_namespaced_pod_status(f"{name}-slice-{s}-{h}-x{s}{h}", ns, {"status": status})

    def _finish(self, ns: str, name: str, s: int, h: int) -> None:
        host = self.scenario.host(s, h)
        report = HostReport(
            slice_id=s,
            host_id=h,
            pod=f"{name}-slice-{s}-{h}",
            exit_code=0,
            signal=host.signal,
            records=[
                CaseRecord(
                    nodeid=CASE,
                    family="fake_family",
                    outcome="passed",
                    torch_xla="2.9.0",
                    shardings={"fc.weight": host.sharding},
                )
            ],
        )
        if host.signal:
            report.exit_code, report.error = None, f"suite died of {host.signal}"
        self.emulator.pod_logs[(ns, f"{name}-slice-{s}-{h}-x{s}{h}")] = host.log(
            report_channel.encode(report.to_dict())
        )
        reason, code = host.detail or (("Completed", 0) if host.phase == "Succeeded" else ("Error", 1))
        self._phase(ns, name, s, h, host.phase, {"exitCode": code, "reason": reason})

    def _status(self, ns: str, name: str, counts: dict, conditions: list | None = None) -> None:
        status: dict = {
            "replicatedJobsStatus": [
                {"name": "slice", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0, **counts}
            ]
        }
        if conditions:
            status["conditions"] = conditions
        self.custom.patch_namespaced_custom_object_status(
            manifest.JOBSET_GROUP, manifest.JOBSET_VERSION, ns, manifest.JOBSET_PLURAL, name, {"status": status}
        )

    def _end(self, ns: str, name: str) -> None:
        final = self.scenario.final
        reason = "AllJobsCompleted" if final == "Completed" else "FailedJobs"
        self._status(
            ns,
            name,
            {"succeeded" if final == "Completed" else "failed": 1},
            [
                {
                    "type": final,
                    "status": "True",
                    "reason": reason,
                    "message": f"jobset {final.lower()}",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
        )
