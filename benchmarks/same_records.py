"""Do two runs record the same thing? Case by case, every field of their verdict records but time.

    .venv/bin/python benchmarks/same_records.py RUN_A RUN_B

RUN_A and RUN_B are run folders (`<results>/run-...`) or results folders (their newest run).
A speed change must leave what a run records as it was: outcomes, reasons, shardings, cost
signatures with observed memory, the changes judged against baselines. This prints each case
whose record differs and the fields that do, and exits 1 when any does (0 when none).
Wall-clock fields and the evidence text (it quotes pids and paths) are left out; a case that
draws its inputs (hypothesis) differs from run to run by design and is listed like any other.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NOT_COMPARED = {"body_s", "duration_s", "evidence"}


def run_folder(path: Path) -> Path:
    if any(path.glob("verdicts-*.jsonl")):
        return path
    runs = sorted(p for p in path.glob("run-*") if p.is_dir())
    if not runs:
        raise SystemExit(f"{path}: neither a run folder (verdicts-*.jsonl) nor a results folder (run-*)")
    return runs[-1]


def records(folder: Path) -> dict[str, dict[str, Any]]:
    by_case: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("verdicts-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            by_case[record["nodeid"]] = {k: v for k, v in record.items() if k not in NOT_COMPARED}
    return by_case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args()
    a, b = run_folder(args.run_a), run_folder(args.run_b)
    left, right = records(a), records(b)
    differing = 0
    for nodeid in sorted(set(left) | set(right)):
        if nodeid not in left or nodeid not in right:
            differing += 1
            print(f"{nodeid}: only in {a if nodeid in left else b}")
            continue
        fields = sorted(
            k for k in set(left[nodeid]) | set(right[nodeid]) if left[nodeid].get(k) != right[nodeid].get(k)
        )
        if fields:
            differing += 1
            print(f"{nodeid}: {', '.join(fields)} differ")
    print(f"{len(set(left) | set(right))} cases; {differing} differ ({a.name} vs {b.name})")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
