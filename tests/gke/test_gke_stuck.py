"""The grace bookkeeping of harness/gke/stuck.py with a clock the test moves (the launcher tests run it for real)."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes", reason="the launcher's client comes with the gke/test extras")

from harness.gke.errors import PodStuckError
from harness.gke.kube import ContainerWaiting, PodState
from harness.gke.stuck import StuckWatch

pytestmark = pytest.mark.selftest


def pod(*reasons: str) -> list[PodState]:
    waiting = tuple(ContainerWaiting("worker", "img:1", r, "rpc error") for r in reasons)
    return [PodState("p-0-0", 0, 0, "Pending", waiting=waiting)]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_err_image_pull_that_clears_within_the_grace_is_forgiven_and_its_grace_restarts() -> None:
    clock = Clock()
    watch = StuckWatch("ns", grace_s=30, clock=clock)
    watch.check(pod("ErrImagePull"))
    clock.now = 20
    watch.check(pod())  # the next attempt pulled the image
    clock.now = 40
    watch.check(pod("ErrImagePull"))  # a new failure: a new grace, not 40 s of one
    clock.now = 69
    watch.check(pod("ErrImagePull"))
    clock.now = 70
    with pytest.raises(
        PodStuckError,
        match=r"pod ns/p-0-0: container worker \(image 'img:1'\) cannot start: "
        r"ErrImagePull for 30s or more: rpc error; check that the image exists",
    ):
        watch.check(pod("ErrImagePull"))


@pytest.mark.parametrize(
    "reason",
    ["ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "ErrImageNeverPull"],
)
def test_terminal_reasons_fail_on_first_sight(reason) -> None:
    with pytest.raises(PodStuckError, match=f"cannot start: {reason}: rpc error"):
        StuckWatch("ns", clock=Clock()).check(pod(reason))
