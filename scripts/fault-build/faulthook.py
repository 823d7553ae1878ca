"""A torch_xla build with one of the job's faults in it, for every process of a run.

scripts/run-with-fault.sh puts this folder on PYTHONPATH with a sitecustomize.py of its own that
calls install(FAULT) (a name of cases/faults.FAULTS): the harness hands PYTHONPATH to every child
and fork server, no other variable of the caller's. So at every Python start this hook waits for
torch_xla to be imported (the pytest process never imports it; a fork server or a fresh child
does) and then puts the fault back (cases.faults.when_imported, the one import hook the faults
use), exactly as cases/faults.py does in the job's self-tests: the regular cases of the PR tier
then run on the faulted build, as they would on a regressed wheel.
"""

from __future__ import annotations

import sys
from typing import Any


def install(fault: str) -> None:
    from cases import faults  # stdlib imports only: nothing of torch before the run asks for it

    def put_back(module: Any) -> None:
        faults.reintroduce(fault)
        print(f"[fault-build] torch_xla carries the fault {fault!r}", file=sys.stderr, flush=True)

    faults.when_imported("torch_xla", put_back)
