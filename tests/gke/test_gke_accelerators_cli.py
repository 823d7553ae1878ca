"""The accelerator table and the CLI's usage errors (exit 2, naming the valid values)."""

from __future__ import annotations

import io

import pytest

from harness.errors import HarnessUsageError
from harness.gke import accelerators
from harness.gke.__main__ import duration, main

pytestmark = pytest.mark.selftest


@pytest.mark.parametrize(
    "name, topology, hosts, chips",
    [
        ("v4", "2x2x2", 2, 4),  # v4-16
        ("v6e", "4x4", 4, 4),  # v6e-16
        ("v6e", "2x4", 2, 4),  # v6e-8
    ],
)
def test_table(name: str, topology: str, hosts: int, chips: int) -> None:
    accel = accelerators.lookup(name, topology)
    assert (accel.hosts_per_slice, accel.chips_per_host) == (hosts, chips)


@pytest.mark.parametrize(
    "row, message",
    [
        # 16 chips cannot be 2 hosts of 4
        (dict(name="x", gke_accelerator="a", topology="4x4", chips_per_host=4, hosts_per_slice=2), "cannot be 2 hosts"),
        # a single-host slice cannot do multi-slice on GKE
        (dict(name="x", gke_accelerator="a", topology="2x2x1", chips_per_host=4, hosts_per_slice=1), "multi-host"),
        # not a topology at all
        (dict(name="x", gke_accelerator="a", topology="4by4", chips_per_host=4, hosts_per_slice=4), "look like"),
    ],
)
def test_bad_rows_are_rejected(row: dict, message: str) -> None:
    with pytest.raises(HarnessUsageError, match=message):
        accelerators.AcceleratorType(**row)


@pytest.mark.parametrize(
    "argv, message",
    [
        # unknown accelerator: lists the valid ones
        (["--accelerator", "v5p", "--topology", "2x2x2"], "unknown accelerator 'v5p'; valid: v4, v6e"),
        # known accelerator, wrong topology: lists its topologies
        (["--accelerator", "v6e", "--topology", "8x8"], "unsupported topology '8x8' for v6e; valid: 4x4, 2x4"),
        # v4 2x2x1 is single-host: not in the table on purpose
        (["--accelerator", "v4", "--topology", "2x2x1"], "valid: 2x2x2"),
        # one slice is not multi-slice
        (["--accelerator", "v4", "--topology", "2x2x2", "--slices", "1"], "valid: 2..8"),
        # no image and not --local
        (["--accelerator", "v4", "--topology", "2x2x2"], "--image is required"),
        # a JobSet name that cannot be a pod hostname prefix
        (["--accelerator", "v4", "--topology", "2x2x2", "--image", "i", "--name", "Nightly", "--dry-run"], "DNS label"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv], out=io.StringIO())
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_kubeconfig_is_a_usage_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("kubernetes", reason="the launcher's client comes with the gke/test extras")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--accelerator",
                "v4",
                "--topology",
                "2x2x2",
                "--image",
                "i",
                "--kubeconfig",
                str(tmp_path / "none"),
            ],
            out=io.StringIO(),
        )
    assert exc.value.code == 2 and "get-credentials" in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("900", 900), ("90m", 5400), ("3h", 10800), ("1.5s", 1.5)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1", "0", "3d"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(Exception, match="duration|positive"):
        duration(text)
