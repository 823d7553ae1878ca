"""What a body can leave in its interpreter beyond harness.isolation.child.ProcessState's list.

A warm child runs the next case in the same process, so anything global a body changes is a
condition of the next case: an interval timer or a faulthandler timeout it armed kills the next
case (SIGALRM, "Timeout"); a trace function, a warnings filter, a recursion limit, torch's grad
mode or default dtype makes the next body raise or compute otherwise; a method it replaced on a
class (`torch.Tensor.sum`, `CaseContext.record_sharding`) or a module it replaced in sys.modules
answers for the next case. `Leftovers` is taken before a body and asked after it: what can be put
back is (timers, faulthandler, tracing, warnings, interpreter limits and hooks, torch's modes
and CPU RNG, Python's RNG), what cannot (a replaced method or module, stdio pointing elsewhere)
is named, and the child is not reused.
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import threading
import types
import warnings
from collections.abc import Iterable
from typing import Any

_TIMERS = ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")  # SIGALRM, SIGVTALRM, SIGPROF: each ends a process
# Interpreter settings a body can change with one call and the next case would run under.
_SYS_HOOKS = ("excepthook", "displayhook", "unraisablehook", "stdin", "stdout", "stderr")
_SYS_LIMITS: tuple[tuple[str, str], ...] = (
    ("getrecursionlimit", "setrecursionlimit"),
    ("getswitchinterval", "setswitchinterval"),
    ("get_int_max_str_digits", "set_int_max_str_digits"),  # 3.11+
)


class Leftovers:
    def __init__(self, watched: Iterable[types.ModuleType]) -> None:
        self.timers = {name: signal.getitimer(getattr(signal, name)) for name in _TIMERS}
        self.faulthandler = faulthandler.is_enabled()
        self.trace = (sys.gettrace(), sys.getprofile(), _threading_hooks())
        self.warnings = (list(warnings.filters), warnings.showwarning, warnings.formatwarning)
        self.hooks = {name: getattr(sys, name) for name in _SYS_HOOKS}
        self.thread_hook = threading.excepthook
        self.limits = {getter: getattr(sys, getter)() for getter, _ in _SYS_LIMITS if hasattr(sys, getter)}
        self.stdio = _stdio_files()
        self.descriptors = _open_descriptors() or 0
        self.torch = _torch_state()
        self.random = random.getstate()
        self.modules = dict(sys.modules)
        self.classes = _class_attributes(watched)

    def watch_classes(self, watched: Iterable[types.ModuleType]) -> None:
        self.classes = _class_attributes(watched)

    def restore(self, watched: Iterable[types.ModuleType]) -> list[str]:
        """Put back what can be put back; return what cannot (the child is then not reused)."""
        for name in _TIMERS:
            # Disarmed, not only reported: a SIGALRM or SIGPROF due later would kill the next case.
            if signal.getitimer(getattr(signal, name)) != self.timers[name]:
                signal.setitimer(getattr(signal, name), *self.timers[name])
        faulthandler.cancel_dump_traceback_later()  # the harness arms none: one armed is the body's
        if self.faulthandler and not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
        sys.settrace(self.trace[0])
        sys.setprofile(self.trace[1])
        _set_threading_hooks(self.trace[2])
        filters, show, form = self.warnings
        warnings.filters[:] = filters  # type: ignore[index]
        warnings.showwarning, warnings.formatwarning = show, form
        getattr(warnings, "_filters_mutated", lambda: None)()  # the C side caches the filters
        for name, value in self.hooks.items():
            setattr(sys, name, value)
        threading.excepthook = self.thread_hook
        for getter, setter in _SYS_LIMITS:
            if getter in self.limits and getattr(sys, getter)() != self.limits[getter]:
                getattr(sys, setter)(self.limits[getter])
        random.setstate(self.random)
        _restore_torch(self.torch)
        problems = []
        moved = [name for fd, name in enumerate(("stdin", "stdout", "stderr")) if _stdio_files()[fd] != self.stdio[fd]]
        if moved:
            problems.append(
                f"the body pointed {' and '.join(moved)} elsewhere (dup2?): the next case's log would be lost"
            )
        now = _open_descriptors()
        if now is None or now - self.descriptors > MAX_DESCRIPTORS_LEFT:
            left = "every free" if now is None else str(now - self.descriptors)
            problems.append(f"the body left {left} file descriptors open (the next case could open too few)")
        problems += _replaced_modules(self.modules)
        problems += _replaced_attributes(self.classes, _class_attributes(watched))
        return problems


# Descriptors a body may leave open (a runtime's first use opens a few, kept for the process's
# life); one that leaves more may have used up RLIMIT_NOFILE, and the next case would fail EMFILE.
MAX_DESCRIPTORS_LEFT = 256


def _open_descriptors() -> int | None:
    """How many descriptors are open; None when not even /proc/self/fd can be opened (none free)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _threading_hooks() -> tuple[Any, Any]:
    return getattr(threading, "_trace_hook", None), getattr(threading, "_profile_hook", None)


def _set_threading_hooks(hooks: tuple[Any, Any]) -> None:
    threading.settrace(hooks[0])
    threading.setprofile(hooks[1])


def _stdio_files() -> list[tuple[int, int] | None]:
    """Which file each of descriptors 0-2 is (device, inode); None: closed."""
    found: list[tuple[int, int] | None] = []
    for fd in (0, 1, 2):
        try:
            info = os.fstat(fd)
            found.append((info.st_dev, info.st_ino))
        except OSError:
            found.append(None)
    return found


def _torch_state() -> dict[str, Any] | None:
    """torch's process-wide modes a body can switch with one call, and its CPU RNG; None: torch not loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "is_grad_enabled"):
        return None
    return {
        "grad": torch.is_grad_enabled(),
        "dtype": torch.get_default_dtype(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "rng": torch.get_rng_state(),
    }


def _restore_torch(state: dict[str, Any] | None) -> None:
    torch = sys.modules.get("torch")
    if state is None or torch is None:
        return
    torch.set_grad_enabled(state["grad"])
    if torch.get_default_dtype() != state["dtype"]:
        torch.set_default_dtype(state["dtype"])
    if torch.are_deterministic_algorithms_enabled() != state["deterministic"]:
        torch.use_deterministic_algorithms(state["deterministic"])
    torch.set_rng_state(state["rng"])


def _replaced_modules(before: dict[str, Any]) -> list[str]:
    """Entries of sys.modules a body replaced, or filled with what is not a module: the next
    case's `import` would get the body's object. (A module object put under a name not imported
    yet is not told from what imports do themselves: torch registers C submodules without a
    spec, multiprocessing aliases __main__.)"""
    replaced = []
    for name, module in list(sys.modules.items()):
        old = before.get(name, None if isinstance(module, types.ModuleType) else name)
        if old is not None and old is not module:
            replaced.append(name)
    if not replaced:
        return []
    return [f"the body replaced modules in sys.modules: {', '.join(replaced[:5])}"]


def _class_attributes(modules: Iterable[types.ModuleType]) -> dict[type, dict[str, int]]:
    """Each class a watched module holds, with the identity of each attribute it defines."""
    found: dict[type, dict[str, int]] = {}
    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, type) and value not in found:
                found[value] = {name: id(attr) for name, attr in list(vars(value).items()) if _is_code(attr)}
    return found


# What a class attribute must be for replacing it to be a monkeypatch: code, not a cached value
# or a counter (those change by design).
_CODE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    classmethod,
    staticmethod,
    property,
    type,
)


def _is_code(value: Any) -> bool:
    return isinstance(value, _CODE)


def _replaced_attributes(before: dict[type, dict[str, int]], after: dict[type, dict[str, int]]) -> list[str]:
    """Attributes of those classes a body replaced or removed, or added over an inherited one
    (`torch.Tensor.sum = ...` shadows TensorBase.sum): attributes a class gains that shadow
    nothing (caches, lazily made helpers) are its own business."""
    changed = []
    for cls, names in before.items():
        now = after.get(cls, {})
        changed += [f"{cls.__qualname__}.{name}" for name, value in names.items() if now.get(name) != value]
        changed += [
            f"{cls.__qualname__}.{name}"
            for name in now.keys() - names.keys()
            if any(_is_code(vars(base).get(name)) for base in cls.__mro__[1:])
        ]
    if not changed:
        return []
    return [f"the body replaced methods of classes later cases use (monkeypatched?): {', '.join(changed[:5])}"]
