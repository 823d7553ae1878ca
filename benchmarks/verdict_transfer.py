"""How long a big verdict takes to reach the parent after the body returned. Prints; asserts nothing.

    .venv/bin/python benchmarks/verdict_transfer.py [--sizes-mb 10,50,80] [--repeat 3]

A case that keeps the HLO of a large model sends tens of MB of observations. The time from the
body's end to the verdict in the parent counts against the case timeout, so it must grow
linearly with the size (harness.isolation.wire.protocol.LineBuffer). Fake backend: no torch_xla needed.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path


def body_big_observation(ctx, megabytes: int) -> None:
    ctx.record_hlo("big", "h" * (megabytes * 1_000_000))
    ctx.record("ended_at", time.time())


def measure(megabytes: int, repeat: int) -> tuple[float, float]:
    from harness.config.backends import FakeBackend
    from harness.isolation.parent.case import SpmdRunner
    from harness.isolation.parent.pool import ChildPool

    latencies, rates = [], []
    with tempfile.TemporaryDirectory() as logs:
        pool = ChildPool(Path(logs), startup_timeout=60)
        try:
            runner = SpmdRunner(pool, FakeBackend(4), 600, "benchmark")
            for _ in range(repeat):
                result = runner.run(body_big_observation, megabytes=megabytes)
                latency = time.time() - result.values["ended_at"]
                latencies.append(latency)
                rates.append(megabytes / latency)
        finally:
            pool.close()
    return statistics.median(latencies), statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="10,50,80")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| observations (MB) | body end -> verdict in parent (s, median) | MB/s |")
    print("|---:|---:|---:|")
    for size in (int(s) for s in args.sizes_mb.split(",")):
        latency, rate = measure(size, args.repeat)
        print(f"| {size} | {latency:.2f} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    # Import this file as a module, so the body has an importable name the child can load.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    importlib.import_module(Path(__file__).stem).main()
