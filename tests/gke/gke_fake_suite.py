"""A stand-in for `python -m pytest -m spmd` that needs no torch_xla.

The worker appends `--spmd-backend=B --spmd-results-dir=D --junitxml=F` (and any extra args); this script
writes CaseRecords into D the way the spmd plugin does, then exits like pytest would. Placement
comes from the env the worker's pod (or --local) gets, so behaviour can depend on the host:
    --disagree-on-slice S   slice S records another sharding for fc.weight
    --crash-on HOST         slice:host that aborts (SIGABRT) after its first case
    --hang-on HOST          slice:host that sleeps (for timeouts)
    --exit CODE             exit code after writing the records (pytest's 1: a case failed)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for harness.records.results

from harness.records.results import CaseRecord, family_of, write_record

AGREED = "{devices=[4,1]0,1,2,3}"
OTHER = "{replicated}"
CASES = ("cases/test_fake_family.py::test_sharded[func-on]", "cases/test_fake_family.py::test_known_bug[x]")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spmd-backend", dest="backend", required=True)
    parser.add_argument("--spmd-results-dir", dest="results_dir", type=Path, required=True)
    parser.add_argument("--junitxml", required=True)
    parser.add_argument("--disagree-on-slice", type=int)
    parser.add_argument("--crash-on")
    parser.add_argument("--hang-on")
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    here = f"{os.environ.get('MEGASCALE_SLICE_ID', '0')}:{os.environ.get('HARNESS_HOST_ID', '0')}"
    print(f"fake suite on {here}, backend {args.backend}", flush=True)
    slice_id = int(here.split(":")[0])
    sharding = OTHER if args.disagree_on_slice == slice_id else AGREED
    write_record(
        args.results_dir, _record(CASES[0], "passed", args.backend, {"fc.weight": sharding, "scalar": "{replicated}"})
    )
    if args.crash_on == here:
        print("about to crash", flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    if args.hang_on == here:
        time.sleep(60)
    write_record(args.results_dir, _record(CASES[1], "xfailed", args.backend, {}))
    Path(args.junitxml).write_text("<testsuites/>")
    return args.exit


def _record(nodeid: str, outcome: str, backend: str, shardings: dict[str, str]) -> CaseRecord:
    return CaseRecord(
        nodeid=nodeid,
        family=family_of(nodeid),
        outcome=outcome,
        backend=backend,
        torch_xla="2.9.0",
        devices=4,
        duration_s=0.01,
        shardings=shardings,
        reason="known bug reproduced" if outcome == "xfailed" else "",
    )


if __name__ == "__main__":
    sys.exit(main())
