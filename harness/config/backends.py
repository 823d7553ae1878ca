"""Backends: where case bodies run. One small interface, three implementations.

A backend turns run settings into a child environment and says what it can offer (device
count, jax, multi-slice). Like an httpx transport, it is the one extension point, and `fake`
ships with the library so the harness can test itself in seconds without torch_xla.

Nothing here imports torch_xla. The only runtime query (the TPU device count) happens in a
child process, lazily, the first time a case asks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from harness.errors import HarnessUsageError
from harness.isolation.backend import Backend, Capabilities
from harness.isolation.server.forkserver import TORCH_IMPORTS, XLA_IMPORTS
from harness.isolation.wire import protocol

# Set-up hook every XLA child runs before its first case: import torch_xla, switch SPMD on.
XLA_SPMD_PRELOAD = "harness.xla:enable_spmd"

# Variables a child inherits from the parent; everything else is set explicitly.
BASE_ENV_VARS = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "USER",
    protocol.XLA_DUMP_ROOT_ENV,
)
# CPU children compile with LLVM at -O0. The cases judge what XLA's HLO passes and the SPMD
# partitioner decide (shardings, collectives) and numerics to a tolerance, never how fast the CPU
# kernels run; LLVM's optimisation was a third of a ViT train step's compile. The optimised,
# partitioned module is byte-identical either way (compared on torch_xla 2.9.0; the release
# matrix 2.4.0-2.9.0 sees no sharding or cost change), and so are the baselines.
CPU_XLA_FLAGS = "--xla_backend_optimization_level=0"
# On a TPU host the runtime and GKE put the topology in these; a child must see them.
TPU_ENV_PREFIXES = ("TPU_", "MEGASCALE_", "LIBTPU_", "JAX_", "SKIP_MEGASCALE", "XLA_FLAGS")


def base_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _functionalization_env(functionalization: bool) -> dict[str, str]:
    return {"XLA_DISABLE_FUNCTIONALIZATION": "0" if functionalization else "1"}


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class CpuBackend:
    """PJRT CPU with N virtual devices: the local and PR-CI backend."""

    name = "cpu"
    exclusive_device = False

    def __init__(self, devices: int) -> None:
        self.devices = devices

    def child_env(self, functionalization: bool) -> dict[str, str]:
        return {
            **base_env(),
            "PJRT_DEVICE": "CPU",
            "CPU_NUM_DEVICES": str(self.devices),
            protocol.BACKEND_ENV: self.name,
            protocol.DEVICES_ENV: str(self.devices),
            "XLA_FLAGS": CPU_XLA_FLAGS,
            # torch's OpenMP threads sleep between the CPU reference's ops instead of spinning:
            # under `-n 2` on 2 cores a spinning thread took the core another worker's child was
            # waiting for (2.7% of a run's CPU, `perf`); the ops, their threads and results are the same.
            "OMP_WAIT_POLICY": "PASSIVE",
            **_functionalization_env(functionalization),
        }

    def preload(self) -> tuple[str, ...]:
        return (XLA_SPMD_PRELOAD,)

    def fork_imports(self, preload: bool) -> tuple[str, ...] | None:
        # A body that must see the process before torch_xla is imported gets a torch-only server.
        return XLA_IMPORTS if preload else TORCH_IMPORTS

    def capabilities(self) -> Capabilities:
        return Capabilities(self.devices, _module_available("torch_xla"), _module_available("jax"))


class TpuBackend:
    """PJRT TPU of the host it runs on; device count and slice count come from the runtime."""

    name = "tpu"
    exclusive_device = True

    def __init__(self) -> None:
        self._caps: Capabilities | None = None

    def child_env(self, functionalization: bool) -> dict[str, str]:
        passed = {k: v for k, v in os.environ.items() if k.startswith(TPU_ENV_PREFIXES)}
        devices = str(self._caps.devices) if self._caps else ""
        return {
            **base_env(),
            **passed,
            "PJRT_DEVICE": "TPU",
            protocol.BACKEND_ENV: self.name,
            protocol.DEVICES_ENV: devices,
            **_functionalization_env(functionalization),
        }

    def preload(self) -> tuple[str, ...]:
        return (XLA_SPMD_PRELOAD,)

    def fork_imports(self, preload: bool) -> tuple[str, ...] | None:
        return None  # fresh processes until forking is measured on a TPU host (libtpu, MegaScale)

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = self._probe()
        return self._caps

    def _probe(self) -> Capabilities:
        if not _module_available("torch_xla"):
            return Capabilities(0, False, _module_available("jax"))
        code = (
            "import json, torch_xla.runtime as xr; xr.use_spmd(); "
            "print(json.dumps({'devices': xr.global_runtime_device_count()}))"
        )
        env = {
            **base_env(),
            **{k: v for k, v in os.environ.items() if k.startswith(TPU_ENV_PREFIXES)},
            "PJRT_DEVICE": "TPU",
        }
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        devices = json.loads(proc.stdout.strip().splitlines()[-1])["devices"] if proc.returncode == 0 else 0
        slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1") or 1)
        return Capabilities(devices, True, _module_available("jax"), slices)


class FakeBackend:
    """No torch_xla at all: children run pure-Python bodies. For testing the harness itself."""

    name = "fake"
    exclusive_device = False

    def __init__(self, devices: int) -> None:
        self.devices = devices

    def child_env(self, functionalization: bool) -> dict[str, str]:
        env = {
            **base_env(),
            protocol.BACKEND_ENV: self.name,
            protocol.DEVICES_ENV: str(self.devices),
            "XLA_FLAGS": CPU_XLA_FLAGS,
            **_functionalization_env(functionalization),
        }
        if protocol.FAKE_VERSION_ENV in os.environ:
            env[protocol.FAKE_VERSION_ENV] = os.environ[protocol.FAKE_VERSION_ENV]
        return env

    def preload(self) -> tuple[str, ...]:
        return ()

    def fork_imports(self, preload: bool) -> tuple[str, ...] | None:
        return ()  # a server that imports nothing: the fork machinery, tested without torch

    def capabilities(self) -> Capabilities:
        return Capabilities(self.devices, has_xla=False, has_jax=False)


BACKEND_NAMES = ("cpu", "tpu", "fake")


def make_backend(name: str, devices: int) -> Backend:
    if name == "cpu":
        return CpuBackend(devices)
    if name == "tpu":
        return TpuBackend()
    if name == "fake":
        return FakeBackend(devices)
    raise HarnessUsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKEND_NAMES)}")
