"""The cost baseline and the steady-state rule (harness.judges.costcheck) through real pytest runs.

Fake-backend bodies record the signature the test asks for, as harness.stepcosts would in a
torch_xla child; the fake child claims the torch_xla version in HARNESS_FAKE_TORCH_XLA.
"""

from __future__ import annotations

import json

import pytest

from tests.test_baseline import lit
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

CASES = """
import json
import os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_trains(ctx, signature):
    ctx.record("harness:costs", {"train": signature})
    ctx.record("harness:cost-dumps", {"train/step0": "HloModule partitioned_step0"})

def test_train(spmd):
    spmd.run(body_trains, signature=json.loads(os.environ["CASE_SIGNATURE"]))
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)

    def run(recorded: dict, *args: str, version: str = "2.9.0") -> pytest.RunResult:
        monkeypatch.setenv("CASE_SIGNATURE", json.dumps(recorded))
        monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
        return pytester.runpytest_subprocess(
            "--spmd-backend=fake",
            "-p",
            "no:cacheprovider",
            "--spmd-costs-baseline=costs.json",
            "-rA",
            *args,
            timeout=120,
        )

    return run


def record_of(pytester) -> dict:
    return json.loads((pytester.path / "results" / "latest" / "verdicts-main.jsonl").read_text().splitlines()[0])


def test_update_writes_the_signature_and_a_run_that_agrees_passes_without_keeping_dumps(suite, pytester):
    result = suite(signature(), "--spmd-update-costs")
    result.stdout.fnmatch_lines(["*cost baseline*costs.json rewritten for 1 case(s)*", "*train: new, 3 steps*"])
    data = json.loads((pytester.path / "costs.json").read_text())
    assert data["torch_xla"] == "2.9.0" and list(data["cases"]) == ["test_cases.py::test_train"]
    suite(signature()).assert_outcomes(passed=1)
    assert record_of(pytester)["costs"]["train"]["graphs"]["step0"]["collectives"][0]["count"] == 3
    assert not (pytester.path / "results" / "latest" / "costs").exists(), "a passing case keeps no dumps"


def test_more_collectives_fail_on_the_release_line_one_line_per_item_and_the_dump_is_kept(suite, pytester):
    suite(signature(), "--spmd-update-costs")
    result = suite(signature(all_gather=5), version="2.9.1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*cost drift: 1 item(s) differ from costs.json (taken on torch_xla 2.9.0; this run: 2.9.1)*",
            "*step0: all-gather 3 -> 5 (+64 KiB per device)*",
            "*--spmd-update-costs*",
        ]
    )
    assert record_of(pytester)["cost_changes"] == ["step0: all-gather 3 -> 5 (+64 KiB per device)"]
    kept = list((pytester.path / "results" / "latest" / "costs").iterdir())
    assert [p.name for p in kept] == ["test_cases.py_test_train__train_step0.after_optimizations.txt"]


def test_on_the_release_line_bytes_within_the_band_and_improvements_are_listed_growth_beyond_fails(suite, pytester):
    suite(signature(live=[4, 6, 6], temp=181555), "--spmd-update-costs")
    nearly = signature(live=[4, 6, 6], temp=181555)
    nearly["graphs"]["step0"]["memory"]["peak"] += 16
    result = suite(nearly)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*cost byte moves within the band (+5% and +1 KiB) or improvements (listed, not failed)*",
            "*step0: peak 185.3 KiB -> 185.3 KiB (+16 B) per device [[]within the band, listed[]]",
        ]
    )
    suite(signature(live=[4, 6, 6], temp=97382)).stdout.fnmatch_lines(
        ["*step0: temp 177.3 KiB -> 95.1 KiB per device, peak * [[]improvement, listed[]]"]
    )
    grown = suite(signature(live=[4, 6, 6], temp=2 * 181555))
    grown.assert_outcomes(failed=1)
    grown.stdout.fnmatch_lines(
        ["*cost drift: 1 item(s) differ*", "*step0: temp 177.3 KiB -> 354.6 KiB per device, peak*"]
    )
    # A live tensor more is a count: it fails whatever its bytes.
    suite(signature(live=[4, 6, 7], temp=181555)).assert_outcomes(failed=1)


def test_on_another_release_line_the_change_is_reported(suite):
    suite(signature(), "--spmd-update-costs")
    result = suite(signature(all_reduce=3), version="2.8.0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*cost changes (reported, not failed: torch_xla 2.8.0 is not on 2.9.0's release line)*",
            "*step0: all-reduce 2 -> 3 (+100 B per device)*",
        ]
    )


def test_a_step_that_compiles_after_the_warmup_fails_whatever_the_baseline(suite, pytester):
    late = signature(steps=((1, 0), (0, 1), (1, 0)))
    late["steps"][2]["differs"] = ["parameter(3): f32[8] '' -> f32[8] {replicated}"]
    result = suite(late)  # no baseline at all
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*steady state*",
            "*"
            + lit(
                "step2 compiled 1 new graph(s) after the 2-step warm-up: parameter(3): f32[8] '' -> f32[8] {replicated}"
            ),
        ]
    )
    suite(signature(), "--spmd-update-costs")
    suite(late, version="2.8.0").assert_outcomes(failed=1)  # another release line: still failed


def test_a_cost_drift_beside_a_failure_found_first_fails_as_the_cost_check_not_reported_only(suite, pytester):
    """On the release line a case another check failed first (here its steady state; a sharding
    drift alike) fails on its cost drift too: shown as the cost check beside the failure, which
    its FAILED line and the findings read, never "reported, not failed: the case failed already"
    (a step graph split by a sync per block was listed so beside its renumbered parameters' drift)."""
    suite(signature(), "--spmd-update-costs")
    late = signature(all_gather=5, steps=((1, 0), (0, 1), (1, 0)))
    late["steps"][2]["differs"] = ["parameter(3): f32[8] '' -> f32[8] {replicated}"]
    result = suite(late)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*steady state: *step2 compiled 1 new graph(s) after the 2-step warm-up*",
            "*- cost check -*",
            "cost drift: 2 item(s) differ from costs.json (taken on torch_xla 2.9.0; this run: 2.9.0):",
            "*step0: all-gather 3 -> 5 (+64 KiB per device)*",
        ]
    )
    assert "reported, not failed" not in result.stdout.str()


@pytest.mark.parametrize(
    "content, named",
    [
        ("{not json", "is not valid JSON"),
        (json.dumps({"backend": "cpu", "devices": 4, "cases": {}}), "was taken on backend 'cpu' with 4 devices"),
        (
            json.dumps({"backend": "fake", "devices": 4, "cases": {"x": {"train": {"steps": 3}}}}),
            "case 'x', loop 'train': steps is the number 3",
        ),
    ],
)
def test_a_damaged_baseline_is_a_usage_error_naming_it(suite, pytester, content, named):
    (pytester.path / "costs.json").write_text(content)
    result = suite(signature())
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*cost baseline*costs.json*{named}*"])


def test_a_damaged_signature_from_a_child_fails_the_case_naming_the_field(suite):
    damaged = signature()
    damaged["steps"][0]["compiles"] = "one"
    result = suite(damaged)
    result.assert_outcomes(failed=1)
    # Checked as the verdict arrives (harness.isolation.parent.observations), before anything reads it.
    result.stdout.fnmatch_lines(
        [
            "*protocol failure*its 'harness:costs' record is not as the harness writes it*step0: compiles is the string 'one'*"
        ]
    )


def test_update_refuses_xdist(suite):
    result = suite(signature(), "--spmd-update-costs", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-update-costs writes one file: run it without -n*"])


def test_a_cost_measured_loop_refuses_a_child_that_ran_other_bodies():
    """Graphs an earlier case compiled in a warm child are served from its cache: step 0 would
    compile nothing and the signature would depend on case order (serial vs -n 2)."""
    from types import SimpleNamespace

    from harness import stepcosts
    from harness.errors import HarnessUsageError

    with pytest.raises(HarnessUsageError, match="needs a child of its own.*pass fresh=True"):
        stepcosts.StepMeter(SimpleNamespace(bodies_before=2, values={}))
