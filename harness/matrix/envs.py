"""One isolated virtual environment per column, built once and cached.

An environment holds torch, torch_xla (with its `pallas` extra, which pins the jax that release
was built against) and the harness itself installed editable with only its light dependencies.
A marker file is written as the very last step, so a build interrupted halfway (Ctrl-C, a full
disk, a network error) leaves an unmarked folder that the next run deletes and builds again.

The installer sits behind `Installer`, a three-method interface: tests use a fake, the real
one runs `python -m venv` and pip.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from harness.errors import HarnessUsageError
from harness.matrix.errors import CommandTimedOut, EnvBuildError, EnvMismatchError, NotEnoughDiskError
from harness.matrix.procs import last_line_matching, run_logged, tail
from harness.matrix.share import share_identical_files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MARKER = ".spmd-harness-env.json"
INSTALL_LOG = "spmd-harness-install.log"
# Measured: a venv with torch 2.9.0 (a CUDA build), torch_xla and the pinned jax is 7.7 GB;
# pip's download cache and unpacking need room on top while it installs.
ENV_GB = 7.0
HEADROOM_GB = 2.0
ENV_MINUTES = "2-5"  # 2 on an idle machine; 5.4 measured for 2.7.0 with the 2 cores busy
# Fallback when the repo's pyproject cannot be read: what the harness itself imports.
LIGHT_DEPS = ("pytest>=8.3", "pytest-xdist>=3.6", "hypothesis>=6.100", "packaging>=23", "PyYAML>=6")
VERSION_PACKAGES = ("torch", "torch_xla", "jax", "jaxlib")


def default_cache_root() -> Path:
    return Path.home() / ".cache" / "spmd-harness" / "envs"


def python_tag() -> str:
    # A venv is tied to the interpreter that made it, so the key names it.
    return f"py{sys.version_info.major}{sys.version_info.minor}"


@dataclasses.dataclass(frozen=True)
class EnvRequest:
    """What one environment must hold."""

    key: str  # folder name under the cache root, e.g. "torch_xla-2.7.0-py311" or "wheels-3f2a9c1b7d0e-py311"
    label: str  # the column it serves, for messages
    requirements: tuple[str, ...]  # pip requirement strings: torch, torch_xla[pallas], the harness's light deps
    torch_xla: str | None  # the version the built env must report (None: accept what the wheels hold)


def harness_deps(repo: Path) -> tuple[str, ...]:
    """The harness's own runtime dependencies, read from its pyproject so the two cannot drift."""
    try:
        with (repo / "pyproject.toml").open("rb") as fh:
            deps = tomllib.load(fh)["project"]["dependencies"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return LIGHT_DEPS
    return tuple(deps)


def release_request(release: str, repo: Path) -> EnvRequest:
    return EnvRequest(
        key=f"torch_xla-{release}-{python_tag()}",
        label=release,
        requirements=(f"torch=={release}", f"torch_xla[pallas]=={release}", *harness_deps(repo)),
        torch_xla=release,
    )


@dataclasses.dataclass(frozen=True)
class WheelFolder:
    path: Path
    torch_xla_version: str  # from the torch_xla wheel's filename: the column's name
    wheels: tuple[Path, ...]


def read_wheel_folder(folder: Path) -> WheelFolder:
    if not folder.is_dir():
        raise HarnessUsageError(
            f"--wheels {folder}: not a folder. Give the folder that holds the torch and torch_xla wheels."
        )
    wheels = tuple(sorted(folder.glob("*.whl")))
    xla = []
    for wheel in wheels:
        try:
            name, version, _build, _tags = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            raise HarnessUsageError(f"--wheels {folder}: {wheel.name} is not a valid wheel filename ({exc})") from None
        if name == canonicalize_name("torch_xla"):
            xla.append((wheel, str(version)))
    if len(xla) != 1:
        found = ", ".join(w.name for w in wheels) or "no .whl files"
        raise HarnessUsageError(
            f"--wheels {folder}: needs exactly one torch_xla wheel, found {len(xla)} ({found}). "
            f"Download the build's wheel artifact (torch and torch_xla) into its own folder."
        )
    return WheelFolder(path=folder, torch_xla_version=xla[0][1], wheels=wheels)


def wheels_request(folder: WheelFolder, repo: Path) -> EnvRequest:
    requirements = []
    for wheel in folder.wheels:
        name = parse_wheel_filename(wheel.name)[0]
        # The pallas extra is what pins jax; a bare path would install torch_xla without it.
        requirements.append(
            f"torch_xla[pallas] @ {wheel.resolve().as_uri()}" if name == "torch-xla" else str(wheel.resolve())
        )
    return EnvRequest(
        key=f"wheels-{_wheels_hash(folder.wheels)}-{python_tag()}",
        label=folder.torch_xla_version,
        requirements=(*requirements, *harness_deps(repo)),
        torch_xla=folder.torch_xla_version,
    )


def _wheels_hash(wheels: Sequence[Path]) -> str:
    # Content, not names: PR builds of different commits can carry identical filenames.
    digest = hashlib.sha256()
    for wheel in wheels:
        digest.update(wheel.name.encode() + b"\0")
        with wheel.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


class Installer(Protocol):
    """How an environment gets made. Each method raises EnvBuildError when its step fails."""

    def create_venv(self, path: Path, log: Path) -> None: ...

    def pip_install(self, python: Path, args: Sequence[str], log: Path) -> None: ...

    def installed_versions(self, python: Path) -> dict[str, str]: ...


class PipInstaller:
    """The real installer: `python -m venv`, then pip, with progress from pip's own log lines."""

    def __init__(self, say: Callable[[str], None], timeout_s: float = 3600.0) -> None:
        self.say = say
        self.timeout_s = timeout_s

    def create_venv(self, path: Path, log: Path) -> None:
        self._run([sys.executable, "-m", "venv", str(path)], log, "python -m venv")

    def pip_install(self, python: Path, args: Sequence[str], log: Path) -> None:
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *args]
        self._run(cmd, log, "pip install")

    def installed_versions(self, python: Path) -> dict[str, str]:
        return installed_versions(python)

    def _run(self, cmd: Sequence[str], log: Path, what: str) -> None:
        def heartbeat(elapsed: float) -> str | None:
            line = last_line_matching(
                log, ("Collecting", "Downloading", "Installing collected", "Building", "Processing")
            )
            return f"  {what}: {elapsed:.0f}s, {line or 'working'}"

        try:
            code = run_logged(cmd, log, timeout_s=self.timeout_s, heartbeat=heartbeat, say=self.say)
        except CommandTimedOut as exc:
            raise EnvBuildError(f"{what} timed out ({exc}); log: {log}") from None
        if code != 0:
            raise EnvBuildError(f"{what} exited {code}; log: {log}\n--- last lines ---\n{tail(log)}")


def installed_versions(python: Path) -> dict[str, str]:
    """Versions of torch/torch_xla/jax in an environment, read from metadata (no torch import: fast)."""
    code = (
        "import importlib.metadata as m, json\nout = {}\n"
        f"for name in {list(VERSION_PACKAGES)!r}:\n"
        "    try: out[name] = m.version(name)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise EnvBuildError(f"could not read package versions with {python}: {exc}. Is it a working venv?") from None


def check_disk(root: Path, envs_to_build: int, free_bytes: Callable[[Path], int] | None = None) -> None:
    """Raises NotEnoughDiskError before anything is downloaded if the builds cannot fit."""
    if envs_to_build == 0:
        return
    free_bytes = free_bytes or (lambda p: shutil.disk_usage(p).free)
    probe = root
    while not probe.exists() and probe != probe.parent:  # the cache folder may not exist yet
        probe = probe.parent
    free_gb = free_bytes(probe) / 1e9
    needed_gb = ENV_GB * envs_to_build + HEADROOM_GB
    if free_gb < needed_gb:
        raise NotEnoughDiskError(str(root), needed_gb, free_gb, envs_to_build)


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


class EnvCache:
    """Environments under one root folder, one per EnvRequest.key."""

    def __init__(self, root: Path, installer: Installer, repo: Path, say: Callable[[str], None]) -> None:
        self.root = root
        self.installer = installer
        self.repo = repo
        self.say = say

    def path_for(self, request: EnvRequest) -> Path:
        return self.root / request.key

    def is_complete(self, request: EnvRequest) -> bool:
        try:
            marker = json.loads((self.path_for(request) / MARKER).read_text())
        except (OSError, ValueError):
            return False
        # Same key but other requirements (the harness's deps changed): build again.
        return marker.get("requirements") == list(request.requirements)

    def built_seconds(self, request: EnvRequest) -> float | None:
        """How long the cached environment took to build (from its marker), or None."""
        try:
            return json.loads((self.path_for(request) / MARKER).read_text()).get("built_s")
        except (OSError, ValueError):
            return None

    def ensure(self, request: EnvRequest) -> Path:
        """The environment's folder, built first unless a complete one is cached."""
        env = self.path_for(request)
        if self.is_complete(request):
            self.say(f"{request.label}: reusing cached environment {env}")
            return env
        if env.exists():
            self.say(
                f"{request.label}: {env} has no completion marker (an earlier build stopped halfway); deleting and rebuilding"
            )
            shutil.rmtree(env)
        started = time.monotonic()
        env.parent.mkdir(parents=True, exist_ok=True)
        # Beside the env while it builds (a failed build's log survives the rebuild's rmtree), inside it once done.
        log = env.parent / f"{request.key}.{INSTALL_LOG}"
        log.unlink(missing_ok=True)
        self.say(f"{request.label}: building {env} (about {ENV_MINUTES} min, {ENV_GB:.0f} GB); pip log: {log}")
        self.installer.create_venv(env, log)
        self.say(f"{request.label}: [1/2] installing {', '.join(request.requirements[:2])} and the harness's deps")
        self.installer.pip_install(python_of(env), request.requirements, log)
        self.say(f"{request.label}: [2/2] installing the harness (editable, no deps) from {self.repo}")
        self.installer.pip_install(python_of(env), ["--no-deps", "-e", str(self.repo)], log)
        versions = self.installer.installed_versions(python_of(env))
        verify_versions(request.label, env, versions, request.torch_xla)
        freed = share_identical_files(env, [p for p in self.root.iterdir() if (p / MARKER).exists()])
        if freed:
            self.say(
                f"{request.label}: {freed / 1e9:.1f} GB of files identical to other cached environments now shared (hard links)"
            )
        marker = {
            "key": request.key,
            "requirements": list(request.requirements),
            "versions": versions,
            "built_s": round(time.monotonic() - started, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        tmp = env / (MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=2, sort_keys=True))
        tmp.replace(env / MARKER)  # atomic: a marker is either absent or complete
        if log.exists():
            log.replace(env / INSTALL_LOG)
        self.say(
            f"{request.label}: built in {time.monotonic() - started:.0f}s: "
            + ", ".join(f"{k} {v}" for k, v in versions.items())
        )
        return env


def verify_versions(label: str, env: Path, versions: dict[str, str], torch_xla: str | None) -> None:
    if "torch_xla" not in versions:
        raise EnvMismatchError(
            f"{label}: {env} has no torch_xla installed. Install torch_xla there or drop --env for it."
        )
    if torch_xla is not None and versions["torch_xla"] != torch_xla:
        raise EnvMismatchError(
            f"{label}: {env} has torch_xla {versions['torch_xla']}, not {torch_xla}. "
            f"Point --env {label}=... at a venv with torch_xla {torch_xla}."
        )
