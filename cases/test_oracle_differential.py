"""Differential oracle: a sharded program computes what it computes eagerly on the CPU.

No baseline: the same small program (harness.oracles.program) runs on XLA with mark_sharding on
its inputs and intermediates, and eagerly on the CPU; outputs must agree within the tolerance
stated in harness.oracles.compare.

- PR tier: the committed programs in cases/oracle_programs.json (deterministic; about 20-30 s on
  2 shared cores). They were drawn by harness.oracles.generate (hypothesis seeds 48 for 4 devices,
  4848 for 8), chosen greedily to cover every op, mesh rank, several axes on one dim and permuted
  device orders; programs that carry a registry entry on 2.4.0, 2.6.0 or 2.9.0 were left out (their
  cases are in cases/test_oracle_findings.py), and two programs per device count with uneven
  shards were added by hand so that the pad-front fault below has something to catch. Five more,
  by hand, take sort/topk values, index_put and conv1d/conv2d along sharded dims (they agree on
  2.4.0-2.9.0; each mismatches under swap-shards).
- Nightly tier: hypothesis draws new programs on the run's devices (4, or 8 with
  --spmd-devices=8) for --spmd-fuzz-budget seconds; a mismatch is shrunk, rerun to confirm it is
  deterministic, and printed as a standalone script. A failure a registry entry carried by this
  build explains (scatter-add-uneven-src-aborts drawn again) is counted and passed over.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.oracles import repro, runner, search
from harness.oracles.program import ProgramError, check_program

pytestmark = pytest.mark.spmd

EXAMPLES = Path(__file__).with_name("oracle_programs.json")


def load_examples(path: Path = EXAMPLES) -> list[dict]:
    """The committed programs, each checked (the file is input like any other)."""
    try:
        programs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProgramError(f"{path}: not readable as JSON ({exc}); restore it from git") from None
    if not isinstance(programs, list):
        raise ProgramError(f"{path}: expected a list of programs")
    for i, program in enumerate(programs):
        try:
            check_program(program)
        except ProgramError as exc:
            raise ProgramError(f"{path}, program {i}: {exc}") from None
    return programs


def failures_text(programs: list[dict], verdicts: list[dict]) -> str:
    failed = [(p, v) for p, v in zip(programs, verdicts, strict=True) if v["status"] != "ok"]
    return "\n\n".join(repro.report(p, v) for p, v in failed)


def test_committed_programs_agree_with_cpu(spmd, request) -> None:
    """A failure a registry entry carried by this build explains (gather-along-sharded-dim-hlo-verifier
    on 2.7.0: a committed program hits it) is listed, not failed: its own case in
    cases/test_oracle_findings.py reports it; any other failure fails."""
    programs = [p for p in load_examples() if len(p["mesh"]["devices"]) == spmd.backend.devices]
    if not programs:
        pytest.skip(f"no committed program for {spmd.backend.devices} devices")
    verdicts = runner.check_programs(spmd, programs)
    explains = search.known_bugs(spmd, search.registry_entries(request.config))
    known = {
        i: entry
        for i, (program, verdict) in enumerate(zip(programs, verdicts, strict=True))
        if verdict["status"] != "ok" and (entry := explains(program, verdict)) is not None
    }
    if known:
        request.node.add_report_section(
            "call",
            "known bugs passed over",
            "\n".join(
                f"committed program {i}: {entry} (its own case reports it)" for i, entry in sorted(known.items())
            ),
        )
    kept = [i for i in range(len(programs)) if i not in known]
    assert all(verdicts[i]["status"] == "ok" for i in kept), failures_text(
        [programs[i] for i in kept], [verdicts[i] for i in kept]
    )


@pytest.mark.nightly
def test_drawn_programs_agree_with_cpu(spmd, request) -> None:
    """Hypothesis draws programs for --spmd-fuzz-budget seconds; every finding is shrunk and printed."""
    budget = search.budget(request.config)
    explains = search.known_bugs(spmd, search.registry_entries(request.config))
    summary = search.search(spmd, spmd.backend.devices, budget, explains=explains)
    print(summary.line())
    assert not summary.findings, summary.line() + "\n\n" + "\n\n".join(finding.text() for finding in summary.findings)


@pytest.mark.parametrize("fault", ["swap-shards", "pad-front"])
def test_oracle_fails_when_torch_xla_misplaces_shard_data(spmd, fault) -> None:
    """The oracle must be able to fail: with a fault put into torch_xla's mark_sharding in the child
    (harness.oracles.faults: two shards' data trade devices; an uneven shard's padding moves to its
    front), the committed programs must report mismatches."""
    programs = [p for p in load_examples() if len(p["mesh"]["devices"]) == spmd.backend.devices]
    if not programs:
        pytest.skip(f"no committed program for {spmd.backend.devices} devices")
    verdicts = runner.check_programs(spmd, programs, fault=fault, batch=len(programs))
    caught = [v for v in verdicts if v["status"] == "mismatch"]
    assert caught, f"no committed program noticed the fault {fault}: the differential oracle has lost its teeth"
    print(f"fault {fault}: {len(caught)} of {len(programs)} programs mismatched; first:\n{caught[0]['detail'][:600]}")
