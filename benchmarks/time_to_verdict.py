"""Time to verdict for `pytest -m spmd` on this machine, against the floor. Prints a table.

    .venv/bin/python benchmarks/time_to_verdict.py [--repeat 1] [-- extra pytest args]

Rows:
  serial       pytest -m spmd, one process, warm children per environment
  xdist -n 2   the same under pytest-xdist with two workers
  floor        the same case bodies replayed (harness.replay) in one bare Python process per
               environment configuration (plus one per case that needs a fresh process):
               no pytest, no pipes, no pool; what isolation cannot beat
Columns: wall time, time to the first verdict on disk, cases, peak memory of the process tree.
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


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants, read from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            statm = Path(f"/proc/{entry}/statm").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = int(statm.split()[1]) * PAGE
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


class Measurement:
    def __init__(self, label: str) -> None:
        self.label = label
        self.wall = 0.0
        self.first_verdict: float | None = None
        self.peak_rss = 0
        self.cases = 0
        self.exit_code = 0


def measure(label: str, argv: list[str], results_dir: Path | None) -> Measurement:
    m = Measurement(label)
    if results_dir is not None:
        shutil.rmtree(results_dir, ignore_errors=True)  # an earlier run's verdicts would read as "first verdict"
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            m.peak_rss = max(m.peak_rss, tree_rss_bytes(proc.pid))
            if m.first_verdict is None and results_dir is not None:
                if any(p.stat().st_size for p in results_dir.glob("verdicts-*.jsonl")):
                    m.first_verdict = time.monotonic() - started
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    m.exit_code = proc.wait()
    m.wall = time.monotonic() - started
    done.set()
    sampler.join()
    if results_dir is not None:
        m.cases = sum(1 for p in results_dir.glob("verdicts-*.jsonl") for line in p.read_text().splitlines() if line)
    return m


def exit_column(m: Measurement, floor: Measurement) -> str:
    # The replay's exit is 1 by design: bodies of known-bug cases raise (pytest turns those into xfail).
    return "n/a" if m is floor else str(m.exit_code)


def median_of(runs: list[Measurement]) -> Measurement:
    """The run with the median wall time; peak memory is the worst seen."""
    ordered = sorted(runs, key=lambda m: m.wall)
    chosen = ordered[len(ordered) // 2]
    chosen.peak_rss = max(m.peak_rss for m in runs)
    return chosen


def table(rows: list[Measurement], floor: Measurement) -> str:
    lines = [
        "| run | wall (s) | × floor | first verdict (s) | cases | per-case overhead (s) | peak RSS (GB) | exit |",
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
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the table shows the median")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="spmd-bench-") as tmp:
        serial_dir, xdist_dir = Path(tmp, "serial"), Path(tmp, "xdist")
        base = [python, "-m", "pytest", "-m", "spmd", "-q", "-p", "no:cacheprovider", *args.pytest_args]
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; repo {REPO}", flush=True)
        rows = {
            "serial": (base + [f"--results-dir={serial_dir}"], serial_dir),
            "xdist -n 2": (base + ["-n", "2", f"--results-dir={xdist_dir}"], xdist_dir),
            "floor (bare replay)": ([python, "-m", "harness.replay", f"--results-dir={serial_dir}"], None),
        }
        measured = {}
        for label, (argv, results_dir) in rows.items():
            runs = []
            for attempt in range(args.repeat):
                runs.append(measure(label, argv, results_dir))
                print(f"{label} run {attempt + 1}/{args.repeat}: {runs[-1].wall:.1f}s", flush=True)
            measured[label] = median_of(runs)
        serial, xdist, floor = measured.values()
        floor.cases = serial.cases
        print()
    print(table([serial, xdist], floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
