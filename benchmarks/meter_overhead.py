"""What harness.stepcosts' meter costs per step, in CPU. Prints numbers; asserts nothing.

    .venv/bin/python benchmarks/meter_overhead.py [--steps 5] [--repeat 5]
    .venv/bin/python benchmarks/meter_overhead.py --suite [--repeat 1] [-- PYTEST ARGS]

--suite: the whole `pytest -m spmd` run (serial) with the meter on and with it off, alternately:
the CPU (user + system) of pytest and every process it waited for (case children, fork servers),
and the share the meter adds. Off, every StepMeter is a stand-in that measures nothing (set in a
sitecustomize the run's processes import first); both runs use no cost baseline, so the off run
fails nothing for lack of signatures. A first, uncounted run with the meter off finds the cases
that fail without it (the self-tests that expect a cost finding); both sides of every counted
pair leave them out, so both do the same cases' work.

In one torch_xla process (CPU backend, 4 devices) the two-layer FSDPv2 loop of cases/test_costs.py
runs `--steps` steps bare and `--steps` steps under the meter, `--repeat` times alternately, each
in a fresh process (the meter freezes the collector for the rest of a process), after the imports:
what a case's child does. Printed: the process CPU (user + system) of the body (compilations
included: the meter's dumps and their reading happen there), median over the repeats, and what the
meter adds per step; then the native figures' own cost (harness.metering.nativememory.now(), timed 10,000 times). The
machine is shared: the numbers are noisy, medians of a few repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = """
import json, os, resource, sys, time
sys.path.insert(0, {repo!r})
from types import SimpleNamespace
from harness import xla
xla.enable_spmd()
xla.enable_step_dumps()
from cases.test_costs import body_two_layer_fsdpv2
import harness.stepcosts as stepcosts
metered = {metered!r}
if not metered:
    class Bare:
        def __init__(self, *a, **k): pass
        def step(self):
            import contextlib
            return contextlib.nullcontext()
    stepcosts.StepMeter = Bare
ctx = SimpleNamespace(values={{}}, devices=None, bodies_before=0, record=lambda *a, **k: None,
                      record_sharding=lambda *a, **k: None)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import torch, torch_xla.distributed.spmd, torch_xla.experimental.spmd_fully_sharded_data_parallel  # not measured
from harness import recording
started = cpu()
body_two_layer_fsdpv2(ctx, steps={steps})
print(json.dumps({{"cpu_s": cpu() - started}}))
"""


def run(metered: bool, steps: int) -> float:
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4", XLA_USE_SPMD="1")
    code = CHILD.format(repo=str(REPO), metered=metered, steps=steps)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return float(json.loads(lines[-1])["cpu_s"])


METER_OFF = """
import contextlib
import harness.stepcosts


class MeterOff:
    def __init__(self, *args, **kwargs):
        pass

    def step(self):
        return contextlib.nullcontext()


harness.stepcosts.StepMeter = MeterOff
"""


def run_suite(metered: bool, pytest_args: list[str], scratch: Path) -> tuple[float, float, str, list[str]]:
    """CPU seconds and wall seconds of one serial `pytest -m spmd`, its last line and the ids it failed."""
    import resource
    import tempfile

    site = Path(tempfile.mkdtemp(dir=scratch))
    if not metered:
        (site / "sitecustomize.py").write_text(METER_OFF)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-m", "spmd", "-p", "no:cacheprovider", "-q"]
    command += [f"--spmd-results-dir={site / 'results'}", f"--spmd-costs-baseline={site / 'no-baseline.json'}"]
    command += [f"--junitxml={site / 'junit.xml'}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command + pytest_args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return cpu, wall, last, failed_ids(site / "junit.xml")


def failed_ids(junit: Path) -> list[str]:
    """The node ids of the cases that failed, from the run's JUnit XML: the terminal's FAILED lines
    shorten ids (pytest's and the harness's own lines), and a shortened id deselects nothing (the
    off side then did less work: 21 of 24 such cases still ran and failed)."""
    import xml.etree.ElementTree as ElementTree

    if not junit.is_file():
        return []
    return [
        f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        for case in ElementTree.parse(junit).iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]


def suite(repeat: int, pytest_args: list[str]) -> None:
    """Alternated pairs. The cases that fail with the meter off (the self-tests that expect a cost
    finding) are left out of every counted run, on both sides: a failed assertion ends a self-test
    before its second loop, so the off side would do less of the cases' own work than the on side."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        *_, first_failed = run_suite(False, pytest_args, Path(scratch))
        print(f"left out of both sides: {len(first_failed)} case(s) that fail with the meter off", flush=True)
        pytest_args = [*pytest_args, *(f"--deselect={nodeid}" for nodeid in first_failed)]
        on, off = [], []
        for _ in range(repeat):
            for metered, into in ((False, off), (True, on)):
                cpu, wall, last, _ = run_suite(metered, pytest_args, Path(scratch))
                into.append(cpu)
                print(f"meter {'on ' if metered else 'off'}: CPU {cpu:.1f} s, wall {wall:.1f} s; {last}", flush=True)
    m, b = statistics.median(on), statistics.median(off)
    print(
        f"pytest -m spmd (serial), CPU median: meter off {b:.1f} s, on {m:.1f} s; "
        f"the meter adds {m - b:+.1f} s ({100 * (m - b) / b:+.1f}%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--suite", action="store_true", help="the whole spmd suite, meter on and off")
    parser.add_argument("pytest_args", nargs="*", help="with --suite: more pytest arguments (after --)")
    args = parser.parse_args()
    if args.suite:
        suite(args.repeat, args.pytest_args)
        return
    bare, metered = [], []
    for _ in range(args.repeat):
        bare.append(run(False, args.steps))
        metered.append(run(True, args.steps))
    b, m = statistics.median(bare), statistics.median(metered)
    print(
        f"loop of {args.steps} steps, CPU s: bare {[round(x, 2) for x in bare]}, metered {[round(x, 2) for x in metered]}"
    )
    print(
        f"median: bare {b:.2f} s, metered {m:.2f} s; the meter adds {1000 * (m - b) / args.steps:.1f} ms CPU per step"
    )
    from harness.metering import nativememory

    started = time.perf_counter()
    for _ in range(10_000):
        nativememory.now()
    print(f"harness.metering.nativememory.now(): {1e6 * (time.perf_counter() - started) / 10_000:.1f} us a call")


if __name__ == "__main__":
    main()
