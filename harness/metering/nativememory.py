"""What the process holds outside Python's collector: the native heap and the resident set.

torch_xla's reported leaks are C++ allocations never freed; host objects the collector does not
track (bytes, ints, floats, numpy arrays) kept by a container made before the meter are invisible
to gc.get_objects(). Both show here, read after each metered step (harness.stepcosts):

* `heap_bytes`: glibc's `mallinfo2()`, bytes in use in malloc's arenas plus its mmapped chunks
  (`uordblks + hblkhd`): what C++ (torch_xla, XLA, numpy's data, Python's large objects) holds;
* `rss_bytes`: the resident set, `/proc/self/statm`'s second field times the page size: also
  Python's own arenas (small objects are not malloc'd one by one) and freed memory malloc kept.

Cost: two cheap calls (~10 us). Where glibc has no mallinfo2 (before 2.33, or another libc) the
heap is not read; where /proc is absent, neither is the resident set: the figure is left out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@cache
def _mallinfo2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


def heap_bytes() -> int | None:
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return int(info.uordblks + info.hblkhd)


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def now() -> dict[str, int]:
    """{'heap_bytes': ..., 'rss_bytes': ...}, each where it can be read."""
    figures = {"heap_bytes": heap_bytes(), "rss_bytes": rss_bytes()}
    return {name: value for name, value in figures.items() if value is not None}
