"""Which part a pytest process plays in a run, decided once (HarnessSession.role).

- SINGLE: a run without pytest-xdist; it runs the cases and owns the run folder.
- CONTROLLER: the process that starts xdist workers; it runs no case, and owns the run folder,
  the terminal's end-of-run sections and the records of a worker that died.
- WORKER: an xdist worker; it runs cases and writes their records, and hands its findings to the
  controller on the test reports (as pytest's own reports travel).

The controller's hooks live in harness.run.controller, a plugin registered only where the role
owns the run (SINGLE or CONTROLLER), as pytest-xdist's own controller plugin is.
"""

from __future__ import annotations

import enum
import os
import sys
from typing import Any

from harness.config import options

MAIN = "main"  # the name the owning process's logs and records go under (a worker's: gw0, gw1, ...)


class Role(enum.Enum):
    SINGLE = "single"
    CONTROLLER = "controller"
    WORKER = "worker"

    @property
    def owns_run(self) -> bool:
        """The process that makes and closes the run folder and prints the end of the run."""
        return self is not Role.WORKER

    @property
    def runs_cases(self) -> bool:
        return self is not Role.CONTROLLER


def role_of(config: Any) -> Role:
    """From config.workerinput (set by xdist in each worker) and the options that distribute.
    Not $PYTEST_XDIST_WORKER: a pytest started from inside a worker (pytester, a subprocess)
    inherits that variable without being a worker."""
    if getattr(config, "workerinput", None) is not None:
        return Role.WORKER
    if options.xdist_distributes(config.option):
        return Role.CONTROLLER
    return Role.SINGLE


def process_name(config: Any) -> str:
    """xdist's own worker id (gw0, ...), else MAIN."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput is not None else MAIN


def looks_like_worker_early() -> bool:
    """Before config.workerinput exists (it is set after the early hooks), a worker shows as an
    execnet process (`python -c ...`) with xdist's variable set. The variable alone is not enough
    (see role_of). A wrong guess costs the early start of fork servers only."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and sys.argv[:1] == ["-c"]
