"""The judge contract under xdist (harness.judges.judging): the workers judge, the controller prints.
Whatever a judge prints at the end of the run comes from what it collected off the cases' reports,
so a run under `-n 2` ends with the same sections as the same run without xdist.

Seen broken before: the sharding and cost judges kept "cases without a baseline entry" in the
worker that judged the case, and the controller printed its own, empty list: the section never
showed under `-n`.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_fake
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

CASES = """
import json
import os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_shards(ctx):
    ctx.record_sharding("w", "{devices=[4,1]0,1,2,3}")

def body_trains(ctx, signature):
    ctx.record("harness:costs", {"train": signature})

def test_shards(spmd):
    spmd.run(body_shards)

def test_shards_more(spmd):
    spmd.run(body_shards)

def test_trains(spmd):
    spmd.run(body_trains, signature=json.loads(os.environ["CASE_SIGNATURE"]))
"""
BASELINES = ("--spmd-shardings-baseline=shardings.json", "--spmd-costs-baseline=costs.json")
# The end-of-run sections the judges print (harness.judges.baselinestate.BaselineCheck.summarise,
# harness.judges.basecheck.summarise), and the closing line of what was checked.
JUDGES_SECTIONS = re.compile(r"^=+ (cases without a \w+ baseline entry|compared with the base run)")


def judges_output(stdout: str) -> dict[str, list[str]]:
    """Each judge's section at the end of the run: its title and its lines, sorted (xdist runs the
    cases in another order), and the `spmd checked:` line."""
    found: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in stdout.splitlines():
        title = JUDGES_SECTIONS.match(line)
        if title:
            lines = found.setdefault(title[1], [])
        elif line.startswith("spmd checked:"):
            found["spmd checked"], lines = [line], None
        elif line.startswith("="):
            lines = None
        elif lines is not None and line.strip():
            lines.append(line)
    return {title: sorted(lines) for title, lines in found.items()}


@pytest.fixture
def baselines_without_entries(pytester, monkeypatch):
    """Both baseline files, taken by an update run, then emptied: no case has an entry."""
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("CASE_SIGNATURE", json.dumps(signature()))
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    taken = run_fake(pytester, *BASELINES, "--spmd-update-shardings", "--spmd-update-costs")
    taken.assert_outcomes(passed=3)
    for name in ("shardings.json", "costs.json"):
        data = json.loads((pytester.path / name).read_text())
        data["cases"] = {}
        (pytester.path / name).write_text(json.dumps(data))


def test_the_judges_end_a_run_under_xdist_as_they_end_it_serially(pytester, baselines_without_entries):
    serial = run_fake(pytester, *BASELINES, "--spmd-results-dir=serial")
    serial.assert_outcomes(passed=3)
    shown = judges_output(serial.stdout.str())
    assert set(shown) == {
        "cases without a sharding baseline entry",
        "cases without a cost baseline entry",
        "spmd checked",
    }, serial.stdout.str()
    assert "test_cases.py::test_trains" in shown["cases without a cost baseline entry"]
    assert "test_cases.py::test_shards_more" in shown["cases without a sharding baseline entry"]
    distributed = run_fake(pytester, *BASELINES, "--spmd-results-dir=xdist", "-n", "2")
    distributed.assert_outcomes(passed=3)
    assert judges_output(distributed.stdout.str()) == shown, "under -n 2 the judges end the run otherwise"


def test_the_base_runs_comparison_is_the_same_under_xdist(pytester, baselines_without_entries, monkeypatch):
    run_fake(pytester, *BASELINES, "--spmd-results-dir=base").assert_outcomes(passed=3)
    monkeypatch.setenv("CASE_SIGNATURE", json.dumps(signature(all_gather=5)))
    serial = run_fake(pytester, *BASELINES, "--spmd-results-dir=serial", "--spmd-compare=base")
    serial.assert_outcomes(passed=2, failed=1)
    shown = judges_output(serial.stdout.str())
    assert any("all-gather 3 -> 5" in line for line in shown["compared with the base run"]), serial.stdout.str()
    assert shown["spmd checked"][0].endswith("3 held to the base run"), shown
    distributed = run_fake(pytester, *BASELINES, "--spmd-results-dir=xdist", "--spmd-compare=base", "-n", "2")
    distributed.assert_outcomes(passed=2, failed=1)
    assert judges_output(distributed.stdout.str()) == shown, "under -n 2 the comparison ends otherwise"
