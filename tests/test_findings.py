"""One change, one finding (black-box runs on the fake backend, the fixtures of
tests/test_basecompare.py): the failed cases are grouped by what failed them at the end of the run,
a step graph's renumbered parameters are matched by their shardings rather than failed or listed
one by one, and what failed comes before what is only listed."""

from __future__ import annotations

import json

import pytest

from tests import test_basecompare
from tests.test_basecompare import BASE_BUILD, TILED
from tests.test_baseline import lit
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

suite = test_basecompare.suite  # the fixture: a case file run as the base build, then as the PR's

REPLICATED = "{replicated}"
COLUMNS = "{devices=[1,4]0,1,2,3}"


def test_one_change_in_two_cases_is_one_finding_at_the_end(suite, monkeypatch):
    suite(version=BASE_BUILD, results="base")
    monkeypatch.setenv("STEADY_SIGNATURE", json.dumps(signature(all_gather=5)))
    result = suite("--spmd-compare=base", costs=signature(all_gather=5))
    result.assert_outcomes(failed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*spmd findings: 2 failed case(s), 1 finding(s) by cause*",
            "2 case(s): collectives grew",
            "  e.g. test_cases.py::test_block: " + lit("step0: all-gather 3 -> 5 (+64 KiB per device)"),
            "  cases: test_cases.py::test_block, test_cases.py::test_steady",
            "if these changes are intended (and only then): *",
            "*short test summary info*",
        ]
    )


def test_renumbered_graph_parameters_are_matched_by_their_shardings(suite):
    base = {"step0:parameter(0)": TILED, "step0:parameter(1)": REPLICATED, "step0:parameter(2)": TILED}
    suite(version=BASE_BUILD, results="base", shardings=base)
    # The graph takes one parameter more, first: every number moves by one.
    renumbered = {"step0:parameter(0)": COLUMNS, "step0:parameter(1)": TILED}
    renumbered |= {"step0:parameter(2)": REPLICATED, "step0:parameter(3)": TILED}
    result = suite("--spmd-compare=base", shardings=renumbered)
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*new in this build (listed, not failed): test_cases.py::test_block: "
            + lit(f"step0: graph parameters 3 -> 4 (matched by sharding, whatever their numbers): +1 x {COLUMNS}")
        ]
    )
    # A sharding the base's graph had that is gone fails the case, in one line.
    changed = {"step0:parameter(0)": COLUMNS, "step0:parameter(1)": REPLICATED, "step0:parameter(2)": TILED}
    failed = suite("--spmd-compare=base", shardings=changed)
    failed.assert_outcomes(failed=1, passed=1, xfailed=1)
    failed.stdout.fnmatch_lines(["*step0: graph parameters 3 -> 3 (*): -1 x " + lit(TILED) + ", +1 x " + lit(COLUMNS)])


def test_what_failed_comes_before_what_is_only_listed_and_many_new_items_are_counted(suite):
    suite(version=BASE_BUILD, results="base")
    many = {"blocks.0:output": TILED} | {f"extra.{i}": TILED for i in range(12)}
    result = suite("--spmd-compare=base", shardings=many, costs=signature(all_gather=5))
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 case(s) compared, 1 differ",  # the xfail too: its bug reproduced on both sides
            "differs: test_cases.py::test_block: *",
            "new in this build (listed, not failed): 12 item(s) the base run lacks, in 1 case(s)*",
        ]
    )
    assert "extra.3: new" not in result.stdout.str().split("compared with the base run", 2)[-1]


def test_the_run_closes_with_what_it_checked(suite):
    suite(version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base")
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "spmd checked: 3 case(s) ran; 1 known-bug registry entry judged (1 reproduced); "
            "0 held to the sharding baseline; 0 held to the cost baseline; 3 held to the base run",
            "*short test summary info*",
        ]
    )


def test_a_moved_multi_axis_sharding_fails_with_both_device_grids(suite):
    hsdp = "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    suite(version=BASE_BUILD, results="base", shardings={"blocks.0.weight": hsdp})
    moved = "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    result = suite("--spmd-compare=base", shardings={"blocks.0.weight": moved})
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*this build 2.10.0+git2222222: blocks.0.weight: *",
            "which device holds which tile:",
            "blocks.0.weight:",
            "    base * this build",
            "    dim 1 ->  [[]0[]]  [[]1[]] * dim 0 ->  [[]0[]]  [[]1[]]",
            "              0,2  1,3 *0,2  1,3",
        ]
    )


def test_failed_lines_lead_with_the_cause_within_120_columns_and_80_on_an_80_column_terminal(suite):
    from types import SimpleNamespace

    from harness.judges import basecheck
    from harness.run.failedlines import cause_first

    suite(version=BASE_BUILD, results="base")
    drift = {f"blocks.{i}.weight": REPLICATED for i in range(40)}
    result = suite("--spmd-compare=base", shardings=drift, costs=signature(all_gather=5))
    failed = [line for line in result.stdout.lines if line.startswith("FAILED ")]
    assert failed and all(len(line) <= 120 for line in failed), failed
    # the collectives lead: the 40 sharding lines after them are counted, not shown
    assert any(line.startswith("FAILED test_cases.py::test_block - step0: all-gather 3 -> 5") for line in failed), (
        failed
    )
    # an 80-column terminal: the build names and the wrapper left out, the cause first, the line cut to fit
    differences = [f"blocks.{i}.weight: {TILED} -> {REPLICATED}" for i in range(3)] + ["step2: compiles 1 -> 4"]
    report = SimpleNamespace(
        nodeid="cases/test_vit.py::test_train[fsdpv2]",
        user_properties=[(basecheck.PROPERTY, json.dumps({"differences": differences}))],
        longrepr=None,
    )
    message = cause_first(report, "base 2.9.0 -> this build 2.9.0: " + differences[0], 80)  # type: ignore[arg-type]
    line = f"FAILED {report.nodeid} - {message}"
    assert line == "FAILED cases/test_vit.py::test_train[fsdpv2] - step2: compiles 1 -> 4 (+3 more)", line


def test_a_failed_line_leads_with_a_split_step_beside_the_drift_of_its_renumbered_parameters():
    from types import SimpleNamespace

    from harness.run.failedlines import cause_first

    drift = (
        "sharding drift: 42 tensor(s) differ from cpu-4.json (taken on torch_xla 2.9.0; this run: 2.9.0):\n"
        + "\n".join(f"  step0:parameter({i}): {TILED} -> {REPLICATED}" for i in range(14, 56))
    )
    report = SimpleNamespace(
        nodeid="cases/test_meshes.py::test_fsdpv2_vit_train_steps_match_cpu[fsdp]",
        user_properties=[],
        longrepr=None,
        sections=[("cost check", "train: step0: compiles 1 -> 3, executions 1 -> 3, step peak 151.9 KiB -> 171.3 KiB")],
    )
    message = cause_first(report, drift, 120)  # type: ignore[arg-type]
    assert message.startswith("train: step0: compiles 1 -> 3, exec"), message
    assert len(f"FAILED {report.nodeid} - {message}") <= 120


def test_a_failed_line_of_a_case_marked_with_another_known_bug_leads_with_its_own_cause():
    """The registry's word on a marked case that failed otherwise (on a release the entry does not
    name) is said whole above the summary; the FAILED line is the failure's own cause (it was
    `failed on torch_xla 2.9.0; not the si...` on an 80-column terminal)."""
    from types import SimpleNamespace

    from harness.run.failedlines import cause_first

    report = SimpleNamespace(
        nodeid="cases/test_training_job_checkpoint.py::test_a_resumed_job_is_the_uninterrupted_job[planners]",
        user_properties=[],
        longrepr=None,
        sections=[],
    )
    verdict = (
        "failed on torch_xla 2.9.0; not the signature of dcp-filesystem-writer-picks-torchax-device-module: "
        "AssertionError: the restore changed the sharding of 63 tensor(s): optimizer exp_avg of embed.weight"
    )
    message = cause_first(report, verdict, 240)  # type: ignore[arg-type]
    assert message.startswith("AssertionError: the restore changed the sharding of 63 tensor(s)"), message


def test_a_failed_line_of_a_case_with_a_very_long_id_still_shows_its_cause_within_120_columns():
    """A 129-character id (cases/test_costs.py's longest with its parameters) left no room: the
    line was 178 columns. Its middle is elided instead; both ends still find the case."""
    from types import SimpleNamespace

    from harness.run.failedlines import MIN_MESSAGE, cause_first, shown_id

    nodeid = "cases/test_costs.py::test_steady_state_detector_catches_a_host_object_kept_per_parameter_per_step[fsdpv2-func-off]"
    report = SimpleNamespace(nodeid=nodeid, user_properties=[], longrepr=None, sections=[])
    message = cause_first(report, "AssertionError: step2: XLA tensors 69 -> 72 per step", 120)  # type: ignore[arg-type]
    line = f"FAILED {shown_id(nodeid)} - {message}"
    assert len(line) <= 120, line
    assert message.startswith("AssertionError: step2: XLA tensors 69"), message
    assert len(message) >= MIN_MESSAGE, message
    shown = shown_id(nodeid)
    assert shown.startswith("cases/test_costs.py::test_steady") and shown.endswith("[fsdpv2-func-off]"), shown
    short = "cases/test_vit.py::test_train[fsdpv2]"
    assert shown_id(short) == short


def test_a_failed_line_of_a_case_whose_release_carries_its_bug_but_failed_otherwise_leads_with_its_own_cause():
    """The registry's other word on a marked case (`torch_xla 2.9.0 carries <entry>, but this
    failure matches none of its signatures (...): a new failure: <cause>`) is said whole above; the
    FAILED line and the findings group it by its cause (a sync per FSDPv2 block: it was a finding
    of its own beside two of the same RuntimeError)."""
    from types import SimpleNamespace

    from harness.run.failedlines import cause_first
    from harness.run.findings import finding_of

    verdict = (
        "torch_xla 2.9.0 carries spmd-save-planner-drops-partially-replicated-tensors, but this failure matches "
        'none of its signatures ("holds no data for \\d+ tensor\\(s\\)"): a new failure: RuntimeError: Check failed: '
        "tensor_data:"
    )
    report = SimpleNamespace(nodeid="cases/test_x.py::test_resume", user_properties=[], longrepr=verdict, sections=[])
    assert cause_first(report, verdict, 120).startswith("RuntimeError: Check failed: tensor_data:")  # type: ignore[arg-type]
    assert finding_of(report) == ("RuntimeError: Check failed: tensor_data:",)  # type: ignore[arg-type]
