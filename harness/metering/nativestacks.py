"""Where the native memory a step kept was allocated: named only once a loop grows natively.

harness.metering.nativememory sees the process's heap grow step after step, not who allocates. memray
(https://bloomberg.github.io/memray/; pytest-memray's `limit_leaks` reads the same records)
records every allocation with its native and Python stack, at a cost no healthy loop should pay.
So a StepMeter (harness.stepcosts) tracks one step, only after a step past the warm-up grew the
heap or the resident set beyond costs.NATIVE_GROWTH_PER_STEP: memray's Tracker (native traces,
aggregated capture) runs from that step's start to its end (after the device work and a
collection), and the allocations it made that were still alive then are read by stack, the
largest first:

    native allocations of step3 alive at its end (memray): 512 KiB in 1 block at default_malloc
    < PyDataMem_UserNEW < PyArray_NewFromDescr_int < ... < full (numeric.py:385) < body_loop
    (test_loop.py:75); ... (these 578.6 KiB of the 738.3 KiB memray saw step3 keep; the step grew
    native heap (malloc in use) +523.2 KiB)

The capture goes in a scratch folder of its own (under the run's dump root, as XLA's dumps) and is
read by a separate process (`python -m harness.metering.nativestacks CAPTURE OUT`): the symbol tables memray
loads for a native stack (torch_xla's _XLAC.so is large) then never join the heap the meter
reads, and a reading that takes too long is ended (READ_TIMEOUT_S). The folder is removed after.

Where memray is not installed, or cannot track (another tracker active), the line says so in a
few words: the case is judged as before. What memray does not see: memory allocated through a
function pointer it did not hook (ctypes' `CDLL(None).malloc`: the line's share then says so) and
memory allocated before the tracked step (a block realloc'd bigger shows with the stack that grew it).
A raw mmap (Python's own 1 MiB arenas, a mapped file) is outside malloc's heap, the figure whose
growth is judged: it is summed apart at the line's end, never named as a stack nor counted in the share.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any

from harness.costs.steady import STACK_TRACKER_TAKEN, STACK_WINDOW_FIRST, STACK_WINDOW_STEPS
from harness.isolation.parent.evidence import terminal_safe
from harness.isolation.system import processes
from harness.isolation.wire.protocol import XLA_DUMP_ROOT_ENV

HARNESS_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding harness/
CAPTURE_NAME = "step.memray"
STACKS_NAME = "stacks.json"
# Reading resolves native symbols, of torch_xla's ~1 GB _XLAC.so among others: bounded.
READ_TIMEOUT_S = 60.0
# memray allows one tracker per process: the harness's own trackers (a loop's window, a one-step
# trace) that are active, so that another loop of the same body is told why it is not tracked
# (ANOTHER_LOOP, which the parent accepts) and a tracker the body started itself is not.
_ACTIVE: weakref.WeakSet[Any] = weakref.WeakSet()
ANOTHER_LOOP = STACK_TRACKER_TAKEN
TOP_STACKS = 3  # stacks named on the line, the largest first
RESOLVED_RECORDS = 12  # records whose stacks are resolved (the largest): the rest are only summed
FRAMES_SHOWN = 4
FRAME_CHARS = 70

# Frames that allocate rather than say who asked: the allocator, memray, the C++ runtime's new.
_ALLOCATOR_FRAME = re.compile(
    r"^(malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|mmap|mmap64|"
    r"operator new.*|__libc_.*|_int_malloc|memray::.*|.*::allocate|.*::_M_create.*|.*::reserve)$"
)
# The interpreter's own frames between Python code and the C that allocated (calls, object
# creation): what names the caller is the Python frame above them.
_INTERPRETER_FILE = re.compile(
    r"(^|/)(python3(\.\d+)?|libpython[\d.]*\.so[\d.]*)$|(^|/)(Python|Objects|Modules|Include)/"
)
# An installed package's Python (numpy's `full`): named, with the first line outside it.
_INSTALLED = re.compile(r"/(site|dist)-packages/")
# The meter's Python: an allocation made while it runs is its own, not the loop's.
_METER = re.compile(r"(^|/)harness/(stepcosts|nativestacks|nativememory)\.py$")
# Python frames that are the harness's meter or memray, not the loop.
_OWN_PYTHON = re.compile(r"(^|/)(harness|memray)/.*\.py$|(^|/)contextlib\.py$")


class StepTrace:
    """memray's tracker around one step. `start()` returns a reason where it cannot track."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.folder: str | None = None
        self.tracker: Any = None
        # The Python objects memray's import and tracker made: not the loop's (the meter leaves them
        # out of what a step keeps), held so that no id of theirs names a later object.
        self.made: list[Any] = []
        self.capture: bytes | None = None  # what read() kept of the capture (at most MAX_CAPTURE_BYTES)

    def start(self) -> str | None:
        existing = {id(obj) for obj in gc.get_objects()}
        try:
            return self._start()
        finally:
            self.made = [obj for obj in gc.get_objects() if id(obj) not in existing]

    def _start(self) -> str | None:
        try:
            import memray
        except ImportError:
            return "memray is not installed here (pip install memray)"
        if _another_loop_tracked():
            return ANOTHER_LOOP
        try:
            self.folder = tempfile.mkdtemp(prefix="spmd-memray-", dir=_scratch_root())
            self.tracker = memray.Tracker(
                os.path.join(self.folder, CAPTURE_NAME),
                native_traces=True,
                file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS,
            )
            self.tracker.__enter__()
        except Exception as exc:  # noqa: BLE001 - another tracker active, no room: the line says which
            self.tracker = None
            self.close()
            return f"memray could not track ({_short(exc)})"
        _ACTIVE.add(self)
        return None

    def close_after_error(self) -> None:
        """The step raised: stop tracking, remove the capture, name nothing."""
        try:
            self.stop()
        finally:
            self.close()

    def stop(self) -> None:
        """End tracking (idempotent); garbage the step made is collected first, so it is not kept."""
        if self.tracker is not None:
            gc.collect()
            tracker, self.tracker = self.tracker, None
            tracker.__exit__(None, None, None)

    def read(self, grown: str, grown_bytes: int = 0) -> str:
        """The line naming the largest stacks of what the step allocated and kept, led by how much of
        the step's growth (`grown_bytes` of the heap; `grown` says it: "native heap +265 KiB") memray
        saw. Removes the capture."""
        self.stop()
        try:
            if self.folder is None:
                return "native stacks not named (memray wrote no capture)"
            found = _read_in_child(self.folder)
            self.capture = _kept_capture(os.path.join(self.folder, CAPTURE_NAME))
        finally:
            self.close()
        if isinstance(found, str):
            return f"native stacks not named: {found}"
        return _line(self.step, found, grown, grown_bytes)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


# The nightly tier's stack judge (docs/costs.md#native-leaks-by-stack): a loop that reaches step
# WINDOW_FIRST (only the nightly tier's 20-step loops do) runs WINDOW_STEPS steps under memray's
# tracker, every allocation recorded; a stack that holds more blocks after each of them, by
# STACK_LEAK_PER_STEP or more a step, leaks.
WINDOW_FIRST = STACK_WINDOW_FIRST
WINDOW_STEPS = STACK_WINDOW_STEPS
STACK_LEAK_PER_STEP = 4 << 10
WINDOW_CAPTURE = "window.memray"
# memray snapshots the process every SNAPSHOT_MS; a step boundary waits BOUNDARY_WAIT_S after it
# notes the time, so a snapshot falls between the step's last allocation and the next step's first.
SNAPSHOT_MS = 5
BOUNDARY_WAIT_S = 0.02
WINDOW_READ_TIMEOUT_S = 120.0


def _another_loop_tracked() -> bool:
    return any(trace.tracker is not None for trace in list(_ACTIVE))


class WindowTrace:
    """memray's tracker over consecutive steps, all allocations recorded, with the time each ended."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.folder: str | None = None
        self.tracker: Any = None
        self.bounds: list[float] = []
        self.made: list[Any] = []  # the Python objects memray's import and tracker made: not the loop's

    def start(self) -> str | None:
        existing = {id(obj) for obj in gc.get_objects()}
        try:
            import memray
        except ImportError:
            return "memray is not installed here (pip install memray)"
        if _another_loop_tracked():
            return ANOTHER_LOOP
        try:
            self.folder = tempfile.mkdtemp(prefix="spmd-memray-window-", dir=_scratch_root())
            self.tracker = memray.Tracker(
                os.path.join(self.folder, WINDOW_CAPTURE), native_traces=True, memory_interval_ms=SNAPSHOT_MS
            )
            self.tracker.__enter__()
            _ACTIVE.add(self)  # in the block whose new objects are memray's (made): not the loop's
        except Exception as exc:  # noqa: BLE001 - another tracker active, no room: the line says which
            self.tracker = None
            self.close()
            return f"memray could not track ({_short(exc)})"
        finally:
            self.made = [obj for obj in gc.get_objects() if id(obj) not in existing]
        self.mark()
        return None

    def mark(self) -> None:
        """A step boundary: the time, then a wait for memray's next snapshot."""
        gc.collect()
        self.bounds.append(time.time())
        time.sleep(BOUNDARY_WAIT_S)

    def stop(self) -> None:
        if self.tracker is not None:
            tracker, self.tracker = self.tracker, None
            tracker.__exit__(None, None, None)

    def read(self) -> list[str]:
        """One line per stack that held more blocks after each tracked step ([] where none did),
        or a line saying why nothing could be read. Removes the capture."""
        self.stop()
        try:
            if self.folder is None:
                return ["native stacks not judged (memray wrote no capture)"]
            with open(os.path.join(self.folder, "bounds.json"), "w", encoding="utf-8") as fh:
                json.dump(self.bounds, fh)
            found = _read_in_child(self.folder, WINDOW_CAPTURE, "--window", WINDOW_READ_TIMEOUT_S)
        finally:
            self.close()
        if isinstance(found, str):
            return [f"native stacks not judged: {found}"]
        return window_lines(self.first, len(self.bounds) - 1, found)

    def close(self) -> None:
        self.stop()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def window_lines(first: int, steps: int, found: dict[str, Any]) -> list[str]:
    from harness.costs import kib

    last = first + steps - 1
    return [
        f"native stack holding more blocks after each of step{first}..step{last} (memray): "
        f"+{kib(s['bytes'] // steps)} per step in {s['blocks']} blocks at "
        + " < ".join(terminal_safe(f).replace("\n", " ") for f in s["frames"][: FRAMES_SHOWN + 2])
        for s in found["stacks"][:TOP_STACKS]
    ]


def _kept_capture(path: str) -> bytes | None:
    """The capture's bytes, for the results folder, where it is no larger than MAX_CAPTURE_BYTES."""
    from harness.costs import MAX_CAPTURE_BYTES

    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CAPTURE_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_CAPTURE_BYTES else None


def _scratch_root() -> str | None:
    """The run's dump root, where XLA's dumps go too (harness.xla.enable_step_dumps), else the system's."""
    root = os.environ.get(XLA_DUMP_ROOT_ENV)
    return root if root and os.path.isdir(root) else None


def _read_in_child(
    folder: str, name: str = CAPTURE_NAME, mode: str = "", timeout: float = READ_TIMEOUT_S
) -> dict[str, Any] | str:
    """What `python -m harness.metering.nativestacks [--window] CAPTURE OUT` found, or why nothing was found."""
    capture = os.path.join(folder, name)
    out = os.path.join(folder, STACKS_NAME)
    with open(os.path.join(folder, "reader.log"), "w+b") as log:
        # From the checkout's root, not the scratch folder: `-m` puts its cwd first on sys.path, and
        # a case can write the scratch folder (a planted harness/ would answer for the reader).
        proc = processes.start_in_session(
            [sys.executable, "-m", "harness.metering.nativestacks", *([mode] if mode else []), capture, out],
            stdout=log,
            cwd=HARNESS_HOME,
        )
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            processes.terminate_group(proc)
            return f"memray's reading took more than {timeout:.0f} s and was stopped"
        if code != 0:
            log.seek(0)
            lines = log.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
            return f"memray could not read its capture ({processes.describe_exit(code)}: {lines[-1] if lines else ''})"
    try:
        with open(out, encoding="utf-8") as fh:
            found = json.load(fh)
    except (OSError, ValueError) as exc:
        return f"memray's reading left no result ({_short(exc)})"
    if not _well_formed(found):
        return "memray's reading left a result of another form"
    return found


def _well_formed(found: Any) -> bool:
    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    return (
        isinstance(found, dict)
        and count(found.get("bytes"))
        and count(found.get("blocks"))
        and count(found.get("mapped", 0))
        and isinstance(found.get("stacks"), list)
        and all(
            isinstance(s, dict)
            and count(s.get("bytes"))
            and count(s.get("blocks"))
            and isinstance(s.get("frames"), list)
            and all(isinstance(f, str) for f in s["frames"])
            for s in found["stacks"]
        )
    )


def _line(step: int, found: dict[str, Any], grown: str, grown_bytes: int = 0) -> str:
    from harness.costs import kib

    stacks = [s for s in found["stacks"] if s["frames"]][:TOP_STACKS]
    shown = [
        f"{kib(s['bytes'])} in {s['blocks']} block{'s' if s['blocks'] != 1 else ''} at "
        + " < ".join(terminal_safe(f).replace("\n", " ") for f in s["frames"][: FRAMES_SHOWN + 2])
        for s in stacks
    ]
    named = sum(s["bytes"] for s in stacks)
    return (
        coverage(found["bytes"], grown_bytes)
        + f"native allocations of step{step} alive at its end (memray): "
        + ("; ".join(shown) if shown else "none")
        + f" (these {kib(named)} of the {kib(found['bytes'])} memray saw step{step} keep; {grown}"
        + (f"; and {kib(found['mapped'])} mapped outside malloc's heap" if found.get("mapped") else "")
        + ")"
    )


SAW_ALL = 0.9  # of a step's growth: below it, most of what the step kept is where memray does not look


def coverage(seen: int, grown: int) -> str:
    """What share of the step's native growth memray saw, first on its line: its stacks name only
    that share, so a line that saw 14% must not be read as naming the leak."""
    if grown <= 0:
        return ""
    share = seen / grown
    if share >= SAW_ALL:
        return f"memray saw {min(share, 1.0):.0%} of this growth: "
    return f"memray saw {share:.0%} of this growth: the rest is allocated where it does not track; "


def _short(exc: BaseException) -> str:
    text = terminal_safe(f"{type(exc).__name__}: {exc}").replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


# ---------------------------------------------------------------- the reading process


def summarize(capture: str) -> dict[str, Any]:
    """The leaked records of a capture by stack, the largest first (only those resolved)."""
    from memray import AllocatorType, FileReader

    reader = FileReader(capture)
    try:
        records = sorted(reader.get_leaked_allocation_records(merge_threads=True), key=lambda r: -r.size)
        # A raw mmap (Python's own 1 MiB arenas, a file mapped) is outside malloc's heap, the figure
        # the step's growth is read from: summed apart, so it neither names nor covers that growth.
        mapped = [r for r in records if r.allocator == AllocatorType.MMAP]
        records = [r for r in records if r.allocator != AllocatorType.MMAP]
        by_stack: dict[tuple[str, ...], list[int]] = collections.defaultdict(lambda: [0, 0])
        for record in records[:RESOLVED_RECORDS]:
            frames = tuple(_frames(record.hybrid_stack_trace()))
            by_stack[frames][0] += record.size
            by_stack[frames][1] += record.n_allocations
    finally:
        reader.close()
    stacks = sorted(by_stack.items(), key=lambda item: -item[1][0])
    return {
        "bytes": sum(r.size for r in records),
        "blocks": sum(r.n_allocations for r in records),
        "mapped": sum(r.size for r in mapped),
        "stacks": [{"bytes": b, "blocks": n, "frames": list(frames)} for frames, (b, n) in stacks],
    }


def summarize_window(capture: str, bounds: list[float]) -> dict[str, Any]:
    """The stacks whose live blocks grew at every step boundary (`bounds`: the times the window's
    steps ended, its start first), by STACK_LEAK_PER_STEP a step or more, the most bytes first:
    {"bytes": total, "blocks": total, "stacks": [{"bytes", "blocks", "frames"}]} (grown over the window)."""
    import bisect

    from memray import FileReader

    reader = FileReader(capture)
    try:
        times = [snapshot.time / 1000 for snapshot in reader.get_memory_snapshots()]
        at = [bisect.bisect_left(times, bound) for bound in bounds]  # the first snapshot after each boundary
        grown: dict[tuple[str, ...], list[list[int]]] = {}
        for record in reader.get_temporal_allocation_records(merge_threads=True):
            live = [_live_at(record.intervals, snapshot) for snapshot in at]
            if not all(b[0] > a[0] for a, b in zip(live, live[1:])):
                continue
            frames = tuple(_frames(record.hybrid_stack_trace()))
            if not frames:  # the meter's own
                continue
            summed = grown.setdefault(frames, [[0, 0] for _ in at])
            for total, (blocks, size) in zip(summed, live):
                total[0] += blocks
                total[1] += size
    finally:
        reader.close()
    steps = max(len(bounds) - 1, 1)
    stacks: list[dict[str, Any]] = [
        {"bytes": live[-1][1] - live[0][1], "blocks": live[-1][0] - live[0][0], "frames": list(frames)}
        for frames, live in grown.items()
        if live[-1][1] - live[0][1] >= STACK_LEAK_PER_STEP * steps
    ]
    stacks.sort(key=lambda s: -s["bytes"])
    return {"bytes": sum(s["bytes"] for s in stacks), "blocks": sum(s["blocks"] for s in stacks), "stacks": stacks}


def _live_at(intervals: list[Any], snapshot: int) -> tuple[int, int]:
    """Blocks and bytes of a stack's allocations alive at a snapshot."""
    blocks = size = 0
    for interval in intervals:
        end = interval.deallocated_before_snapshot
        if interval.allocated_before_snapshot <= snapshot and (end is None or end > snapshot):
            blocks += interval.n_allocations
            size += interval.n_bytes
    return blocks, size


def _frames(trace: list[tuple[str, str, int]]) -> list[str]:
    """'function (file:line)' from the allocation outwards, without the allocator's frames, the
    interpreter's or the meter's: the first FRAMES_SHOWN - 1 native ones, then the first Python
    line outside installed packages (the loop's), after the installed package's that called C."""
    natives: list[str] = []
    library: list[str] = []
    more = False
    for function, where, line in trace:
        if _METER.search(where):
            return []  # the meter's own (tracking starts and stops inside its step): its innermost Python
        if _ALLOCATOR_FRAME.match(function) or _INTERPRETER_FILE.search(where) or _OWN_PYTHON.search(where):
            continue
        place = "" if where in ("", "<unknown>") else f" ({os.path.basename(where)}{f':{line}' if line else ''})"
        frame = f"{_compact(function)}{place}"
        if where.endswith(".py"):
            if _INSTALLED.search(where) and not library:  # numpy's `full`: the caller's line follows
                library.append(frame)
                continue
            return [*natives, *(["..."] if more else []), *library, frame]
        if library:
            continue
        if len(natives) < FRAMES_SHOWN - 1:
            natives.append(frame)
        else:
            more = True
    return [*natives, *library]


def _compact(function: str) -> str:
    """A C++ name without its arguments and template arguments, its last two scopes: what a reader
    looks up (`XLAGraphExecutor::SyncTensorsGraphInternal`)."""
    name = function
    while True:  # innermost template brackets first
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    name = name.split("(", 1)[0].strip() or function
    name = "::".join(name.split("::")[-2:])
    return name if len(name) <= FRAME_CHARS else name[: FRAME_CHARS - 3] + "..."


def main(argv: list[str]) -> int:
    window = argv[:1] == ["--window"]
    argv = argv[1:] if window else argv
    if len(argv) != 2:
        print("usage: python -m harness.metering.nativestacks [--window] CAPTURE OUT", file=sys.stderr)
        return 2
    capture, out = argv
    if window:  # the boundaries the meter wrote next to the capture
        with open(os.path.join(os.path.dirname(capture), "bounds.json"), encoding="utf-8") as fh:
            bounds = json.load(fh)
        if not isinstance(bounds, list) or not all(isinstance(b, float) for b in bounds):
            print("bounds.json: not a list of times", file=sys.stderr)
            return 2
        found = summarize_window(capture, bounds)
    else:
        found = summarize(capture)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(found, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
