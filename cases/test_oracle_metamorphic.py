"""Metamorphic oracle: shardings that must be equivalent give equal numbers, equal compile counts
and equal collectives (harness.oracles.metamorphic names the relations).

- PR tier: three committed programs (cases/oracle_programs.json) per device count that split an
  input, one of them on a permuted 2-D mesh; every relation that applies to each, each side in a
  child of its own (about 21 children, 25 s). Programs 3 and 6 were left out: with
  functionalization off, torch_xla 2.4.0 and 2.6.0 fail `.cpu()` of their output (a no-op
  transpose, x.transpose(1, 1)) with "Check failed: xtensor" in _to_copy; 2.9.0 does not.
- Nightly tier: hypothesis draws programs for --spmd-fuzz-budget seconds and checks every relation;
  a difference a carried registry entry explains (its signature, or its class in
  harness.oracles.knownclasses) is counted and passed over, as the differential search does.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from cases.test_oracle_differential import load_examples
from harness.oracles import metamorphic, runner, search
from harness.oracles.body import body_measure_program

pytestmark = pytest.mark.spmd

# Positions in cases/oracle_programs.json, per device count.
PR_PROGRAMS = {4: (0, 1, 15), 8: (36, 38, 43)}


def pr_programs(devices: int) -> list[dict[str, Any]]:
    examples = load_examples()
    return [examples[i] for i in PR_PROGRAMS.get(devices, ())]


def fault_program(devices: int) -> dict[str, Any]:
    """A program whose collectives depend on which device holds which tile: its input is split
    over both axes of a 2-D mesh with a permuted device order, then summed over the dim split
    by "x" (an all-reduce among the devices that share a "y" coordinate)."""
    order = [(3 * i + 1) % devices for i in range(devices)] if devices % 3 else list(range(devices))[::-1]
    return {
        "mesh": {"shape": [2, devices // 2], "axes": ["x", "y"], "devices": order},
        "inputs": [{"shape": [8, 8], "seed": 0, "spec": ["x", "y"]}],
        "ops": [{"op": "reduce", "fn": "sum", "x": 0, "dim": 0, "keepdim": False}],
        "outputs": [1],
    }


class Measurer:
    """Each program measured once per functionalization mode, in a child of its own."""

    def __init__(self, spmd: Any, fault: str | None = None) -> None:
        self.spmd, self.fault, self.seen = spmd, fault, {}

    def __call__(self, program: dict[str, Any], functionalization: bool = True) -> dict[str, Any]:
        key = (json.dumps(program, sort_keys=True), functionalization)
        if key not in self.seen:
            result = self.spmd.run(
                body_measure_program,
                program=program,
                fault=self.fault,
                functionalization=functionalization,
                check=False,
            )
            if result.outcome == "ok":
                self.seen[key] = result.values["measure"]
            elif result.outcome == "error":  # the body itself raised: the oracle's bug, not a verdict
                result.raise_for_outcome()
            else:  # the program killed its child (a crash, a timeout): charged to the program
                self.seen[key] = runner.crash_verdict(result)
        return self.seen[key]


# A relation's failure on a program -> the registry entry that explains it, or None.
Explained = Callable[[str, dict[str, Any], str], str | None]


def relation_failures(
    measure: Measurer, program: dict[str, Any], relations: list[str], explained: Explained | None = None
) -> list[str]:
    """What breaks each relation on the program, less what `explained` says a known bug is."""
    failures = []
    for name in relations:
        pair = metamorphic.RELATIONS[name](program)
        if pair is None:
            continue
        ref = measure(pair[0])
        var = measure(pair[1], functionalization=name != "functionalization")
        for difference in metamorphic.differences(ref, var, metamorphic.costs_compared(name, pair[0])):
            if explained is not None and explained(name, pair[0], f"{name}: {difference}"):
                continue
            failures.append(f"{name}: {difference}\n  program: {json.dumps(pair[0])}\n  variant: {json.dumps(pair[1])}")
    return failures


def registry_explains(spmd: Any, entries: list[Any], counts: dict[str, int]) -> Explained:
    """The known bug a relation's failure is (search.known_bugs: by its signature, or by its class
    holding the relation once the condition is taken away), counted in `counts`."""

    def explained(relation: str, program: dict[str, Any], failure: str) -> str | None:
        def holds(variant: dict[str, Any]) -> bool:
            return not relation_failures(Measurer(spmd), variant, [relation])

        entry = search.known_bugs(spmd, entries, holds)(program, {"status": "metamorphic", "detail": failure})
        if entry is not None:
            counts[entry] = counts.get(entry, 0) + 1
        return entry

    return explained


def test_equivalent_shardings_agree(spmd) -> None:
    programs = pr_programs(spmd.backend.devices)
    if not programs:
        pytest.skip(f"no committed program that splits an input on {spmd.backend.devices} devices")
    measure = Measurer(spmd)
    failures = [f for p in programs for f in relation_failures(measure, p, list(metamorphic.RELATIONS))]
    print(f"metamorphic: {len(programs)} programs, {len(measure.seen)} children")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(("fault", "relation"), [("mesh-order", "transposed-mesh"), ("replicated-tiled", "replicated")])
def test_metamorphic_oracle_fails_on_injected_fault(spmd, fault, relation) -> None:
    """With torch_xla broken in the child (harness.oracles.faults), the relation must report it."""
    programs = [*pr_programs(spmd.backend.devices), fault_program(spmd.backend.devices)]
    failures = [f for p in programs for f in relation_failures(Measurer(spmd, fault), p, [relation])]
    assert failures, f"no program noticed the fault {fault} through the relation {relation}"
    print(f"fault {fault}: {len(failures)} of {len(programs)} programs differ; first:\n{failures[0][:800]}")


@pytest.mark.nightly
def test_drawn_programs_keep_equivalences(spmd, request) -> None:
    """Programs drawn by harness.oracles.generate until --spmd-fuzz-budget seconds are spent."""
    from hypothesis.errors import NonInteractiveExampleWarning

    from harness.oracles import generate

    deadline = time.monotonic() + search.budget(request.config)
    measure, failures, checked, known = Measurer(spmd), [], 0, {}
    entries = search.registry_entries(request.config)
    explained = registry_explains(spmd, entries, known)
    # the reruns pass over the same known bugs (uncounted): only the difference reported may repeat
    explained_again = registry_explains(spmd, entries, {})
    strategy = generate.programs(spmd.backend.devices)
    while time.monotonic() < deadline:
        with warnings.catch_warnings():  # a draw outside @given is what this loop wants: no shrinking here
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            program = strategy.example()
        failed = relation_failures(measure, program, list(metamorphic.RELATIONS), explained)
        if failed:  # rerun in new children, as the differential search does, before it is reported
            relations = sorted({failure.split(":", 1)[0] for failure in failed})
            again = [
                "differs" if relation_failures(Measurer(spmd), program, relations, explained_again) else "holds"
                for _ in range(2)
            ]
            note = "deterministic" if again == ["differs", "differs"] else "NOT deterministic"
            failures += [f"[{note}: reruns in new children: {', '.join(again)}] {failure}" for failure in failed]
        checked += 1
    passed_over = ", ".join(f"{entry} x{n}" for entry, n in sorted(known.items()))
    line = f"metamorphic search: {checked} programs, {len(failures)} differences" + (
        f"; known bugs passed over: {passed_over}" if passed_over else ""
    )
    print(line)
    assert not failures, line + "\n\n" + "\n\n".join(failures)
