"""Typed errors of the release matrix. Each message says what broke and what to do next.

The CLI maps them to exit codes: usage errors (harness.errors.HarnessUsageError) to 2, everything that stopped an environment from
being built or a suite from running to 3 (1 is reserved for "ran, and disagrees").
"""

from __future__ import annotations

from harness.errors import HarnessError


class MatrixError(HarnessError):
    """Something stopped the matrix from being measured (not a disagreement: those are results)."""


class NotEnoughDiskError(MatrixError):
    """Building the requested environments would not fit on the cache's disk."""

    def __init__(self, path: str, needed_gb: float, free_gb: float, envs: int) -> None:
        super().__init__(
            f"building {envs} environment(s) needs about {needed_gb:.1f} GB under {path}, "
            f"but only {free_gb:.1f} GB is free. Free some space, point --cache at a bigger disk, "
            f"or reuse an existing venv with --env RELEASE=PATH."
        )
        self.path, self.needed_gb, self.free_gb, self.envs = path, needed_gb, free_gb, envs


class EnvBuildError(MatrixError):
    """An install step failed; the half-built environment is left unmarked so the next run rebuilds it."""


class EnvMismatchError(MatrixError):
    """An environment holds a different torch_xla than the column it is meant to measure."""


class SuiteRunError(MatrixError):
    """pytest could not be run to completion in an environment (timed out, or could not start)."""


class CommandTimedOut(MatrixError):
    """A long command (pip, pytest) ran past its timeout; its whole process group was terminated.

    harness.matrix.procs raises it; the install and the suite runner turn it into an
    EnvBuildError or a SuiteRunError that names the log.
    """
