"""What the cluster must have before a run creates anything: JobSet, new enough for spec.coordinator.

Read from the JobSet CustomResourceDefinition itself. A missing CRD would otherwise show as a bare
HTTP 404 on the JobSet's creation; a JobSet older than 0.6 is worse: its CRD lacks
`spec.coordinator`, the API server prunes the field without a word, the coordinator label never
appears and every host starts with an empty MEGASCALE_COORDINATOR_ADDRESS.
"""

from __future__ import annotations

from typing import Any

from harness.gke.manifest import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION

JOBSET_CRD = f"{JOBSET_PLURAL}.{JOBSET_GROUP}"
JOBSET_MIN_VERSION = "0.6"  # the first release with spec.coordinator
INSTALL_HINT = (
    "e.g. kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.8.2/manifests.yaml"
)


def not_installed() -> str:
    return (
        f"JobSet is not installed on this cluster (no CustomResourceDefinition {JOBSET_CRD}). Install JobSet "
        f"{JOBSET_MIN_VERSION} or newer (spec.coordinator needs it), {INSTALL_HINT}"
    )


def jobset_crd_problem(crd: dict[str, Any]) -> str | None:
    """Why this JobSet CRD cannot run the harness's JobSet, or None if it can."""
    versions = {v.get("name"): v for v in crd.get("spec", {}).get("versions", []) if v.get("served")}
    if JOBSET_VERSION not in versions:
        return (
            f"the installed JobSet serves {sorted(versions) or 'no version'} of {JOBSET_GROUP}, not "
            f"{JOBSET_VERSION}: install JobSet {JOBSET_MIN_VERSION} or newer, {INSTALL_HINT}"
        )
    schema = versions[JOBSET_VERSION].get("schema", {}).get("openAPIV3Schema", {})
    spec_fields = schema.get("properties", {}).get("spec", {}).get("properties", {})
    if "coordinator" not in spec_fields:
        return (
            f"the installed JobSet is older than {JOBSET_MIN_VERSION}: its CRD {JOBSET_CRD} has no "
            "spec.coordinator, which the API server would drop silently, leaving every host without "
            f"MEGASCALE_COORDINATOR_ADDRESS. Upgrade JobSet, {INSTALL_HINT}"
        )
    return None
