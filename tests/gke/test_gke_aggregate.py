"""Aggregation: missing hosts, case failures, cross-host sharding agreement, JUnit and summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.gke import aggregate as agg
from harness.gke.hostreport import HostReport
from harness.records.results import CaseRecord

pytestmark = pytest.mark.selftest

CASE = "cases/test_fsdp.py::test_wrap[func-on]"


def host(s: int, h: int, shardings: dict[str, str] | None = None, outcome: str = "passed") -> HostReport:
    record = CaseRecord(
        nodeid=CASE,
        family="fsdp",
        outcome=outcome,
        shardings=shardings or {},
        torch_xla="2.9.0",
        reason="boom" if outcome == "failed" else "",
    )
    return HostReport(slice_id=s, host_id=h, pod=f"p-{s}-{h}", exit_code=0, records=[record])


def test_all_agree_passes() -> None:
    reports = [host(s, h, {"w": "{devices=[4,1]0,1,2,3}"}) for s in range(2) for h in range(2)]
    result = agg.aggregate(reports, 2, 2)
    assert result.ok, result.failures


def test_disagreement_names_case_tensor_hosts_and_both_shardings() -> None:
    reports = [
        host(0, 0, {"w": "{devices=[4,1]0,1,2,3}"}),
        host(0, 1, {"w": "{devices=[4,1]0,1,2,3}"}),
        host(1, 0, {"w": "{replicated}"}),
        host(1, 1, {"w": "{devices=[4,1]0,1,2,3}"}),
    ]
    result = agg.aggregate(reports, 2, 2)
    assert not result.ok
    [line] = result.failures
    assert CASE in line and "'w'" in line
    assert "slice0.host0, slice0.host1, slice1.host1 saw '{devices=[4,1]0,1,2,3}'" in line
    assert "slice1.host0 saw '{replicated}'" in line


def test_iota_and_explicit_device_lists_agree() -> None:
    reports = [host(0, 0, {"w": "{devices=[4,1]<=[4]}"}), host(1, 0, {"w": "{devices=[4,1]0,1,2,3}"})]
    assert agg.aggregate(reports, 2, 1).disagreements == []


def test_unparseable_sharding_text_is_compared_as_text() -> None:
    reports = [host(0, 0, {"w": "not a sharding"}), host(1, 0, {"w": "not  a sharding"}), host(2, 0, {"w": "other"})]
    [d] = agg.aggregate(reports, 3, 1).disagreements
    assert d.variants == [("not a sharding", ["slice0.host0", "slice1.host0"]), ("other", ["slice2.host0"])]


def test_tensor_missing_on_one_host_is_not_a_disagreement() -> None:
    reports = [host(0, 0, {"w": "{replicated}"}), host(1, 0, {})]
    assert agg.aggregate(reports, 2, 1).disagreements == []


def test_missing_host_and_failed_case_are_failures() -> None:
    result = agg.aggregate([host(0, 0, outcome="failed")], 2, 1)
    assert any("slice1.host0" in f and "no pod or report" in f for f in result.failures)
    assert any("slice0.host0" in f and CASE in f and "boom" in f for f in result.failures)


def test_mixed_torch_xla_versions_fail_the_run() -> None:
    other = host(1, 0)
    other.records[0].torch_xla = "2.8.0"
    assert any("different torch_xla" in f for f in agg.aggregate([host(0, 0), other], 2, 1).failures)


def test_outputs_carry_slice_and_host(tmp_path: Path) -> None:
    reports = [host(0, 0, {"w": "a"}), host(1, 0, {"w": "b"})]
    reports[1].error = "suite died of SIGABRT"
    result = agg.aggregate(reports, 2, 1)
    agg.write_all(result, tmp_path, {"mode": "test"})
    root = ET.parse(tmp_path / "junit.xml").getroot()
    names = {(c.get("classname"), c.get("name")) for c in root.iter("testcase")}
    assert ("slice1.host0.cases.test_fsdp", "test_wrap[func-on]") in names
    assert ("slice1.host0", "host-report") in names
    assert int(root.get("failures")) == 2  # the host and the sharding agreement
    summary = (tmp_path / "summary.md").read_text()
    assert "FAILED" in summary and "SIGABRT" in summary and "sharded differently" in summary
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["ok"] is False and len(data["hosts"]) == 2


def test_changes_against_the_baseline_that_hosts_reported_are_summarised() -> None:
    reports = [host(s, h, {"w": "{devices=[4,1]0,1,2,3}"}) for s in range(2) for h in range(2)]
    reports[3].records[0].sharding_changes = ["block_output: new, {devices=[4,1]0,1,2,3} (not in the baseline)"]
    result = agg.aggregate(reports, 2, 2)
    assert result.ok  # reported, not failed: drift on the release line fails the case on its host
    summary = agg.summary_markdown(result, {})
    assert "## Sharding changes against the baseline, reported (1)" in summary
    assert f"slice1.host1: {CASE}: block_output: new" in summary


# -- cost signatures across hosts and against the baseline ------------------------------------------
def costed(s: int, h: int, all_gather: int, changes: list[str] | None = None) -> HostReport:
    from harness import costs
    from tests.test_costs import signature

    report = host(s, h)
    report.records[0].costs = {"train": costs.comparable(signature(all_gather=all_gather))}
    report.records[0].cost_changes = changes or []
    return report


def test_a_host_whose_step_gathers_more_is_a_cost_disagreement_naming_hosts_and_the_item() -> None:
    result = agg.aggregate([costed(0, 0, 3), costed(0, 1, 3), costed(1, 0, 5), costed(1, 1, 3)], 2, 2)
    assert not result.ok
    [line] = result.failures
    assert line == (
        f"{CASE}: cost signature of 'train' differs across hosts: slice1.host0 against "
        "slice0.host0, slice0.host1, slice1.host1: step0: all-gather 3 -> 5 (+64 KiB per device)"
    )
    junit = ET.tostring(agg.junit_xml(result), encoding="unicode")
    assert 'name="cost-agreement"' in junit and "1 cost disagreement(s)" in junit
    assert agg.to_json(result, {})["cost_disagreements"][0]["hosts"][1] == ["slice1.host0"]


def test_agreeing_costs_pass_and_reported_baseline_changes_are_listed_per_host() -> None:
    line = "step0: all-reduce 2 -> 3 (+100 B per device)"
    result = agg.aggregate([costed(0, 0, 3, [line]), costed(1, 0, 3, [line])], 2, 1)
    assert result.ok, result.failures
    summary = agg.summary_markdown(result, {})
    assert "## Cost changes against the baseline, reported (2)" in summary
    assert f"- slice1.host0: {CASE}: {line}" in summary
