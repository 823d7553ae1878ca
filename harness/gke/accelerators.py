"""The one table of TPU accelerator types the fan-out supports.

Every size the manifests, the launcher and --local use comes from here (like xpk's
SystemCharacteristics, but only what this harness needs). Multi-slice on GKE needs multi-host
slices of one type and topology, so single-host shapes such as v4 2x2x1 are deliberately absent.
"""

from __future__ import annotations

import dataclasses
import math

from harness.errors import HarnessUsageError

MIN_SLICES = 2  # the fan-out exists for multi-slice (bug 4); one slice is what upstream CI covers
MAX_SLICES = 8  # above this a typo would reserve many node pools; raise it deliberately if needed


@dataclasses.dataclass(frozen=True)
class AcceleratorType:
    """One TPU slice shape a JobSet replica (= one slice) runs on."""

    name: str  # short name on the CLI, e.g. "v6e"
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator, e.g. "tpu-v6e-slice"
    topology: str  # node label cloud.google.com/gke-tpu-topology, e.g. "4x4" (chips per dimension)
    chips_per_host: int  # google.com/tpu limit of each pod (a pod owns its host's chips)
    hosts_per_slice: int  # pods per slice = Job parallelism = completions

    def __post_init__(self) -> None:
        dims = _parse_topology(self.topology)
        chips = math.prod(dims)
        if self.chips_per_host <= 0 or chips != self.chips_per_host * self.hosts_per_slice:
            raise HarnessUsageError(
                f"{self.name} {self.topology}: {chips} chips cannot be {self.hosts_per_slice} hosts x "
                f"{self.chips_per_host} chips; fix the table entry"
            )
        if self.hosts_per_slice < 2:
            raise HarnessUsageError(f"{self.name} {self.topology}: multi-slice needs multi-host slices")

    @property
    def overlay(self) -> str:
        """Directory name under k8s/overlays/ for two slices of this shape."""
        return f"{self.name}-{self.topology}"


def _parse_topology(topology: str) -> tuple[int, ...]:
    parts = topology.split("x")
    if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise HarnessUsageError(f"topology {topology!r} must look like 4x4 or 2x2x2")
    return tuple(int(p) for p in parts)


ACCELERATORS: tuple[AcceleratorType, ...] = (
    # v4-16: 8 chips (2 TensorCores each); 2x2x1 (v4-8) is single-host and cannot do multi-slice.
    AcceleratorType("v4", "tpu-v4-podslice", "2x2x2", chips_per_host=4, hosts_per_slice=2),
    # v6e-16: the nightly multi-slice shape.
    AcceleratorType("v6e", "tpu-v6e-slice", "4x4", chips_per_host=4, hosts_per_slice=4),
    # v6e-8: the cheapest multi-host v6e slice.
    AcceleratorType("v6e", "tpu-v6e-slice", "2x4", chips_per_host=4, hosts_per_slice=2),
)


def accelerator_names() -> list[str]:
    return sorted({a.name for a in ACCELERATORS})


def topologies_of(name: str) -> list[str]:
    return [a.topology for a in ACCELERATORS if a.name == name]


def lookup(name: str, topology: str) -> AcceleratorType:
    """The table entry for `name` and `topology`, or a HarnessUsageError listing what is valid."""
    if name not in accelerator_names():
        raise HarnessUsageError(f"unknown accelerator {name!r}; valid: {', '.join(accelerator_names())}")
    for accel in ACCELERATORS:
        if accel.name == name and accel.topology == topology:
            return accel
    raise HarnessUsageError(f"unsupported topology {topology!r} for {name}; valid: {', '.join(topologies_of(name))}")


def check_slices(slices: int) -> int:
    if not MIN_SLICES <= slices <= MAX_SLICES:
        raise HarnessUsageError(
            f"--slices {slices} is out of range; valid: {MIN_SLICES}..{MAX_SLICES} "
            f"(at least 2 for multi-slice; more than {MAX_SLICES} is almost surely a typo)"
        )
    return slices
