"""harness.findings: failed cases grouped by the kind of figure that moved and its direction, with
the diagnoses the records allow (unit tests on plain data; tests/test_findings.py runs them end to end)."""

from __future__ import annotations

import pytest

from harness import costs, findings
from harness.findings import FailedCase

pytestmark = pytest.mark.selftest

PARAMETERS = 19176


def loop(outputs: int, executions: int = 1) -> dict:
    steps = [{"compiles": 1 if i == 0 else 0, "executions": executions} for i in range(5)]
    return {
        "warmup": 2,
        "steps": steps,
        "graphs": {"step0": {"memory": {"outputs": outputs, "temp": 9000, "peak": 60000}}},
        "memory": {"parameters": PARAMETERS},
    }


def donated(case: str) -> FailedCase:
    """Build A: outputs grew by the parameters' bytes; temp and peak went down beside it."""
    return FailedCase(
        case,
        ["step0: outputs 36.5 KiB -> 55.2 KiB per device", "step0: temp 8.8 KiB -> 4.1 KiB per device"],
        costs={"train": loop(37376 + PARAMETERS)},
        base_costs={"train": loop(37376)},
    )


def test_outputs_that_grew_by_the_parameters_bytes_are_one_finding_diagnosed_as_donation_lost():
    shown = findings.lines([donated(f"cases/test_{i}.py::test_loop") for i in range(12)], "--spmd-update-costs")
    assert shown[0] == "12 case(s): step graph outputs grew"
    assert "donation lost? in 12 of 12 loop(s) the outputs grew by the parameters' bytes" in shown[1]
    assert f"outputs +{PARAMETERS:,} B, parameters {PARAMETERS:,} B" in shown[1]
    assert any("not an improvement" in line for line in shown), shown
    assert shown[-1].startswith("if these changes are intended (and only then): --spmd-update-costs")
    assert sum(1 for line in shown if not line.startswith(" ")) == 2  # one finding, then the advice


def test_a_step_module_that_aliases_fewer_parameters_than_the_base_runs_is_named_as_donation_lost():
    case = donated("cases/test_a.py::test_loop")
    case.base_costs["train"]["graphs"]["step0"]["aliases"] = {"donated": 6, "parameters": 9}
    case.costs["train"]["graphs"]["step0"]["aliases"] = {"donated": 0, "parameters": 9}
    shown = findings.lines([case])
    assert shown[1].startswith(
        "  diagnosis: donation lost: the build's step module aliases 0 of 9 parameters (base: 6) "
        "(cases/test_a.py::test_loop train step0), in 1 of 1 compared step module(s); the outputs grew by the "
        "parameters' bytes"
    ), shown
    # the same aliasing on both sides: the bytes alone, with a question mark
    case.costs["train"]["graphs"]["step0"]["aliases"] = {"donated": 6, "parameters": 9}
    assert "donation lost? in 1 of 1 loop(s)" in findings.lines([case])[1]


@pytest.mark.parametrize(
    "aliases",
    [
        {"donated": 3, "parameters": 2},  # more donated than taken
        {"donated": -1, "parameters": 2},
        {"donated": 1, "parameters": 2, "module": "HloModule ..."},  # nothing else kept
        [1, 2],
    ],
)
def test_a_records_step_module_aliasing_is_checked_when_read_back(aliases):
    signature = loop(100)
    signature["graphs"]["step0"] |= {"collectives": [], "aliases": aliases}
    with pytest.raises(costs.CostReadError, match="aliases"):
        costs.check_signature(signature, "record")


def test_outputs_that_grew_by_other_bytes_are_not_called_donation():
    case = donated("c::t")
    case.costs = {"train": loop(37376 + 4000)}
    assert "donation" not in "\n".join(findings.lines([case]))


def test_a_split_step_leads_the_sharding_lines_it_renumbers():
    split = FailedCase(
        "cases/test_vit.py::test_train",
        ["sharding drift: 80 tensor(s) differ", "step2: compiles 1 -> 4, executions 1 -> 4"],
        costs={"train": loop(100, executions=4)},
        base_costs={"train": loop(100)},
    )
    shown = findings.lines([split, split])
    assert shown[0] == "2 case(s): compilations per step grew"
    assert "the step graph split" in shown[1] and "executions per step 1 -> 4" in shown[2]


def test_native_growth_at_one_rate_in_every_loop_is_one_leak_per_call():
    leak = "steady state: step2..step4 each left more alive than the step before: native heap (malloc in use) +256 KiB per step"
    shown = findings.lines([FailedCase("a::t", [leak]), FailedCase("b::t", [leak])])
    assert shown[0] == "2 case(s): native memory per step grew"
    assert "+256.0 KiB per step across 2 loop(s): about the same amount in every loop" in shown[1]


def test_native_growth_that_scales_with_an_spmd_apis_calls_is_said_per_call():
    def leak(case: str, kib: int, calls: int) -> FailedCase:
        item = f"steady state: step2..step5 each left more alive than the step before: native heap (malloc in use) +{kib} KiB per step"
        signature = loop(100) | {"spmd_calls": {"mark_sharding": calls, "clear_sharding": 1}}
        return FailedCase(case, [item], costs={"train": signature})

    shown = findings.lines([leak("a::t", 257, 1), leak("b::t", 1027, 4)])
    assert shown[1] == (
        "  diagnosis: native memory kept on every step, +257.0 KiB to +1.0 MiB per step across 2 loop(s), "
        "1 to 4 mark_sharding calls per step: ~256.9 KiB per call"
    ), shown
    # calls that do not scale with the growth explain nothing
    assert "per call" not in findings.lines([leak("a::t", 257, 1), leak("b::t", 1027, 1)])[1]


def test_build_bs_leak_is_said_per_call_though_some_loops_drift_besides():
    # `scripts/run-with-fault.sh mark-sharding-leaks-native -m spmd -n 2` on 2.9.0 (KiB per step,
    # mark_sharding calls per step): the training job's loops add their own +30 KiB of drift
    measured = [(270.5, 1), (266.1, 1), (280.4, 1), (531.4, 2), (1024, 4), (2355, 9), (272.1, 1), (600.4, 2)]
    measured += [(534.9, 2), (310, 1), (310.9, 1), (314.6, 1), (1024, 4), (269.4, 1)]

    def leak(case: str, kib: float, calls: int) -> FailedCase:
        item = f"steady state: step2..step4 each left more alive than the step before: native heap (malloc in use) +{kib} KiB per step"
        return FailedCase(case, [item], costs={"train": loop(100) | {"spmd_calls": {"mark_sharding": calls}}})

    cases = [leak(f"c{i}::t", kib, calls) for i, (kib, calls) in enumerate(measured)]
    shown = findings.lines(cases)
    assert "1 to 9 mark_sharding calls per step: ~2" in shown[1] and " KiB per call" in shown[1], shown
    # a loop that grows for another reason is left out of the amount, and the line says how many fit
    odd = leak("odd::t", 900, 1)
    assert "per call (in 14 of 15 loops)" in findings.lines([*cases, odd])[1]


def test_a_decrease_beside_a_growth_is_not_labelled_an_improvement():
    changes = [
        costs.CostChange("step0", "outputs 36.5 KiB -> 55.2 KiB per device"),
        costs.CostChange("step0", "peak 70 KiB -> 60 KiB per device", costs.IMPROVEMENT),
    ]
    relabelled = findings.no_improvement_beside_growth(changes)
    assert "improvement" not in str(relabelled[1]).replace("not an improvement", "") and not relabelled[1].fails
    alone = [costs.CostChange("step0", "peak 70 KiB -> 60 KiB per device", costs.IMPROVEMENT)]
    assert findings.no_improvement_beside_growth(alone) == alone


@pytest.mark.parametrize(
    "words",
    [
        "RuntimeError: outputs 1.2.3 KiB -> 5 KiB",
        "compiles . B -> 1 B",
        "native heap (malloc in use) +1.2.3 KiB per step",
    ],
)
def test_a_cases_own_words_that_look_like_figures_do_not_break_the_findings(words):
    # a case's exception message is untrusted: "1.2.3 KiB" crashed the findings section (an attack)
    shown = findings.lines([FailedCase("a::t", [words]), FailedCase("b::t", [words])])
    assert shown[0].startswith("2 case(s): "), shown


def test_the_nightly_stack_judges_line_leads_as_native_memory_not_its_footer():
    stack = "native stack holding more blocks after each of step12..step15 (memray): +5 KiB per step in 80 blocks at f"
    footer = "(steady state: a step after the warm-up that compiled a new graph pays a compilation every step; one that left more alive than the step before leaks every step)"
    assert findings.cause_of(FailedCase("a::t", [stack, footer])) == ("native memory per step", "grew")
