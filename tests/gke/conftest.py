"""Fixtures for the GKE fan-out tests: kmock served on 127.0.0.1 and a Kube pointed at it."""

from __future__ import annotations

from typing import Iterator

import pytest
from kubernetes import client

from gke_emulator import EmulatorThread
from harness.gke.kube import Kube, RetryPolicy

# Fast but real backoff: the retry tests wait a few hundredths of a second, not seconds.
FAST_RETRY = RetryPolicy(attempts=4, base_s=0.01, cap_s=0.05)


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread() as served:
        yield served


@pytest.fixture
def api(emulator: EmulatorThread) -> Iterator[client.ApiClient]:
    config = client.Configuration()
    config.host = emulator.url
    with client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def kube_log() -> list[str]:
    return []


@pytest.fixture
def kube(api: client.ApiClient, kube_log: list[str]) -> Kube:
    return Kube(api, retry=FAST_RETRY, log=kube_log.append)
