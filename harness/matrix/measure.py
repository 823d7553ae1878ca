"""Turn column specs into measured columns: say what will happen, check the disk, build or reuse
each environment, then run the suite in each, one after another (the machine's cores are shared,
and each run already uses a warm child process per case)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.matrix import envs
from harness.matrix.columns import ColumnSpec
from harness.matrix.envs import EnvCache, EnvRequest
from harness.matrix.suite import SuiteRunner, read_run
from harness.matrix.table import ColumnResult
from harness.records.results import safe_filename


@dataclasses.dataclass(frozen=True)
class PlannedColumn:
    spec: ColumnSpec
    request: EnvRequest | None  # None: an existing venv (--env) or results read back
    cached: bool


def plan(specs: Sequence[ColumnSpec], cache: EnvCache, repo: Path) -> list[PlannedColumn]:
    steps = []
    for spec in specs:
        request = None
        if spec.kind == "release":
            request = envs.release_request(spec.name, repo)
        elif spec.kind == "wheels":
            request = envs.wheels_request(envs.read_wheel_folder(spec.folder), repo)
        steps.append(PlannedColumn(spec, request, request is not None and cache.is_complete(request)))
    return steps


def describe(steps: Sequence[PlannedColumn], cache: EnvCache) -> list[str]:
    to_build = [s for s in steps if s.request and not s.cached]
    runs = [s for s in steps if s.spec.kind != "results"]
    lines = [f"plan: {len(steps)} column(s): {', '.join(s.spec.name for s in steps)}"]
    if to_build:
        lines.append(
            f"  build {len(to_build)} environment(s) under {cache.root} "
            f"({', '.join(s.spec.name for s in to_build)}): about {envs.ENV_MINUTES} min and "
            f"{envs.ENV_GB:.0f} GB each, {envs.ENV_GB * len(to_build):.0f} GB in all"
        )
    for step in steps:
        if step.cached and step.request is not None:  # cached: built for its request
            lines.append(f"  reuse cached environment for {step.spec.name}: {cache.path_for(step.request)}")
        elif step.spec.kind == "env":
            lines.append(f"  use existing venv for {step.spec.name}: {step.spec.path}")
        elif step.spec.kind == "results":
            lines.append(f"  read earlier results for {step.spec.name}: {step.spec.path}")
    if runs:
        lines.append(
            f"  then run `pytest -m spmd` {len(runs)} time(s), one after another: about 1-3 min each on 2 cores"
        )
    return lines


def measure(
    steps: Sequence[PlannedColumn], cache: EnvCache, suite: SuiteRunner, out: Path, say: Callable[[str], None]
) -> list[ColumnResult]:
    # Build every environment first: a failed install then stops the command before any long suite run.
    pythons: dict[str, Path] = {}
    for step in steps:
        if step.request is not None:
            pythons[step.spec.name] = envs.python_of(cache.ensure(step.request))
        elif step.spec.kind == "env":
            pythons[step.spec.name] = envs.python_of(step.spec.folder)
    columns = []
    for index, step in enumerate(steps, 1):
        spec = step.spec
        if spec.kind == "results":
            columns.append(read_column(spec))
            continue
        python = pythons[spec.name]
        versions = cache.installer.installed_versions(python)
        envs.verify_versions(spec.name, python.parent.parent, versions, spec.declared)
        say(
            f"[{index}/{len(steps)}] {spec.name}: torch_xla {versions.get('torch_xla')}, torch {versions.get('torch')}, "
            f"jax {versions.get('jax', '-')}"
        )
        run = suite.run(python, out / safe_filename(spec.name), spec.name)
        column = ColumnResult(
            spec.name, spec.kind, run, spec.declared, versions, str(python.parent.parent), _env_note(step, cache)
        )
        _write_meta(column)
        columns.append(column)
    return columns


def _env_note(step: PlannedColumn, cache: EnvCache) -> str:
    if step.request is None:
        return "existing venv"
    seconds = cache.built_seconds(step.request)
    built = f"built in {seconds:.0f} s" if seconds is not None else "built"
    return f"cached ({built})" if step.cached else built


# Beside the verdicts, so a later `--results NAME=DIR` or `compare` can show what the run was.
COLUMN_META = "matrix-column.json"


def _write_meta(column: ColumnResult) -> None:
    run = column.run
    meta = {
        "name": column.name,
        "kind": column.kind,
        "declared": column.declared,
        "versions": column.versions,
        "env": column.env,
        "env_note": column.env_note,
        "pytest_exit": run.exit_code,
        "duration_s": run.duration_s,
        "log": str(run.log) if run.log else None,
    }
    (run.results_dir / COLUMN_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_column(spec: ColumnSpec) -> ColumnResult:
    run = read_run(spec.folder)
    try:
        meta = json.loads((spec.folder / COLUMN_META).read_text())
    except (OSError, ValueError):
        meta = {}
    run.exit_code = meta.get("pytest_exit")
    run.duration_s = meta.get("duration_s")
    run.log = Path(meta["log"]) if meta.get("log") else None
    return ColumnResult(
        spec.name,
        "results",
        run,
        spec.declared or meta.get("declared"),
        meta.get("versions", {}),
        meta.get("env"),
        meta.get("env_note", ""),
    )
