"""Where the CPU of `pytest -m spmd -n 2` goes, by role: user and system seconds, page faults.

    .venv/bin/python benchmarks/cpu_breakdown.py [-- extra pytest args]

Runs the command once and samples /proc every 20 ms: every process of the run's tree, its role
(the pytest controller, an xdist worker, a fork server, a keeper it forked, a case child forked
from a keeper, a fresh child, anything else), its CPU time and faults as last seen. A process
that lives less than one sampling period, or the CPU it spends after its last sample, is missed:
the last line says how much of the tree's total (the kernel's count of the waited-for tree) the
samples cover. This is a benchmark, not a test: it asserts nothing and prints numbers.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
PERIOD_S = 0.02


def read_stat(pid: int) -> tuple[int, float, float, int, int] | None:
    """(parent pid, user s, system s, minor faults, major faults) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), int(fields[11]) / TICKS, int(fields[12]) / TICKS, int(fields[7]), int(fields[9])


def read_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role(pid: int, parents: dict[int, int], cmdlines: dict[int, str], root: int) -> str:
    """What the process is to the run, from its command line and where it sits in the tree."""
    cmd = cmdlines.get(pid, "")
    if pid == root:
        return "pytest controller"
    if "harness.isolation.server.forkserver" in cmd:
        depth, up = 0, parents.get(pid)
        while up is not None and "harness.isolation.server.forkserver" in cmdlines.get(up, ""):
            depth, up = depth + 1, parents.get(up)
        # The torch_xla and the torch-only server differ only in what their environment preloads.
        return ("fork server", "keeper", "case child (forked)")[min(depth, 2)]
    if "harness.isolation.child.main" in cmd:
        return "case child (fresh)"
    if parents.get(pid) == root and "exec(eval(" in cmd:  # execnet's popen gateway: an xdist worker
        return "xdist worker"
    return "other: " + (cmd.split(" ")[0].rsplit("/", 1)[-1] or "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    command = [sys.executable, "-m", "pytest", "-m", "spmd", "-n", "2", "-q", "-p", "no:cacheprovider"]
    command += args.pytest_args
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    last: dict[int, tuple[float, float, int, int]] = {}
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    while proc.poll() is None:
        tree = {proc.pid}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            stat = read_stat(pid)
            if stat is None:
                continue
            parents[pid] = stat[0]
            if pid not in cmdlines:
                cmdlines[pid] = read_cmdline(pid)
            up, hops = pid, 0
            while up in parents and up != proc.pid and hops < 20:
                up, hops = parents[up], hops + 1
            if up == proc.pid:
                tree.add(pid)
                last[pid] = stat[1:]
        time.sleep(PERIOD_S)
    wall = time.monotonic() - started
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    by_role: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0])
    for pid, (user, system, minor, major) in last.items():
        row = by_role[role(pid, parents, cmdlines, proc.pid)]
        row[0] += 1
        row[1] += user
        row[2] += system
        row[3] += minor
        row[4] += major
    print(f"{' '.join(command[1:])}: exit {proc.returncode}, wall {wall:.1f} s")
    print(f"{'role':<28}{'processes':>10}{'user s':>9}{'sys s':>8}{'minor faults':>14}{'major':>7}")
    for name, (count, user, system, minor, major) in sorted(by_role.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"{name:<28}{count:>10}{user:>9.1f}{system:>8.1f}{minor:>14}{major:>7}")
    sampled = sum(row[1] + row[2] for row in by_role.values())
    total = waited.ru_utime + waited.ru_stime
    print(
        f"tree total (kernel, waited): user {waited.ru_utime:.1f} s, sys {waited.ru_stime:.1f} s; "
        f"the samples cover {sampled / total:.0%} of it"
        if total
        else "tree total: nothing waited for"
    )


if __name__ == "__main__":
    main()
