"""The host's peak memory over a phase of a case body (a transfer, a restore). Child side only.

The kernel keeps the resident set's high-water mark (`VmHWM` in /proc/self/status); writing 5 to
/proc/self/clear_refs resets it to the current resident set (Linux 4.0+). A phase's peak is the
mark after it less the resident set before it, freed memory given back to the kernel first
(glibc's `malloc_trim`), so what an earlier phase freed and malloc kept does not absorb it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator


class PeakUnreadable(RuntimeError):
    """The kernel gives no resettable high-water mark here (no /proc, or clear_refs refused)."""


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise PeakUnreadable(f"/proc/self/status has no {field}")


def _give_back_freed_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # another libc: the peak may read low by what malloc kept


def host_tensor_bytes() -> int:
    """Bytes of the CPU tensors alive (each storage once), garbage collected first. Counted from
    the objects rather than the resident set, which a harness child's allocator keeps freed memory
    in (a 64 MiB restore left 0-64 MiB more resident there, 0 in a plain process)."""
    import torch

    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@contextlib.contextmanager
def peak_over(figures: dict[str, int], name: str, kept: dict[str, int] | None = None) -> Iterator[None]:
    """figures[name] = the bytes the resident set rose to, above where it started, in the block;
    kept[name] = the bytes of CPU tensors alive after the block beyond those alive before it."""
    tensors_before = host_tensor_bytes() if kept is not None else 0
    _give_back_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError as exc:
        raise PeakUnreadable(f"cannot reset the high-water mark (/proc/self/clear_refs: {exc})") from exc
    start = _status_kib("VmRSS")
    if _status_kib("VmHWM") > start + 1024:
        raise PeakUnreadable("writing 5 to /proc/self/clear_refs did not reset VmHWM (kernel before 4.0?)")
    yield
    figures[name] = (_status_kib("VmHWM") - start) * 1024
    if kept is not None:
        kept[name] = host_tensor_bytes() - tensors_before
