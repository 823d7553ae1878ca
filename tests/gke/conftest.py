"""Fixtures for the GKE fan-out tests: kmock served on 127.0.0.1 and a Kube pointed at it.

kmock and kubernetes come with the `test` extra; where they are absent (e.g. the spmd-only install
collecting `pytest -m spmd`) the fixtures skip instead of breaking collection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def emulator() -> Iterator[Any]:
    pytest.importorskip("kmock", reason="the kmock emulator comes with the test extra")
    from gke_emulator import EmulatorThread

    with EmulatorThread() as served:
        yield served


@pytest.fixture
def api(emulator: Any) -> Iterator[Any]:
    from kubernetes import client

    config = client.Configuration()
    config.host = emulator.url
    with client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def kube_log() -> list[str]:
    return []


@pytest.fixture
def kube(api: Any, kube_log: list[str]) -> Any:
    from harness.gke.kube import Kube, RetryPolicy

    # Fast but real backoff: the retry tests wait hundredths of a second, not seconds.
    return Kube(api, retry=RetryPolicy(attempts=4, base_s=0.01, cap_s=0.05), log=kube_log.append)
