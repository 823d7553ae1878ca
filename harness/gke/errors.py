"""Typed errors of the GKE fan-out. The CLI maps them to exit codes; nothing below it exits.

A bad accelerator, topology, slice count or option is the harness's one usage error,
harness.errors.HarnessUsageError (exit 2).
"""

from __future__ import annotations

from harness.errors import HarnessError


class GkeHarnessError(HarnessError):
    """Base class: every message says what went wrong and what to do about it."""


class KubeApiError(GkeHarnessError):
    """The Kubernetes API refused or kept failing after the bounded retries."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class JobSetExistsError(KubeApiError):
    """A JobSet of that name exists and is not ours: choose another --name or delete it."""


class ReportError(GkeHarnessError):
    """A host's report block is missing or corrupt; the host counts as failed with this reason."""


class JobSetNotInstalledError(KubeApiError):
    """JobSet is missing from the cluster, or too old for spec.coordinator: the message says what to install."""


class PodStuckError(GkeHarnessError):
    """A pod's container is waiting for something that will not come (its image, a Secret, ...): the run
    cannot finish, so it ends now instead of at --timeout. The message names pod, container, image and reason."""
