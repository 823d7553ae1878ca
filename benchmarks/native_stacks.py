"""What naming the native stacks of a loop that grows natively costs (harness.metering.nativestacks). Prints
numbers; asserts nothing.

    .venv/bin/python benchmarks/native_stacks.py [--steps 5] [--repeat 3]

In one torch_xla process (CPU backend, 4 devices, a fresh process per run) a small FSDPv2 loop runs
`--steps` steps under harness.stepcosts' meter, three ways: healthy; keeping 512 KiB of numpy data
per step in a list made before the meter (the heap grows, the meter tracks the step after the first
that grew under memray and names its stacks); the same with memray made unimportable (the line says
so). Printed per way: the CPU (user + system, the process and the reading process it waited for)
and the wall time of each step, medians over the repeats, and the steady-state line. The machine
is shared: the numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
if {hide_memray!r}:
    sys.modules["memray"] = None  # import memray raises ImportError
from types import SimpleNamespace
from harness import costs, stepcosts, xla
xla.enable_spmd()
xla.enable_step_dumps()
import numpy as np
import torch, torch.nn as nn
import torch_xla.distributed.spmd as xs

def cpu():
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime

n = xla.num_devices()
mesh = xla.mesh((n, 1), ("fsdp", "model"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8)).to(xla.device())
for p in model.parameters():
    xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
old_container = []
ctx = SimpleNamespace(values={{}}, devices=None, bodies_before=0)
meter = stepcosts.StepMeter(ctx, parameters=model.parameters(), optimizer=optimizer)
steps = []
for step in range({steps}):
    started_cpu, started_wall = cpu(), time.perf_counter()
    with meter.step():
        x = torch.randn(4 * n, 16).to(xla.device())
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        if {leak!r}:
            old_container.append(np.full(65536, float(step)))
        xla.sync()
    steps.append({{"cpu_s": cpu() - started_cpu, "wall_s": time.perf_counter() - started_wall}})
print(json.dumps({{"steps": steps, "problems": costs.steady_state_problems(meter.signature)}}))
"""

WAYS = {
    "healthy": {"leak": False, "hide_memray": False},
    "leaking, stacks named": {"leak": True, "hide_memray": False},
    "leaking, no memray": {"leak": True, "hide_memray": True},
}


def run(steps: int, leak: bool, hide_memray: bool) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4", XLA_USE_SPMD="1")
    code = CHILD.format(repo=str(REPO), steps=steps, leak=leak, hide_memray=hide_memray)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for _ in range(args.repeat):
        for way, options in WAYS.items():
            runs[way].append(run(args.steps, **options))
    for way, found in runs.items():
        print(f"{way}: per step, median of {args.repeat}:")
        for index in range(args.steps):
            cpu = statistics.median(r["steps"][index]["cpu_s"] for r in found)
            wall = statistics.median(r["steps"][index]["wall_s"] for r in found)
            print(f"  step{index}: CPU {cpu:.2f} s, wall {wall:.2f} s")
        for line in found[-1]["problems"] or ["(no steady-state finding)"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
