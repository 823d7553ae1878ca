"""Time to verdict for `pytest -m spmd` on this machine, against the floor. Prints a table.

    .venv/bin/python benchmarks/time_to_verdict.py [--repeat 1] [--target-only] [-- extra pytest args]

Rows:
  serial / -n 2, forked   pytest -m spmd, children forked from a fork server (the default on CPU)
  serial / -n 2, fresh    the same with --spmd-fork-server=off: every child imports torch_xla itself
  floor (bare replay)     the same case bodies replayed (harness.replay) in one bare Python process
                          per environment configuration (plus one per case that needs a fresh
                          process): no pytest, no pipes, no pool
  floor (bodies)          the bodies' own durations as the children measured them (body_s in the
                          records of the serial forked run), summed; for -n 2, halved
  one bare process        import torch_xla, use_spmd, one sharded step, in one process
--target-only measures only the two rows the time-to-verdict target compares (-n 2 forked, one
bare process), --repeat times each, alternating, and prints their ratio and the -n 2 run against
its floor (its bodies over 2 workers plus one bare process); a run that recorded no case is not counted.
Columns: wall time, time to the first verdict on disk, cases, peak memory (PSS) of the process tree.
This is a benchmark, not a test: it asserts nothing and prints numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
MEMORY_EVERY_TICKS = 10  # of 0.1 s


def tree_rss_bytes(root: int) -> int:
    """Memory of `root` and all its descendants, read from /proc, as proportional set size (PSS).

    PSS, not RSS: forked children share the fork server's pages copy-on-write, and RSS would count
    every shared page once per process. Where smaps_rollup cannot be read, RSS stands in.
    """
    children: dict[int, list[int]] = {}
    size: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            size[int(entry)] = _pss_bytes(entry)
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += size.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _pss_bytes(pid: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


class Measurement:
    def __init__(self, label: str) -> None:
        self.label = label
        self.wall = 0.0
        self.first_verdict: float | None = None
        self.peak_rss = 0
        self.cases = 0
        self.exit_code = 0
        self.unreadable: list[str] = []  # damaged lines of its records (a run killed mid-write)


def measure(label: str, argv: list[str], results_dir: Path | None) -> Measurement:
    m = Measurement(label)
    if results_dir is not None:
        shutil.rmtree(results_dir, ignore_errors=True)  # an earlier run's verdicts would read as "first verdict"
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = threading.Event()

    def sample() -> None:
        # Memory once a second: reading every process's smaps_rollup walks its page tables, and
        # doing that ten times a second took a core's worth of time from the run being measured.
        ticks = 0
        while not done.is_set():
            if ticks % MEMORY_EVERY_TICKS == 0:
                m.peak_rss = max(m.peak_rss, tree_rss_bytes(proc.pid))
            if m.first_verdict is None and results_dir is not None:
                if any(p.stat().st_size for p in (results_dir / "latest").glob("verdicts-*.jsonl")):
                    m.first_verdict = time.monotonic() - started
            ticks += 1
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    m.exit_code = proc.wait()
    m.wall = time.monotonic() - started
    done.set()
    sampler.join()
    if results_dir is not None:
        # The run's case records, not its lines: a late fault's amendment is a line of the case it amends.
        m.cases = len(run_records(results_dir, m.unreadable))
    return m


def run_records(results_dir: Path, unreadable: list[str]) -> list:
    """The run's case records; a damaged line is listed in `unreadable`, not raised, so that one
    cut record does not end a benchmark that has measured for minutes."""
    from harness.records.results import read_records

    return list(read_records(results_dir, unreadable=unreadable)) if results_dir.exists() else []


def exit_column(m: Measurement, floor: Measurement) -> str:
    # The replay's exit is 1 by design: bodies of known-bug cases raise (pytest turns those into xfail).
    return "n/a" if m is floor else str(m.exit_code)


def median_of(runs: list[Measurement]) -> Measurement:
    """The run with the median wall time; peak memory is the worst seen."""
    ordered = sorted(runs, key=lambda m: m.wall)
    chosen = ordered[len(ordered) // 2]
    chosen.peak_rss = max(m.peak_rss for m in runs)
    return chosen


def table(rows: list[Measurement], floor: Measurement, extra: list[Measurement]) -> str:
    lines = [
        "| run | wall (s) | × floor | first verdict (s) | cases | per-case overhead (s) | peak PSS (GB) | exit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rows + [floor]:
        ratio = m.wall / floor.wall if floor.wall else float("nan")
        overhead = (m.wall - floor.wall) / m.cases if m.cases and m is not floor else 0.0
        first = f"{m.first_verdict:.1f}" if m.first_verdict is not None else "–"
        lines.append(
            f"| {m.label} | {m.wall:.1f} | {ratio:.2f} | {first} | {m.cases or '–'} | "
            f"{overhead:+.2f} | {m.peak_rss / 2**30:.2f} | {exit_column(m, floor)} |"
        )
    for m in extra:
        rss = f"{m.peak_rss / 2**30:.2f}" if m.peak_rss else "–"
        lines.append(f"| {m.label} | {m.wall:.1f} | {m.wall / floor.wall:.2f} | – | {m.cases or '–'} | – | {rss} | – |")
    return "\n".join(lines)


BARE_STEP = (
    "import torch, torch_xla, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs, numpy as np; "
    "xr.use_spmd(); n = xr.global_runtime_device_count(); "
    "mesh = xs.Mesh(np.arange(n), (n, 1), ('fsdp', 'model')); "
    "t = torch.randn(16, 32).to(torch_xla.device()); xs.mark_sharding(t, mesh, ('fsdp', None)); "
    "(t * 2).sum().cpu()"
)


def bodies_floor(results_dir: Path, label: str, workers: int) -> Measurement:
    m = Measurement(label)
    records = run_records(results_dir, m.unreadable)
    m.wall = sum(r.body_s for r in records) / workers
    m.cases = len(records)
    return m


def target_only(parallel: tuple[list[str], Path | None], bare: tuple[list[str], Path | None], repeat: int) -> int:
    """The two rows of the target, alternated so that a change in the machine's load hits both.

    Also the run against its floor: the cases' own bodies (body_s in its records) over the 2
    workers, plus one bare process for the fork server's start. What is above 1.00x is the
    harness's (pytest, forks, pipes, records, judging, and the idle core at the schedule's end).
    A run that recorded no case (refused, or nothing selected) is not counted: its wall time is
    pytest's start alone, and would read as the target met."""
    ratios, lags, floors = [], [], []
    for attempt in range(repeat):
        n2, one = measure("-n 2, forked", *parallel), measure("one bare process", *bare)
        first = f", first verdict {n2.first_verdict:.1f}s" if n2.first_verdict is not None else ""
        head = (
            f"run {attempt + 1}/{repeat}: -n 2 forked {n2.wall:.1f}s ({n2.cases} cases, exit {n2.exit_code}"
            f"{first}), one bare process {one.wall:.1f}s"
        )
        if not n2.cases:
            print(f"{head}: not counted, the run recorded no case", flush=True)
            continue
        ratios.append(n2.wall / one.wall)
        floor = run_floor(n2, bodies_floor(parallel[1], "bodies", workers=2), one) if parallel[1] else None
        if isinstance(floor, float):
            floors.append(floor)
        # The first verdict's target: one bare process (an import and a step) plus 1 s.
        if n2.first_verdict is not None:
            lags.append(n2.first_verdict - one.wall)
        shown = f"; {floor:.2f}x its floor" if isinstance(floor, float) else f"; {floor}" if floor else ""
        print(f"{head}: {ratios[-1]:.2f}x{shown}", flush=True)
    if not ratios:
        print(f"\nno run of {repeat} recorded a case: no ratio (run the pytest command alone to see why)")
        return 1
    ratios.sort()
    print(
        f"\n-n 2 forked = {ratios[len(ratios) // 2]:.2f} x one bare torch_xla process "
        f"(median of {len(ratios)}; min {ratios[0]:.2f}, max {ratios[-1]:.2f})"
    )
    if floors:
        floors.sort()
        print(
            f"-n 2 forked = {floors[len(floors) // 2]:.2f} x its floor, the bodies over 2 workers + one bare process "
            f"(median of {len(floors)}; min {floors[0]:.2f}, max {floors[-1]:.2f})"
        )
    if lags:
        lags.sort()
        print(
            f"first verdict = one bare process {lags[len(lags) // 2]:+.1f} s "
            f"(median of {len(lags)}; min {lags[0]:+.1f}, max {lags[-1]:+.1f})"
        )
    return 0


def run_floor(run: Measurement, bodies: Measurement, one: Measurement) -> float | str:
    """The run's wall time over its floor (its bodies over the workers plus one bare process), or
    why there is none: a floor summed from part of the records would be too low."""
    if bodies.unreadable:
        return f"no floor: {len(bodies.unreadable)} damaged record line(s) ({', '.join(bodies.unreadable[:3])})"
    return run.wall / (bodies.wall + one.wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the table shows the median")
    parser.add_argument(
        "--target-only", action="store_true", help="only '-n 2, forked' and 'one bare process' (the target's ratio)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = parser.parse_args()
    python = sys.executable
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="spmd-bench-") as tmp:
        base = [python, "-m", "pytest", "-m", "spmd", "-q", "-p", "no:cacheprovider", *args.pytest_args]
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; repo {REPO}", flush=True)
        rows: dict[str, tuple[list[str], Path | None]] = {}
        for mode in ("on", "off"):
            name = "forked" if mode == "on" else "fresh"
            for workers, extra in (("serial", []), ("-n 2", ["-n", "2"])):
                folder = Path(tmp, f"{name}-{workers.replace(' ', '')}")
                rows[f"{workers}, {name}"] = (
                    base + extra + [f"--spmd-fork-server={mode}", f"--spmd-results-dir={folder}"],
                    folder,
                )
        serial_dir = rows["serial, forked"][1]
        rows["floor (bare replay)"] = ([python, "-m", "harness.replay", f"--spmd-results-dir={serial_dir}"], None)
        rows["one bare process"] = ([python, "-c", BARE_STEP], None)
        if args.target_only:
            return target_only(rows["-n 2, forked"], rows["one bare process"], args.repeat)
        measured = {}
        for label, (argv, results_dir) in rows.items():
            runs = []
            for attempt in range(args.repeat):
                runs.append(measure(label, argv, results_dir))
                print(f"{label} run {attempt + 1}/{args.repeat}: {runs[-1].wall:.1f}s", flush=True)
            measured[label] = median_of(runs)
        floor = measured.pop("floor (bare replay)")
        floor.cases = measured["serial, forked"].cases
        bare = measured.pop("one bare process")
        extra_rows = [
            bodies_floor(serial_dir, "floor (bodies), serial", 1),
            bodies_floor(serial_dir, "floor (bodies), 2 cores", 2),
            bare,
        ]
        print()
    print(table(list(measured.values()), floor, extra_rows))
    if extra_rows[0].unreadable:
        print(f"floor (bodies) leaves out {len(extra_rows[0].unreadable)} damaged record line(s): too low")
    print(f"\n-n 2 forked = {measured['-n 2, forked'].wall / bare.wall:.1f} x one bare torch_xla process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
