"""What the launcher refuses before it contacts the cluster: input the API or the nodes would refuse.

Each bad value must end the CLI with exit 2 and a message naming the flag, and the emulator must
not have seen a single request (a refused --image would otherwise hold TPU node pools while the
pods sit in InvalidImageName).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kmock", reason="the kmock emulator comes with the test extra")
pytest.importorskip("kubernetes", reason="the launcher's client comes with the gke/test extras")

from gke_emulator import EmulatorThread

from harness.gke.__main__ import EXIT_USAGE, main

pytestmark = pytest.mark.selftest

BASE = ["run", "--accelerator", "v4", "--topology", "2x2x2", "--timeout", "5s"]


def kubeconfig_for(emulator: EmulatorThread, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
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
    return path


@pytest.mark.parametrize(
    "flags, named",
    [
        # a space: the kubelet answers InvalidImageName and the pod never starts
        (["--image", "a b"], "--image 'a b'"),
        # upper case in the repository path is not a valid reference either
        (["--image", "registry.example/Team/worker:1"], "--image 'registry.example/Team/worker:1'"),
        # a digest whose hex is cut short
        (["--image", "img@sha256:abc"], "--image 'img@sha256:abc'"),
        # namespaces are DNS-1123 labels: no upper case, no underscore
        (["--image", "img:1", "--namespace", "Bad_NS"], "--namespace 'Bad_NS'"),
        # the worker only uploads to gs://; anything else would be reported as "not uploaded" hours later
        (
            ["--image", "img:1", "--gcs-uri", "http://storage.example/bucket"],
            "--gcs-uri 'http://storage.example/bucket'",
        ),
        # a bucket name with upper case letters does not exist
        (["--image", "img:1", "--gcs-uri", "gs://Nightly_Reports/x"], "--gcs-uri 'gs://Nightly_Reports/x'"),
    ],
)
def test_bad_input_exits_2_naming_the_flag_before_any_request(emulator, tmp_path, capsys, flags, named) -> None:
    argv = [*BASE, *flags, "--kubeconfig", str(kubeconfig_for(emulator, tmp_path)), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exited:
        main(argv, out=io.StringIO())
    assert exited.value.code == EXIT_USAGE
    assert named in capsys.readouterr().err
    assert emulator.emulator.requests_seen == [], "it contacted the cluster before refusing"


def test_bad_input_is_refused_by_dry_run_too(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*BASE, "--image", "a b", "--dry-run"], out=io.StringIO())
    assert exited.value.code == EXIT_USAGE and "--image 'a b'" in capsys.readouterr().err


def test_the_gcs_uri_from_the_environment_is_checked_and_named(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPMD_HARNESS_GCS_URI", "s3://elsewhere")
    with pytest.raises(SystemExit) as exited:
        main([*BASE, "--image", "img:1", "--dry-run"], out=io.StringIO())
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--gcs-uri 's3://elsewhere'" in err and "SPMD_HARNESS_GCS_URI" in err


@pytest.mark.parametrize(
    "image",
    [
        "img:1",
        "spmd-harness-worker",
        "localhost:5000/spmd/worker:nightly",
        "us-central1-docker.pkg.dev/tpu-pytorch-releases/docker/development:3.12_tpuvm",
        "REGISTRY.example.com/team/worker_a__b.c-d:TAG-1",  # upper case is fine in the registry and the tag
        "gcr.io/p/w@sha256:" + "a" * 64,
        "gcr.io/p/w:v1@sha256:" + "0" * 64,
    ],
)
def test_valid_image_references_pass(image) -> None:
    from harness.gke import inputs

    assert inputs.check_image(image) == image


@pytest.mark.parametrize("uri", ["gs://bucket", "gs://nightly-reports/run-7/", "gs://a.b_c-d/x y"])
def test_valid_gcs_uris_pass(uri) -> None:
    from harness.gke import inputs

    assert inputs.check_gcs_uri(uri) == uri
