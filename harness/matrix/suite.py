"""Run the SPMD suite inside one environment and collect what it recorded.

The suite is the project's own `pytest -m spmd`, run by the environment's interpreter from the
repo root, so the cases and the registry are the checked-out ones whatever torch_xla is installed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from harness.matrix.errors import CommandTimedOut, SuiteRunError
from harness.matrix.procs import run_logged
from harness.records import runfolder
from harness.records.results import CaseRecord, read_records, suite_exit_problem

SUITE_LOG = "pytest.log"
# Only the case folder: an env built for the matrix has the harness's light deps, not the `test`
# extra that some self-tests under tests/ import, and the SPMD cases all live in cases/.
SUITE_PATHS = ("cases",)


@dataclasses.dataclass
class SuiteRun:
    """One column's measurement: the records plus how the run went."""

    results_dir: Path
    records: list[CaseRecord]
    exit_code: int | None = None  # None when the records were read from an earlier run
    log: Path | None = None
    duration_s: float | None = None
    # "verdicts-gw1.jsonl:7" (relative to results_dir) for each line that is not a case record.
    unreadable: list[str] = dataclasses.field(default_factory=list)

    @property
    def problem(self) -> str | None:
        """Why this column cannot be trusted as a whole, or None."""
        problem = suite_exit_problem(self.exit_code) if self.exit_code is not None else None
        if problem:
            return f"{problem}; see {self.log}"
        if self.unreadable:
            return f"{len(self.unreadable)} damaged record line(s): {self.damaged_lines()}"
        if not self.records:
            return f"no case records in {self.results_dir}" + (f"; see {self.log}" if self.log else "")
        return None

    def damaged_lines(self, limit: int = 5) -> str:
        shown = ", ".join(str(self.results_dir / line) for line in self.unreadable[:limit])
        return shown + (f" and {len(self.unreadable) - limit} more" if len(self.unreadable) > limit else "")


class SuiteRunner(Protocol):
    def run(self, python: Path, results_dir: Path, label: str) -> SuiteRun: ...


def read_run(results_dir: Path) -> SuiteRun:
    """A results folder read as untrusted input: damaged lines are counted, never raised."""
    unreadable: list[str] = []
    records = list(read_records(results_dir, unreadable))
    return SuiteRun(results_dir=results_dir, records=records, unreadable=unreadable)


class PytestSuite:
    """`<env>/bin/python -m pytest -m spmd cases --spmd-results-dir DIR -p no:cacheprovider` from the repo root."""

    def __init__(
        self,
        repo: Path,
        say: Callable[[str], None],
        *,
        jobs: int = 1,
        extra_args: Sequence[str] = (),
        timeout_s: float = 3600.0,
    ) -> None:
        self.repo, self.say, self.jobs, self.extra_args, self.timeout_s = repo, say, jobs, tuple(extra_args), timeout_s

    def command(self, python: Path, results_dir: Path) -> list[str]:
        # -c and --rootdir pin the repo's pytest config: otherwise pytest takes the --spmd-results-dir value
        # (a path outside the repo) as a rootdir candidate, finds no pyproject.toml there and silently
        # runs without the repo's markers, xfail_strict and filterwarnings.
        cmd = [
            str(python),
            "-m",
            "pytest",
            "-c",
            str(self.repo / "pyproject.toml"),
            "--rootdir",
            str(self.repo),
            "-m",
            "spmd",
            *SUITE_PATHS,
            "--spmd-results-dir",
            str(results_dir),
            "-p",
            "no:cacheprovider",
        ]
        if self.jobs > 1:
            cmd += ["-n", str(self.jobs)]
        return cmd + list(self.extra_args)

    def run(self, python: Path, results_dir: Path, label: str) -> SuiteRun:
        results_dir.mkdir(parents=True, exist_ok=True)
        log = results_dir / SUITE_LOG
        log.unlink(missing_ok=True)
        env = _isolated_environ(python)
        started = time.monotonic()

        def heartbeat(elapsed: float) -> str:
            return f"  {label}: pytest {elapsed:.0f}s, {_count_records(results_dir)} case(s) recorded"

        self.say(f"{label}: running the suite with {python}; log: {log}")
        try:
            code = run_logged(
                self.command(python, results_dir),
                log,
                cwd=self.repo,
                env=env,
                timeout_s=self.timeout_s,
                heartbeat=heartbeat,
                every_s=30.0,
                say=self.say,
            )
        except CommandTimedOut as exc:
            raise SuiteRunError(
                f"{label}: the suite ran past {self.timeout_s:.0f}s and was stopped ({exc}); "
                f"log: {log}. Raise --suite-timeout or narrow the run with -- -k EXPR."
            ) from None
        except OSError as exc:
            raise SuiteRunError(f"{label}: could not start {python}: {exc}") from None
        run = read_run(results_dir)
        run.exit_code, run.log, run.duration_s = code, log, round(time.monotonic() - started, 1)
        self.say(
            f"{label}: suite finished in {run.duration_s:.0f}s, pytest exit {code}, {len(run.records)} case record(s)"
        )
        return run


def _isolated_environ(python: Path) -> dict[str, str]:
    # The calling shell's venv or PYTHONPATH must not leak another torch_xla into the run.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _count_records(results_dir: Path) -> int:
    count = 0
    for path in (runfolder.resolve(results_dir) or results_dir).glob(runfolder.VERDICTS_GLOB):
        try:
            count += sum(1 for line in path.open(encoding="utf-8") if line.strip())
        except OSError:
            pass
    return count
