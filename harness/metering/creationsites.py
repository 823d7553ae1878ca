"""Where the XLA tensors a step keeps were made: recorded only once a meter suspects a leak.

A creation traceback for every tensor would slow every healthy loop. So a StepMeter (harness.
stepcosts) turns this on for the steps after one that kept more XLA tensors than the step before:
while it is on, every torch function whose result is an XLA tensor notes the line of the code that
called it (the first frame outside torch, torch_xla and the harness), keyed by the tensor's id and
checked by weak reference, so a reused id never names another tensor. Used inside children only.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from typing import Any

# Frames in these packages are not the line that made a tensor: the caller's is.
_SKIPPED = ("torch", "torch_xla", "harness", "contextlib")


def _skipped_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _SKIPPED:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where:
            dirs.append(os.path.dirname(where) if where.endswith("__init__.py") else where)
    return tuple(dirs)


def dynamo_in_use() -> bool:
    """Dynamo has traced a frame in this process: a TorchFunctionMode entered now would fail its
    guards and make it trace again (torch_xla's bridge then clears the counters the meter reads),
    so no creation site is recorded: the tracing would change what it explains."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo, "counters", None)
    return bool(counters is not None and counters["frames"].get("total"))


def recorder() -> Any:
    """A TorchFunctionMode that records creation sites; enter it around a step's body."""
    return _recorder_class()()


@functools.cache
def _recorder_class() -> Any:
    """The mode's class, made once per process: a class made per traced step (its functions, cells,
    tuples) would be what the loop keeps, as read by the meter, growing on each traced step."""
    import torch
    from torch.overrides import TorchFunctionMode

    skipped = _skipped_dirs()

    class CreationSites(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.sites: dict[int, tuple[weakref.ReferenceType[Any], str]] = {}

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            result = func(*args, **(kwargs or {}))
            if type(result) is torch.Tensor and result.device.type == "xla":
                frame: types.FrameType | None = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename.startswith(skipped):
                    frame = frame.f_back
                if frame is not None:
                    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
                    self.sites[id(result)] = (weakref.ref(result), where)
            return result

        def site_of(self, tensor: Any) -> str | None:
            found = self.sites.get(id(tensor))
            return found[1] if found is not None and found[0]() is tensor else None

    return CreationSites
