"""What the command line asked for, as a list of columns, each knowing where its results come from.

release  torch==X + torch_xla[pallas]==X in a cached env (or an existing venv given with --env)
wheels   the torch/torch_xla wheels in a folder (a PR build or a nightly), in a cached env
results  a results folder from an earlier run: read, not run
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.errors import HarnessUsageError
from harness.matrix.envs import read_wheel_folder
from harness.records import runfolder


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    name: str  # table header
    kind: str  # "release" | "env" | "wheels" | "results"
    declared: str | None  # torch_xla version the column is meant to measure
    path: Path | None = None  # existing venv (env), wheel folder (wheels), results folder (results)

    @property
    def folder(self) -> Path:
        """`path`, for the kinds that have one (all but "release")."""
        if self.path is None:
            raise ValueError(f"column {self.name!r} ({self.kind}) has no folder")
        return self.path


def parse_releases(text: str | None) -> list[str]:
    if not text:
        return []
    releases = [r.strip() for r in text.split(",") if r.strip()]
    for release in releases:
        try:
            Version(release)
        except InvalidVersion:
            raise HarnessUsageError(
                f"--releases: {release!r} is not a version; give torch_xla releases like 2.6.0,2.7.0,2.9.0"
            ) from None
    duplicates = sorted({r for r in releases if releases.count(r) > 1})
    if duplicates:
        raise HarnessUsageError(f"--releases names {', '.join(duplicates)} twice")
    return releases


def parse_assignments(option: str, values: Sequence[str]) -> dict[str, Path]:
    """`NAME=PATH` pairs, e.g. --env 2.9.0=/work/venvs/v29."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise HarnessUsageError(f"{option} {value!r}: expected NAME=PATH, e.g. {option} 2.9.0=/path/to/venv")
        if name in out:
            raise HarnessUsageError(f"{option} names {name} twice")
        out[name] = Path(path).expanduser().absolute()  # the suite runs from the repo root, not from here
    return out


def is_results_dir(path: Path) -> bool:
    """A results folder (its latest run), one run's folder, or a folder of verdicts files."""
    return path.is_dir() and runfolder.resolve(path) is not None


def is_wheel_dir(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.whl"))


def build_columns(
    releases: Sequence[str], envs: dict[str, Path], wheels: Sequence[Path], results: dict[str, Path]
) -> list[ColumnSpec]:
    unknown = sorted(set(envs) - set(releases))
    if unknown:
        raise HarnessUsageError(
            f"--env names {', '.join(unknown)}, which --releases does not list "
            f"({', '.join(releases) or 'none'}); --env replaces the build of a listed release"
        )
    columns = []
    for release in releases:
        if release in envs:
            venv = envs[release]
            if not (venv / "bin" / "python").exists():
                raise HarnessUsageError(f"--env {release}={venv}: no {venv / 'bin' / 'python'}; give the venv's folder")
            columns.append(ColumnSpec(release, "env", release, venv))
        else:
            columns.append(ColumnSpec(release, "release", release))
    for folder in wheels:
        found = read_wheel_folder(folder)
        columns.append(ColumnSpec(found.torch_xla_version, "wheels", found.torch_xla_version, folder))
    for name, folder in results.items():
        columns.append(results_column(name, folder, "--results"))
    names = [c.name for c in columns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise HarnessUsageError(
            f"two columns are both named {', '.join(duplicates)} (a release and a wheel folder "
            f"of the same torch_xla?); keep one"
        )
    if not columns:
        raise HarnessUsageError("nothing to measure: give --releases, --wheels DIR or --results NAME=DIR")
    return columns


def results_column(name: str, folder: Path, option: str) -> ColumnSpec:
    if is_results_dir(folder):
        return ColumnSpec(name, "results", None, folder)
    nested = sorted(p.name for p in folder.glob("*/") if is_results_dir(p)) if folder.is_dir() else []
    hint = f"; it has results folders {', '.join(nested)} inside: pass one of those" if nested else ""
    raise HarnessUsageError(f"{option} {folder}: no {runfolder.VERDICTS_GLOB} there{hint}")


def dir_column(name: str, folder: Path, option: str) -> ColumnSpec:
    """For compare: a wheel folder (measured) or a results folder (read)."""
    if is_wheel_dir(folder):
        found = read_wheel_folder(folder)
        return ColumnSpec(found.torch_xla_version, "wheels", found.torch_xla_version, folder)
    if is_results_dir(folder):
        return ColumnSpec(name, "results", None, folder)
    return results_column(name, folder, option)  # raises with the most helpful message
