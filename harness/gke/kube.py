"""The one interface between the fan-out and the Kubernetes API.

Everything goes through the official `kubernetes` client: CustomObjectsApi for the JobSet (the
client's create_from_yaml cannot do custom resources), CoreV1Api for namespace, ServiceAccount,
pods and logs. Tests hand it an ApiClient pointed at an emulator; nothing else is faked.

Retries: 429, 5xx and connection errors are retried with bounded exponential backoff; so are 409
conflicts, except on create, where a conflict is resolved by looking at what is there (ours from an
attempt whose answer was lost: adopt it; being deleted: wait; someone else's: JobSetExistsError).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import urllib3.exceptions
from kubernetes import client, watch

from harness.errors import HarnessUsageError
from harness.gke import prerequisites
from harness.gke.errors import JobSetExistsError, JobSetNotInstalledError, KubeApiError
from harness.gke.manifest import CONTAINER, JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, Manifest
from harness.gke.prerequisites import JOBSET_CRD, JOBSET_MIN_VERSION

T = TypeVar("T")
RUN_ID_ANNOTATION = "spmd-harness.pytorch.org/run-id"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
CONNECTION_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # calls in total, the first included
    base_s: float = 0.5  # first backoff; doubles each time, with up to 25% jitter
    cap_s: float = 8.0
    sleep: Callable[[float], None] = time.sleep

    def delay(self, attempt: int) -> float:
        return min(self.cap_s, self.base_s * 2**attempt) * (1 + random.random() / 4)


@dataclasses.dataclass(frozen=True)
class ContainerWaiting:
    """A container the kubelet has not started, and what it says about it."""

    container: str
    image: str  # as the pod spec names it: what the user passed, not what the runtime resolved
    reason: str  # e.g. ImagePullBackOff, CreateContainerConfigError
    message: str = ""


@dataclasses.dataclass(frozen=True)
class PodState:
    name: str
    slice_id: int
    host_id: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    detail: str = ""  # e.g. "terminated: OOMKilled exit 137", "waiting: ImagePullBackOff"
    waiting: tuple[ContainerWaiting, ...] = ()  # init containers and containers that have a waiting reason


class Kube:
    """Small, typed wrapper over the calls the launcher makes."""

    def __init__(
        self,
        api_client: client.ApiClient,
        retry: RetryPolicy | None = None,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._retry_policy = retry or RetryPolicy()
        self._log = log

    @classmethod
    def from_kubeconfig(cls, config_file: str | None = None, context: str | None = None, **kwargs: Any) -> Kube:
        """Kubeconfig (e.g. after `gcloud container clusters get-credentials`), else in-cluster config."""
        from kubernetes import config

        configuration = client.Configuration()
        try:
            try:
                config.load_kube_config(config_file=config_file, context=context, client_configuration=configuration)
            except config.ConfigException:
                if config_file or context:
                    raise
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise HarnessUsageError(
                f"no usable Kubernetes credentials ({exc}); run `gcloud container clusters "
                "get-credentials CLUSTER` or pass --kubeconfig/--context"
            ) from exc
        return cls(client.ApiClient(configuration), **kwargs)

    # -- generic retry ---------------------------------------------------------------------------
    def _retry(self, what: str, call: Callable[[], T], retry_conflicts: bool = True) -> T:
        policy = self._retry_policy
        for attempt in range(policy.attempts):
            try:
                return call()
            except client.ApiException as exc:
                if exc.status not in RETRYABLE_STATUSES or (exc.status == 409 and not retry_conflicts):
                    raise
                error: Exception = exc
            except CONNECTION_ERRORS as exc:
                error = exc
            if attempt + 1 < policy.attempts:
                delay = policy.delay(attempt)
                self._log(f"{what}: {_describe(error)}; retrying in {delay:.1f}s ({attempt + 1}/{policy.attempts})")
                policy.sleep(delay)
        raise KubeApiError(
            f"{what} still failing after {policy.attempts} attempts: {_describe(error)}", getattr(error, "status", None)
        )

    # -- prerequisites -----------------------------------------------------------------------------
    def check_jobset_installed(self) -> None:
        """Before anything is created: the JobSet CRD exists and knows spec.coordinator (JobSet 0.6+).

        Reading CRDs is cluster-wide; an account that may not is let through with a log line (a
        missing JobSet then shows at the JobSet's creation, where the 404 is explained again)."""
        try:
            crd = self._read_jobset_crd()
        except client.ApiException as exc:
            if exc.status == 404:
                raise JobSetNotInstalledError(prerequisites.not_installed(), 404) from exc
            if exc.status in (401, 403):
                self._log(
                    f"[kube] cannot read CustomResourceDefinition {JOBSET_CRD} (HTTP {exc.status}); "
                    "assuming JobSet is installed"
                )
                return
            raise _api_error(f"read CustomResourceDefinition {JOBSET_CRD}", exc) from exc
        problem = prerequisites.jobset_crd_problem(crd)
        if problem:
            raise JobSetNotInstalledError(problem)

    def _read_jobset_crd(self) -> Manifest:
        # Raw JSON: the typed model would turn the schema into nested objects for one lookup.
        api = client.ApiextensionsV1Api(self._core.api_client)
        response = self._retry(
            f"read CustomResourceDefinition {JOBSET_CRD}",
            lambda: api.read_custom_resource_definition(JOBSET_CRD, _preload_content=False),
        )
        return json.loads(response.data)

    # -- namespace and service account -----------------------------------------------------------
    def ensure(self, doc: Manifest) -> None:
        """Make sure a Namespace or ServiceAccount exists (they outlive runs): read it, create it
        only when it is missing. An account that may use an existing namespace need not be
        allowed to create one; where it may not even read it, it is assumed to exist (a missing
        one then shows at the JobSet's creation, with a message saying so)."""
        kind, name = doc["kind"], doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace", "")
        if kind == "Namespace":
            read, create = (lambda: self._core.read_namespace(name)), (lambda: self._core.create_namespace(doc))
            scope = "cluster-wide (namespaces are not namespaced)"
        elif kind == "ServiceAccount":
            read = lambda: self._core.read_namespaced_service_account(name, ns)  # noqa: E731 - the call _retry repeats
            create = lambda: self._core.create_namespaced_service_account(ns, doc)  # noqa: E731 - the call _retry repeats
            scope = f"in namespace {ns}"
        else:
            raise ValueError(f"ensure() handles Namespace and ServiceAccount, not {kind}")
        try:
            self._retry(f"read {kind} {name}", read)
            return
        except client.ApiException as exc:
            if exc.status not in (403, 404):
                raise _api_error(f"read {kind} {name}", exc) from exc
            readable = exc.status == 404
        try:
            self._retry(f"create {kind} {name}", create, retry_conflicts=False)
        except client.ApiException as exc:
            if exc.status == 409:
                return
            if exc.status == 403 and not readable:
                self._log(f"[kube] cannot read or create {kind} {name} (HTTP 403); assuming it exists")
                return
            if exc.status == 403:
                raise KubeApiError(
                    f"{kind} {name} does not exist and this account may not create it: it lacks `create` on "
                    f"{kind.lower()}s {scope}. Create it once with an account that may "
                    f"(kubectl create {kind.lower()} {name}{' -n ' + ns if ns else ''}), or use one that exists "
                    f"(--namespace).",
                    403,
                ) from exc
            raise _api_error(f"create {kind} {name}", exc) from exc

    # -- JobSet ----------------------------------------------------------------------------------
    def create_jobset(self, jobset: Manifest) -> Manifest:
        ns, name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
        run_id = jobset["metadata"].get("annotations", {}).get(RUN_ID_ANNOTATION)
        create = lambda: self._custom.create_namespaced_custom_object(  # noqa: E731 - the call _retry repeats
            JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, jobset
        )
        policy = self._retry_policy
        for attempt in range(policy.attempts):
            try:
                return self._retry(f"create JobSet {ns}/{name}", create, retry_conflicts=False)
            except client.ApiException as exc:
                if exc.status == 404:
                    raise self._jobset_missing(ns) from exc
                if exc.status == 403:
                    raise KubeApiError(
                        f"create JobSet {ns}/{name}: HTTP 403: this account lacks `create` on "
                        f"jobsets.{JOBSET_GROUP} in namespace {ns} (and get/list/watch/delete for the rest of "
                        "the run); grant it a Role there (see k8s/README.md)",
                        403,
                    ) from exc
                if exc.status != 409:
                    raise _api_error(f"create JobSet {ns}/{name}", exc) from exc
            existing = self.get_jobset(ns, name)
            if existing is not None and run_id and _run_id(existing) == run_id:
                self._log(f"JobSet {ns}/{name} exists from this run's earlier attempt; using it")
                return existing
            if existing is not None and not existing["metadata"].get("deletionTimestamp"):
                raise JobSetExistsError(
                    f"JobSet {ns}/{name} already exists and belongs to another run; pick another --name "
                    f"or delete it: kubectl delete jobset {name} -n {ns}",
                    409,
                )
            self._log(f"JobSet {ns}/{name}: conflict while the old one is going away; retrying")
            policy.sleep(policy.delay(attempt))
        raise KubeApiError(f"create JobSet {ns}/{name}: still conflicting after {policy.attempts} attempts", 409)

    def _jobset_missing(self, ns: str) -> KubeApiError:
        """Why creating a JobSet answered 404: the JobSet CRD is not installed, or the namespace is gone."""
        try:
            self._read_jobset_crd()
        except client.ApiException as exc:
            if exc.status == 404:
                return JobSetNotInstalledError(prerequisites.not_installed(), 404)
            return KubeApiError(
                f"creating a JobSet in namespace {ns} answered HTTP 404: either JobSet is not installed "
                f"(install JobSet {JOBSET_MIN_VERSION}+; the CRD {JOBSET_CRD} could not be read here: HTTP "
                f"{exc.status}) or namespace {ns} does not exist",
                404,
            )
        return KubeApiError(
            f"creating a JobSet answered HTTP 404 although JobSet is installed: namespace {ns} "
            "does not exist; create it or pass --namespace of one that does",
            404,
        )

    def get_jobset(self, ns: str, name: str) -> Manifest | None:
        try:
            return self._retry(
                f"get JobSet {ns}/{name}",
                lambda: self._custom.get_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, name
                ),
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise _api_error(f"get JobSet {ns}/{name}", exc) from exc

    def delete_jobset(self, ns: str, name: str) -> bool:
        """Delete with its pods (foreground propagation); False if it was already gone."""
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        try:
            self._retry(
                f"delete JobSet {ns}/{name}",
                lambda: self._custom.delete_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, name, body=body
                ),
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise _api_error(f"delete JobSet {ns}/{name}", exc) from exc
        return True

    def watch_jobset(self, ns: str, name: str, segment_s: float) -> Iterator[Manifest | None]:
        """The JobSet now (a fresh list), then each change for up to `segment_s` seconds.

        Yields None when the JobSet is gone. Returns early on 410 Gone (expired resourceVersion)
        or a dropped connection; the caller calls again, which re-lists: the list is what makes a
        watch restart safe.
        """
        listing = self._retry(
            f"list JobSet {ns}/{name}",
            lambda: self._custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, ns, JOBSET_PLURAL, field_selector=f"metadata.name={name}"
            ),
        )
        items = [i for i in listing.get("items", []) if i["metadata"]["name"] == name]
        yield items[0] if items else None
        stream = watch.Watch().stream(
            self._custom.list_namespaced_custom_object,
            JOBSET_GROUP,
            JOBSET_VERSION,
            ns,
            JOBSET_PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=listing["metadata"].get("resourceVersion"),
            timeout_seconds=max(1, int(segment_s)),
            _request_timeout=segment_s + 10,
        )
        try:
            for event in stream:
                yield None if event["type"] == "DELETED" else event["object"]
        except client.ApiException as exc:
            if exc.status != 410 and exc.status not in RETRYABLE_STATUSES:
                raise _api_error(f"watch JobSet {ns}/{name}", exc) from exc
            self._log(f"watch JobSet {ns}/{name}: {_describe(exc)}; re-listing")
            if exc.status != 410:
                self._retry_policy.sleep(self._retry_policy.delay(0))
        except CONNECTION_ERRORS as exc:
            self._log(f"watch JobSet {ns}/{name}: {_describe(exc)}; re-listing")

    # -- pods and logs ---------------------------------------------------------------------------
    def list_pods(self, ns: str, jobset_name: str) -> list[PodState]:
        selector = f"{JOBSET_NAME_LABEL}={jobset_name}"
        pods = self._retry(
            f"list pods of {ns}/{jobset_name}", lambda: self._core.list_namespaced_pod(ns, label_selector=selector)
        )
        return sorted(
            (_pod_state(p) for p in pods.items if (p.metadata.labels or {}).get(JOBSET_NAME_LABEL) == jobset_name),
            key=lambda p: (p.slice_id, p.host_id, p.name),
        )

    def read_log(self, ns: str, pod: str) -> str | None:
        """The worker container's log, or None if it cannot be read (pod gone, never started)."""
        try:
            return self._retry(
                f"read log of {ns}/{pod}", lambda: self._core.read_namespaced_pod_log(pod, ns, container=CONTAINER)
            )
        except (client.ApiException, KubeApiError) as exc:
            self._log(f"read log of {ns}/{pod}: {_describe(exc)}")
            return None


def _pod_state(pod: client.V1Pod) -> PodState:
    meta = pod.metadata
    labels, annotations = meta.labels or {}, meta.annotations or {}
    index = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX) or "-1"
    status = pod.status or client.V1PodStatus()
    waiting = _waiting(pod)
    return PodState(
        name=meta.name,
        slice_id=int(labels.get(JOB_INDEX_LABEL, "-1")),
        host_id=int(index),
        phase=status.phase or "Unknown",
        detail=_termination(status, waiting),
        waiting=waiting,
    )


def _termination(status: client.V1PodStatus, waiting: tuple[ContainerWaiting, ...]) -> str:
    for cs in status.container_statuses or []:
        if cs.name == CONTAINER and cs.state and cs.state.terminated:
            t = cs.state.terminated
            return f"terminated: {t.reason or 'exited'} exit {t.exit_code}"
    if waiting:  # why a pod has no log: it never started
        return f"waiting: {waiting[0].reason}"
    return status.reason or ""


def _waiting(pod: client.V1Pod) -> tuple[ContainerWaiting, ...]:
    spec, status = pod.spec, pod.status or client.V1PodStatus()
    images = {c.name: c.image for c in [*(spec.init_containers or []), *(spec.containers or [])]} if spec else {}
    return tuple(
        ContainerWaiting(
            cs.name, images.get(cs.name) or cs.image or "", cs.state.waiting.reason, cs.state.waiting.message or ""
        )
        for cs in [*(status.init_container_statuses or []), *(status.container_statuses or [])]
        if cs.state and cs.state.waiting and cs.state.waiting.reason
    )


def _run_id(obj: Manifest) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(RUN_ID_ANNOTATION)


def _describe(error: Exception) -> str:
    if isinstance(error, client.ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    return f"{type(error).__name__}: {error}"


def _api_error(what: str, exc: client.ApiException) -> KubeApiError:
    hint = (
        " (check RBAC: the launcher needs create/get/list/watch/delete on jobsets and list on pods)"
        if exc.status in (401, 403)
        else ""
    )
    return KubeApiError(f"{what}: {_describe(exc)}{hint}", exc.status)
