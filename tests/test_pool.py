"""ChildPool bookkeeping, with real child processes on the fake backend."""

from __future__ import annotations

import pytest

from harness.config.backends import FakeBackend
from harness.isolation.child_process import ChildSpec
from harness.isolation.pool import ChildPool
from harness.isolation.processes import wait_for_exit

pytestmark = pytest.mark.selftest


def spec(functionalization: bool) -> ChildSpec:
    return ChildSpec.build(FakeBackend(devices=4).child_env(functionalization))


@pytest.fixture
def pool(tmp_path):
    pools = []

    def make(exclusive: bool, spares: bool = False) -> ChildPool:
        pools.append(ChildPool(tmp_path / "logs", startup_timeout=60, exclusive=exclusive, spares=spares))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


@pytest.mark.parametrize(
    "exclusive, first_alive",
    [
        # CPU: both configurations stay warm side by side.
        pytest.param(False, True, id="shared-device"),
        # TPU: one process holds the chips, so the idle child is closed before another starts.
        pytest.param(True, False, id="exclusive-device"),
    ],
)
def test_starting_another_configuration(pool, exclusive, first_alive):
    children = pool(exclusive)
    first = children.acquire(spec(True), fresh=False)
    children.release(first, reusable=True)
    second = children.acquire(spec(False), fresh=False)
    assert first.is_alive() is first_alive
    assert second.is_alive()
    children.release(second, reusable=True)


def test_same_configuration_reuses_and_fresh_does_not(pool):
    children = pool(False)
    first = children.acquire(spec(True), fresh=False)
    children.release(first, reusable=True)
    again = children.acquire(spec(True), fresh=False)
    assert again is first
    fresh = children.acquire(spec(True), fresh=True)
    assert fresh is not first
    children.release(fresh, reusable=False)
    assert fresh.ended and wait_for_exit(fresh.proc, 10) is not None
    children.release(again, reusable=True)
    assert children.started == 2


def test_fresh_cases_get_a_spare_that_has_run_no_case(pool):
    children = pool(False, spares=True)
    first = children.acquire(spec(True), fresh=True)
    spare = children.spares[spec(True)]
    assert spare is not first and spare.cases_run == 0
    children.release(first, reusable=False)
    assert children.acquire(spec(True), fresh=True) is spare
    children.release(spare, reusable=False)


def test_exclusive_devices_never_get_spares(pool):
    children = pool(True, spares=True)
    child = children.acquire(spec(True), fresh=True)
    assert children.spares == {}
    children.release(child, reusable=False)
