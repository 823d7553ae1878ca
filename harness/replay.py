"""Replay journalled case bodies in bare Python processes: no pytest, no pipes, no pool.

Every `spmd.run` is journalled to `requests-<worker>.jsonl` in the run's folder
(`<results-dir>/run-*/`, see harness.records.runfolder) before it runs (body, kwargs, the child's exact
environment). This replays them:

    python -m harness.replay --case test_fsdpv2_vit          # reproduce one case outside pytest
    python -m harness.replay --print-commands                # the env + command, to run under gdb
    python -m harness.replay                                 # everything: the benchmark's "floor"

Requests that shared a warm child share a process here too (one per environment); requests that
needed a fresh child get one each. Also installed as `spmd-replay`.

Exit codes: 0 every replayed body finished without an exception (or --print-commands); 1 a body
raised; another nonzero code is the exit status of the first replay process that failed (a
crash); 2 usage error (no journalled requests there, a bad option).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import cli
from harness.errors import HarnessUsageError
from harness.isolation.wire import protocol
from harness.records import runfolder


def read_journal(results_dir: Path, case_filter: str = "") -> list[dict[str, Any]]:
    run = runfolder.resolve(results_dir) or results_dir  # a results folder means its latest run
    everything = _journal(run)
    entries = [entry for entry in everything if case_filter in entry["request"]["case"]]
    if not entries:
        raise HarnessUsageError(_nothing_to_replay(results_dir, run, case_filter, everything))
    return entries


def _journal(run: Path) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(run.glob(runfolder.REQUESTS_GLOB)):
        for line in path.read_text(encoding="utf-8").splitlines():
            entries.append(json.loads(line))
    return entries


def _nothing_to_replay(results_dir: Path, run: Path, case_filter: str, everything: list[dict[str, Any]]) -> str:
    """Say which run was read, that it lacks the case, and which other runs have it."""
    if not everything:
        return f"no journalled requests in {run}; run pytest with --spmd-results-dir {results_dir} first"
    cases = sorted({entry["request"]["case"] for entry in everything})
    shown = ", ".join(cases[:5]) + (f" and {len(cases) - 5} more" if len(cases) > 5 else "")
    message = f"run {run} has no case matching {case_filter!r} (it ran {shown})"
    picked = "" if runfolder.is_run_folder(Path(results_dir)) else f" (the newest run in {results_dir})"
    others = [
        other
        for other in sorted(Path(run).parent.glob(f"{runfolder.RUN_PREFIX}*"), reverse=True)
        if other.resolve() != Path(run).resolve()
        and any(case_filter in entry["request"]["case"] for entry in _journal(other))
    ]
    if others:
        return f"{message}{picked}; it is in {', '.join(str(o) for o in others[:3])}: pick one with --results-dir RUN"
    return f"{message}{picked}; no other run in {Path(run).parent} has it: pick a run with --results-dir RUN"


def group_by_process(entries: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(spec, requests) per process: one per distinct spec, plus one per fresh request."""
    shared: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    groups = []
    for entry in entries:
        if entry["fresh"]:
            groups.append((entry["spec"], [entry["request"]]))
            continue
        key = json.dumps(entry["spec"], sort_keys=True)
        if key not in shared:
            shared[key] = (entry["spec"], [])
            groups.append(shared[key])
        shared[key][1].append(entry["request"])
    return groups


def command_for(spec: dict[str, Any], requests_file: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in spec["env"]}
    env[protocol.PRELOAD_ENV] = ",".join(spec["preload"])
    return [spec["python"], "-m", "harness.replay", "--run-group", str(requests_file)], env


def run_group_here(requests_file: Path) -> int:
    """Inside the replay process: the set-up hooks once, then each body in turn."""
    from harness.isolation.child.main import run_preload_hooks, run_request
    from harness.isolation.wire.protocol import Request

    run_preload_hooks()
    failures = 0
    for number, entry in enumerate(json.loads(requests_file.read_text(encoding="utf-8")), start=1):
        answer = run_request(Request(id=number, case=entry["case"], body=entry["body"], kwargs=entry["kwargs"]))
        exc = answer.exception
        status = (
            "ok" if exc is None else f"{exc['type']}: {exc['message'].splitlines()[0][:200] if exc['message'] else ''}"
        )
        print(f"[replay] {answer.duration_s:7.2f}s {entry['case']}: {status}", flush=True)
        failures += exc is not None
    return 1 if failures else 0


def replay(results_dir: Path, case_filter: str, print_commands: bool) -> int:
    groups = group_by_process(read_journal(results_dir, case_filter))
    worst = 0
    with tempfile.TemporaryDirectory(prefix="harness-replay-") as tmp:
        for index, (spec, requests) in enumerate(groups):
            requests_file = Path(tmp) / f"group-{index}.json"
            requests_file.write_text(json.dumps(requests), encoding="utf-8")
            argv, env = command_for(spec, requests_file)
            if print_commands:
                keep = (runfolder.resolve(results_dir) or results_dir) / f"replay-group-{index}.json"
                keep.write_text(json.dumps(requests), encoding="utf-8")
                exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
                print(f"env -i {exports} {shlex.join(argv[:-1] + [str(keep)])}")
                continue
            started = time.monotonic()
            code = subprocess.run(argv, env=env).returncode
            print(
                f"[replay] process {index + 1}/{len(groups)}: {len(requests)} case(s), "
                f"{time.monotonic() - started:.1f}s, exit {code}",
                flush=True,
            )
            worst = worst or code
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = cli.PlainParser(prog=cli.prog("harness.replay", "spmd-replay"), description=__doc__)
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=Path("results"),
        metavar="DIR",
        help="a results folder (its latest run) or one run's folder (default: results)",
    )
    # pytest's spelling of the same folder, as the time-to-verdict benchmark passes it.
    cli.add_hidden_alias(parser, "--spmd-results-dir", dest="results_dir", type=Path)
    parser.add_argument("--case", default="", help="replay only requests whose case id contains this")
    parser.add_argument("--print-commands", action="store_true", help="print the commands instead of running them")
    parser.add_argument("--run-group", type=Path, help=argparse.SUPPRESS)
    cli.add_version(parser, "spmd-replay")
    args = parser.parse_args(argv)
    if args.run_group:
        return run_group_here(args.run_group)
    try:
        return replay(args.results_dir, args.case, args.print_commands)
    except HarnessUsageError as err:
        print(f"harness.replay: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
