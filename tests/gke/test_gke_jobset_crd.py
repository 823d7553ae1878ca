"""The rendered JobSets validate against the JobSet CRD schemas of the releases clusters run.

The CRDs are reference data in ../shared/data/jobset-crd/ (kubernetes-sigs/jobset v0.8.2 and
v0.12.0), read from there and never copied in; where that folder is absent the tests skip. The
CRD's structural schema is translated for a JSON-schema validator: `nullable` admits null,
`x-kubernetes-int-or-string` admits both, and fields the schema does not declare are reported
(the API server would prune them silently: a field JobSet does not know is a field that does
nothing). CEL rules (`x-kubernetes-validations`) are not evaluated here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.gke import accelerators, manifest, prerequisites

pytestmark = pytest.mark.selftest

CRD_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "jobset-crd"
RELEASES = ["v0.8.2", "v0.12.0"]
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the test extra (check-jsonschema)")


def released_crd(release: str) -> dict[str, Any]:
    path = CRD_DIR / f"{release}.yaml"
    if not path.is_file():
        pytest.skip(f"JobSet CRD data absent: {path} (reference data from ../shared/data/jobset-crd)")
    return next(d for d in yaml.safe_load_all(path.read_text()) if d)


def crd_schema(release: str) -> dict[str, Any]:
    crd = released_crd(release)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == manifest.JOBSET_VERSION)
    return to_json_schema(version["schema"]["openAPIV3Schema"])


def to_json_schema(node: Any) -> Any:
    """A Kubernetes structural schema as a JSON schema (see the module docstring)."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("accel", [pytest.param(a, id=a.overlay) for a in accelerators.ACCELERATORS])
def test_rendered_jobsets_validate_against_the_crd(release: str, accel: accelerators.AcceleratorType) -> None:
    jobset = manifest.find(manifest.render(accel, 2, "img:1", gcs_uri="gs://bucket/run"), "JobSet")
    assert errors(crd_schema(release), jobset) == []


@pytest.mark.parametrize("release", RELEASES)
def test_the_validation_can_fail(release: str) -> None:
    schema = crd_schema(release)
    jobset = manifest.find(manifest.render(accelerators.ACCELERATORS[0], 2, "img:1"), "JobSet")
    jobset["spec"]["replicatedJobs"][0]["replicas"] = "two"  # wrong type
    jobset["spec"]["coordinator"]["podIndx"] = 0  # a field JobSet does not know would be dropped
    found = errors(schema, jobset)
    assert any("replicas" in e for e in found) and any("podIndx" in e for e in found), found


@pytest.mark.parametrize("release", RELEASES)
def test_the_released_crds_pass_the_launchers_prerequisite_check(release: str) -> None:
    crd = released_crd(release)
    assert crd["metadata"]["name"] == prerequisites.JOBSET_CRD
    assert prerequisites.jobset_crd_problem(crd) is None


@pytest.mark.parametrize("release", RELEASES)
def test_the_prerequisite_check_refuses_what_cannot_run_the_jobset(release: str) -> None:
    without_coordinator = released_crd(release)
    for version in without_coordinator["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["coordinator"]
    assert "older than 0.6" in (prerequisites.jobset_crd_problem(without_coordinator) or "")
    unserved = released_crd(release)
    for version in unserved["spec"]["versions"]:
        version["served"] = False
    assert "not v1alpha2" in (prerequisites.jobset_crd_problem(unserved) or "")
