"""A torch_xla build with one of the job's faults in it, for every process of a run.

scripts/run-with-fault.sh puts this folder on PYTHONPATH with a sitecustomize.py of its own that
calls install(FAULT) (a name of cases/faults.FAULTS): the harness hands PYTHONPATH to every child
and fork server, no other variable of the caller's. So at every Python start this hook waits for
torch_xla to be imported (the pytest process never imports it; a fork server or a fresh child
does) and then puts the fault back, exactly as cases/faults.py does in the job's self-tests: the
regular cases of the PR tier then run on the faulted build, as they would on a regressed wheel.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


class _FaultAfterTorchXla(importlib.abc.MetaPathFinder):
    def __init__(self, fault: str) -> None:
        self.fault = fault

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch_xla":
            return None
        sys.meta_path.remove(self)  # find the real torch_xla, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, exec_module = spec.loader, spec.loader.exec_module

        def exec_then_fault(module: Any) -> None:
            exec_module(module)
            from cases import faults

            faults.reintroduce(self.fault)
            print(f"[fault-build] torch_xla carries the fault {self.fault!r}", file=sys.stderr, flush=True)

        loader.exec_module = exec_then_fault  # type: ignore[method-assign]
        return spec


def install(fault: str) -> None:
    sys.meta_path.insert(0, _FaultAfterTorchXla(fault))
