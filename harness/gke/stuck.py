"""Containers the kubelet will not start, found while the JobSet runs.

Without this, a pod whose image cannot be pulled sits in Pending until --timeout (3 h by default)
while the TPU node pools of every slice stay held, and the run then only says "timeout". The
kubelet's `state.waiting.reason` says why a container has not started; the reasons below never
resolve without someone changing the image, the cluster or the manifest, so the run ends at once
and names pod, container, image and reason.

ErrImagePull alone gets a grace (PULL_ERROR_GRACE_S): it is the kubelet's report of the one
attempt that just failed, and a pull that failed on a transient error (a registry 5xx or 429, a
connection reset on a node whose network is still coming up) can succeed on the kubelet's next
attempt. It counts once the same container has shown it for the whole grace. ImagePullBackOff is
the kubelet waiting after a failed pull and is terminal: a missing tag or permission never heals,
and a registry outage is better re-run than left holding TPU node pools.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.gke.errors import PodStuckError
from harness.gke.kube import ContainerWaiting, PodState

PULL_ERROR_GRACE_S = 30.0  # longer than a watch segment, far shorter than a run
_PULL_HINT = (
    "check that the image exists and that the TPU node pools' service account may pull it "
    "(roles/artifactregistry.reader on the repository, k8s/README.md)"
)
# Waiting reason -> what to do. Every one of them is final for this run.
TERMINAL = {
    "InvalidImageName": "the node cannot parse the image reference: fix --image",
    "ImagePullBackOff": _PULL_HINT,
    "ErrImageNeverPull": "imagePullPolicy is Never and the node lacks the image: push it and use its registry path",
    "ImageInspectError": "the node's runtime cannot read the image: rebuild and push it (scripts/build-worker-image.sh)",
    "SignatureValidationFailed": "the image's signature did not verify: use a signed image",
    "CreateContainerConfigError": "the pod refers to a Secret or ConfigMap (or a key of one) that does not exist, "
    "or to an invalid env/volume source: create it or fix the manifest in k8s/base",
    "CreateContainerError": "the container runtime could not create the container: see its message",
    "RunContainerError": "the container runtime could not start the container: see its message",
    "PreStartHookError": "the container's pre-start hook failed: see its message",
    "PostStartHookError": "the container's post-start hook failed: see its message",
    "CrashLoopBackOff": "the container keeps exiting: read its log (kubectl logs)",
}
# Reported for a pull that may still succeed on the kubelet's next attempt.
TRANSIENT = {
    "ErrImagePull": _PULL_HINT,
    "RegistryUnavailable": "the registry did not answer: check its status, then re-run",
}


class StuckWatch:
    """Remembers since when each container has shown a transient reason; check() raises PodStuckError."""

    def __init__(
        self, namespace: str, grace_s: float = PULL_ERROR_GRACE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._namespace, self._grace_s, self._clock = namespace, grace_s, clock
        self._since: dict[tuple[str, str, str], float] = {}  # (pod, container, reason) -> first seen

    def check(self, pods: list[PodState]) -> None:
        now, seen = self._clock(), set()
        for pod in pods:
            for waiting in pod.waiting:
                if waiting.reason in TERMINAL:
                    raise PodStuckError(self._describe(pod, waiting, waiting.reason, TERMINAL[waiting.reason]))
                if waiting.reason in TRANSIENT:
                    key = (pod.name, waiting.container, waiting.reason)
                    seen.add(key)
                    if now - self._since.setdefault(key, now) >= self._grace_s:
                        what = f"{waiting.reason} for {self._grace_s:.0f}s or more"
                        raise PodStuckError(self._describe(pod, waiting, what, TRANSIENT[waiting.reason]))
        # A container that moved on (started, or another reason) starts its grace afresh next time.
        self._since = {key: since for key, since in self._since.items() if key in seen}

    def _describe(self, pod: PodState, waiting: ContainerWaiting, what: str, hint: str) -> str:
        message = f": {waiting.message}" if waiting.message else ""
        return (
            f"pod {self._namespace}/{pod.name}: container {waiting.container} (image {waiting.image!r}) "
            f"cannot start: {what}{message}; {hint}"
        )
