"""ChildPool bookkeeping, with real child processes on the fake backend."""

from __future__ import annotations

import pytest

from harness.config.backends import FakeBackend
from harness.isolation.parent.child_process import ChildSpec
from harness.isolation.parent.pool import ChildPool
from harness.isolation.system.processes import wait_for_exit

pytestmark = pytest.mark.selftest


def spec(functionalization: bool) -> ChildSpec:
    backend = FakeBackend(devices=4)
    return ChildSpec.build(backend.child_env(functionalization), fork_imports=backend.fork_imports(True))


@pytest.fixture
def pool(tmp_path):
    pools = []

    def make(exclusive: bool, spares: bool = False, fork: bool = False) -> ChildPool:
        pools.append(ChildPool(tmp_path / "logs", startup_timeout=60, exclusive=exclusive, spares=spares, fork=fork))
        return pools[-1]

    yield make
    for p in pools:
        p.close()


def test_every_acquire_is_a_child_that_ran_no_case(pool):
    children = pool(False, fork=True)
    first = children.acquire(spec(True))
    spare = children.spares[spec(True)]  # forked: a spare even without `spares` (xdist)
    assert spare is not first and spare.cases_run == 0
    children.release(first)
    assert first.ended and wait_for_exit(first.proc, 10) is not None
    assert children.acquire(spec(True)) is spare
    other = children.acquire(spec(False))
    assert other is not spare and other.cases_run == 0
    children.release(spare)
    children.release(other)
    assert children.started == 5  # first, spare, the spare's spare, other and its spare


def test_exclusive_devices_never_get_spares_and_close_one_child_before_the_next(pool):
    children = pool(True, spares=True)
    child = children.acquire(spec(True))
    assert children.spares == {}
    children.release(child)
    other = children.acquire(spec(False))
    assert child.ended and children.spares == {}
    children.release(other)


def test_exec_children_get_spares_only_where_a_core_is_free(pool):
    busy = pool(False)  # xdist: every core runs a worker, and an exec'd spare imports
    busy.release(busy.acquire(spec(True)))
    assert busy.spares == {}
    free = pool(False, spares=True)
    free.release(free.acquire(spec(True)))
    assert spec(True) in free.spares
