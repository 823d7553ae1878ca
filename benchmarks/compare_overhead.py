"""What --spmd-compare adds to `pytest -m spmd -n 2`. Prints numbers; asserts nothing.

    .venv/bin/python benchmarks/compare_overhead.py [--repeat 3] [--base RUN_FOLDER] [-- extra pytest args]

1. The base: a run of the suite (or --base, an existing run folder of this build).
2. --repeat pairs of runs, alternating, without and with --spmd-compare=<that run folder>: wall
   time of each, the medians and the overhead in percent (the target is at most 5%).
3. The comparison's own work, timed in this process without pytest: loading and validating the
   base run (done once per pytest process: the controller and each worker) and comparing every
   case record of the base with itself (what the workers do, one case at a time). This part
   does not depend on how loaded the machine is the way wall times do.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.judges import basecompare  # noqa: E402 (the repository's harness, not an installed one)
from harness.records import runfolder  # noqa: E402
from harness.records.results import read_records  # noqa: E402


def run_suite(results: Path, extra: list[str]) -> tuple[float, int]:
    command = [sys.executable, "-m", "pytest", "-m", "spmd", "-n", "2", "-q", "-p", "no:cacheprovider"]
    command += [f"--spmd-results-dir={results}", *extra]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, proc.returncode


def comparison_work(base_run: Path) -> tuple[float, float, int]:
    """Seconds to load the base run, seconds to compare each passing case with itself, cases."""
    first = next(iter(read_records(base_run)))  # the backend and device count it was taken with
    start = time.perf_counter()
    base = basecompare.BaseRun.load(base_run, first.backend, first.devices or 0)
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    compared = 0
    for record in base.records.values():
        if record.outcome == "passed":
            result = basecompare.compare_case(base, record.nodeid, record.shardings, record.costs)
            assert not result.differences, result.differences  # a run agrees with itself
            compared += 1
    return loaded, time.perf_counter() - start, compared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="pairs of runs (default 3)")
    parser.add_argument("--base", type=Path, help="an existing run folder of this build to compare with")
    parser.add_argument("extra", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compare-overhead-") as scratch:
        base_run = args.base
        if base_run is None:
            seconds, code = run_suite(Path(scratch) / "base", args.extra)
            (base_run,) = Path(scratch, "base").glob(f"{runfolder.RUN_PREFIX}*")
            print(f"base run: {seconds:.1f} s (pytest exit {code}) -> {base_run}")
        walls: dict[str, list[float]] = {"without": [], "with": []}
        for n in range(args.repeat):
            for label, extra in (("without", []), ("with", [f"--spmd-compare={base_run}"])):
                seconds, code = run_suite(Path(scratch) / f"{label}-{n}", [*extra, *args.extra])
                walls[label].append(seconds)
                print(f"pair {n + 1} {label:>7} --spmd-compare: {seconds:6.1f} s (pytest exit {code})")
        without, with_ = statistics.median(walls["without"]), statistics.median(walls["with"])
        print(f"median wall: without {without:.1f} s, with {with_:.1f} s: {100 * (with_ - without) / without:+.1f}%")
        loaded, compared_s, cases = comparison_work(base_run)
        print(
            f"comparison's own work: load + validate the base run {1000 * loaded:.1f} ms per process; "
            f"compare {cases} cases {1000 * compared_s:.1f} ms in all"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
