"""benchmarks/time_to_verdict.py --target-only: what it prints for runs that recorded no case or
left a damaged record (its measurements are stood in for; nothing here runs torch_xla)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.records.results import CaseRecord, write_record

pytestmark = pytest.mark.selftest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_verdict.py"


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("time_to_verdict", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured(bench, runs: list[tuple[float, list[CaseRecord], str]], results_dir: Path, one_wall: float):
    """measure() as the runs went, in turn: the -n 2 run writes its records (and any raw line),
    the bare process takes one_wall seconds."""
    queue = list(runs)

    def measure(label: str, argv: list[str], folder: Path | None):
        m = bench.Measurement(label)
        if folder is None:
            m.wall = one_wall
            return m
        wall, records, raw = queue.pop(0)
        for path in folder.glob("*.jsonl"):
            path.unlink()
        folder.mkdir(exist_ok=True)
        for record in records:
            write_record(folder, record, "gw0")
        if raw:
            with (folder / "verdicts-gw1.jsonl").open("a") as fh:
                fh.write(raw)
        m.wall, m.cases = wall, len(records)
        m.exit_code = 0 if records else 5
        return m

    return measure


def case(name: str, body_s: float) -> CaseRecord:
    return CaseRecord(nodeid=f"cases/test_x.py::{name}", family="x", outcome="passed", body_s=body_s)


def test_a_run_that_recorded_no_case_is_not_counted_and_the_next_shows_its_floor(bench, tmp_path, monkeypatch, capsys):
    runs = [(1.0, [], ""), (12.0, [case("a", 8.0), case("b", 4.0)], "")]
    monkeypatch.setattr(bench, "measure", measured(bench, runs, tmp_path / "n2", one_wall=6.0))
    assert bench.target_only((["pytest"], tmp_path / "n2"), (["python"], None), repeat=2) == 0
    out = capsys.readouterr().out
    assert "run 1/2: -n 2 forked 1.0s (0 cases, exit 5), one bare process 6.0s: not counted" in out, out
    # 12 s over (8 + 4) / 2 + 6
    assert "run 2/2: -n 2 forked 12.0s (2 cases, exit 0), one bare process 6.0s: 2.00x; 1.00x its floor" in out, out
    assert "-n 2 forked = 2.00 x one bare torch_xla process (median of 1;" in out, out


def test_no_run_with_a_case_gives_no_ratio(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "measure", measured(bench, [(0.5, [], "")], tmp_path / "n2", one_wall=6.0))
    assert bench.target_only((["pytest"], tmp_path / "n2"), (["python"], None), repeat=1) == 1
    out = capsys.readouterr().out
    assert "no run of 1 recorded a case: no ratio" in out and " x one bare" not in out, out


def test_a_damaged_record_leaves_the_ratio_and_says_why_there_is_no_floor(bench, tmp_path, monkeypatch, capsys):
    runs = [(12.0, [case("a", 8.0)], '{"nodeid": "cut mid-wr')]
    monkeypatch.setattr(bench, "measure", measured(bench, runs, tmp_path / "n2", one_wall=6.0))
    assert bench.target_only((["pytest"], tmp_path / "n2"), (["python"], None), repeat=1) == 0
    out = capsys.readouterr().out
    assert "2.00x; no floor: 1 damaged record line(s) (verdicts-gw1.jsonl:1)" in out, out
    assert "x its floor" not in out, out
