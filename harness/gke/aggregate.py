"""Per-host reports -> one verdict: JUnit XML, Markdown summary, JSON, and the cross-host checks.

Used unchanged by the GKE launcher and by --local. Slice and host are part of every test id
(`slice1.host0.cases.test_x::test_y[...]` as classname + name), so a CI UI shows which host failed.
"""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness.gke.costagreement import CostDisagreement, compare_costs
from harness.gke.costagreement import baseline_changes as cost_baseline_changes
from harness.gke.hostreport import HostReport
from harness.judges import shardingcompare
from harness.records.results import CaseRecord
from harness.tiles import grids_side_by_side, is_multi_axis

FAILING_OUTCOMES = ("failed",)
JUNIT_NAME, SUMMARY_NAME, JSON_NAME = "junit.xml", "summary.md", "results.json"


@dataclasses.dataclass
class HostDisagreement:
    """One tensor of one case whose sharding differed between hosts."""

    nodeid: str
    tensor: str
    variants: list[tuple[str, list[str]]]  # (sharding text, hosts that saw it), most common first

    def describe(self) -> str:
        seen = "; ".join(f"{', '.join(hosts)} saw {text!r}" for text, hosts in self.variants)
        return f"{self.nodeid}: tensor {self.tensor!r} sharded differently across hosts: {seen}"

    def grids(self) -> list[str]:
        """The two most common layouts as device grids, when either is partially replicated or
        cut along several dimensions (their one-line texts differ only in a device list); else []."""
        (first, first_hosts), (second, second_hosts) = self.variants[:2]
        if not (is_multi_axis(first) or is_multi_axis(second)):
            return []
        return grids_side_by_side(first, second, (", ".join(first_hosts), ", ".join(second_hosts)))


@dataclasses.dataclass
class Aggregate:
    hosts: list[HostReport]
    disagreements: list[HostDisagreement]
    run_problems: list[str]  # e.g. timeout, JobSet Failed, torch_xla versions differ
    cost_disagreements: list[CostDisagreement] = dataclasses.field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        out = [f"{r.label} ({r.pod}): host failed: {r.error}" for r in self.hosts if r.error]
        out += [
            f"{r.label}: {c.nodeid} {c.outcome}: {c.reason}"
            for r in self.hosts
            for c in r.records
            if c.outcome in FAILING_OUTCOMES
        ]
        out += [d.describe() for d in self.disagreements]
        out += [d.describe() for d in self.cost_disagreements]
        return out + list(self.run_problems)

    @property
    def ok(self) -> bool:
        return not self.failures


def aggregate(
    reports: list[HostReport], slices: int, hosts_per_slice: int, run_problems: list[str] | None = None
) -> Aggregate:
    complete = _fill_missing(reports, slices, hosts_per_slice)
    problems = list(run_problems or []) + _version_problems(complete)
    return Aggregate(
        hosts=complete,
        disagreements=compare_shardings(complete),
        run_problems=problems,
        cost_disagreements=compare_costs(complete),
    )


def _fill_missing(reports: list[HostReport], slices: int, hosts_per_slice: int) -> list[HostReport]:
    """Every expected (slice, host) appears once; a host nobody heard from is a failed host."""
    by_place = {(r.slice_id, r.host_id): r for r in reports}
    out = [
        by_place.get((s, h)) or HostReport.failed(s, h, "", "no pod or report for this host")
        for s in range(slices)
        for h in range(hosts_per_slice)
    ]
    strays = [r for r in reports if (r.slice_id, r.host_id) not in {(o.slice_id, o.host_id) for o in out}]
    for stray in strays:  # a report from an unexpected place is itself a problem worth showing
        stray.error = stray.error or f"unexpected placement slice {stray.slice_id} host {stray.host_id}"
    return out + strays


def _version_problems(reports: list[HostReport]) -> list[str]:
    versions = {c.torch_xla for r in reports for c in r.records if c.torch_xla}
    if len(versions) > 1:
        return [f"hosts ran different torch_xla versions: {', '.join(sorted(versions))} (mixed images?)"]
    return []


def compare_shardings(reports: list[HostReport]) -> list[HostDisagreement]:
    """Same case, same tensor, different sharding on two hosts -> a HostDisagreement.

    Only hosts that recorded the tensor are compared: a case that failed early on one host is
    already a failure of its own and says nothing about sharding agreement.
    """
    seen: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for report in reports:
        for record in report.records:
            for tensor, text in record.shardings.items():
                seen.setdefault((record.nodeid, tensor), []).append((report.label, text))
    out = []
    for (nodeid, tensor), observations in sorted(seen.items()):
        variants = shardingcompare.group(observations)
        if len(variants) > 1:
            out.append(HostDisagreement(nodeid, tensor, variants))
    return out


def write_all(result: Aggregate, out_dir: Path, meta: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(junit_xml(result)).write(out_dir / JUNIT_NAME, encoding="utf-8", xml_declaration=True)
    (out_dir / SUMMARY_NAME).write_text(summary_markdown(result, meta), encoding="utf-8")
    (out_dir / JSON_NAME).write_text(json.dumps(to_json(result, meta), indent=1, sort_keys=True), encoding="utf-8")


def to_json(result: Aggregate, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "run": meta,
        "failures": result.failures,
        "hosts": [r.to_dict() for r in result.hosts],
        "sharding_disagreements": [dataclasses.asdict(d) for d in result.disagreements],
        "cost_disagreements": [dataclasses.asdict(d) for d in result.cost_disagreements],
    }


# -- JUnit ---------------------------------------------------------------------------------------
def junit_xml(result: Aggregate) -> ET.Element:
    root = ET.Element("testsuites", name="spmd-multislice")
    for report in result.hosts:
        _host_suite(root, report)
    _cross_host_suite(root, result)
    _count(root)
    return root


def _host_suite(root: ET.Element, report: HostReport) -> None:
    suite = ET.SubElement(root, "testsuite", name=report.label, time=f"{report.duration_s:.3f}")
    props = ET.SubElement(suite, "properties")
    for key in ("pod", "exit_code", "signal", "bucket"):
        value = getattr(report, key)
        ET.SubElement(props, "property", name=key, value="" if value is None else str(value))
    host_case = ET.SubElement(suite, "testcase", classname=report.label, name="host-report", time="0")
    if report.error:
        failure = ET.SubElement(host_case, "failure", message=report.error)
        failure.text = "\n".join(report.log_tail)
    for record in report.records:
        _case(suite, report.label, record)


def _case(suite: ET.Element, label: str, record: CaseRecord) -> None:
    path, _, name = record.nodeid.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    case = ET.SubElement(
        suite, "testcase", classname=f"{label}.{module}", name=name or path, time=f"{record.duration_s:.3f}"
    )
    if record.outcome == "failed":
        ET.SubElement(case, "failure", message=record.reason).text = record.evidence
    elif record.outcome == "xfailed":
        ET.SubElement(case, "skipped", type="pytest.xfail", message=record.reason)
    elif record.outcome == "skipped":
        ET.SubElement(case, "skipped", message=record.reason)
    if record.shardings:
        ET.SubElement(case, "system-out").text = json.dumps(record.shardings, sort_keys=True)


def _cross_host_suite(root: ET.Element, result: Aggregate) -> None:
    suite = ET.SubElement(root, "testsuite", name="cross-host")
    agree = ET.SubElement(suite, "testcase", classname="cross-host", name="sharding-agreement", time="0")
    if result.disagreements:
        failure = ET.SubElement(agree, "failure", message=f"{len(result.disagreements)} sharding disagreement(s)")
        failure.text = "\n".join(
            "\n".join([d.describe(), *(f"    {row}" for row in d.grids())]) for d in result.disagreements
        )
    costs = ET.SubElement(suite, "testcase", classname="cross-host", name="cost-agreement", time="0")
    if result.cost_disagreements:
        failure = ET.SubElement(costs, "failure", message=f"{len(result.cost_disagreements)} cost disagreement(s)")
        failure.text = "\n".join(d.describe() for d in result.cost_disagreements)
    run = ET.SubElement(suite, "testcase", classname="cross-host", name="run", time="0")
    if result.run_problems:
        ET.SubElement(run, "failure", message=result.run_problems[0]).text = "\n".join(result.run_problems)


def _count(root: ET.Element) -> None:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in root:
        counts = {
            "tests": len(suite.findall("testcase")),
            "failures": len(suite.findall("testcase/failure")),
            "errors": 0,
            "skipped": len(suite.findall("testcase/skipped")),
        }
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))


# -- Markdown ------------------------------------------------------------------------------------
def summary_markdown(result: Aggregate, meta: dict[str, Any]) -> str:
    lines = [f"# SPMD multi-slice run: {'PASSED' if result.ok else 'FAILED'}", ""]
    lines += [f"- {key}: `{value}`" for key, value in meta.items()] + [""]
    lines += ["| host | pod | passed | failed | xfailed | skipped | host status |", "|---|---|---|---|---|---|---|"]
    for r in result.hosts:
        counts = [sum(c.outcome == o for c in r.records) for o in ("passed", "failed", "xfailed", "skipped")]
        status = _cell(r.error) if r.error else "ok"
        lines.append(f"| {r.label} | {r.pod or '-'} | " + " | ".join(map(str, counts)) + f" | {status} |")
    if result.failures:
        lines += ["", f"## Failures ({len(result.failures)})", ""] + [f"- {_cell(f)}" for f in result.failures]
    grids = [(d, d.grids()) for d in result.disagreements]
    if any(rows for _, rows in grids):
        lines += [
            "",
            "## Sharding disagreements as device grids",
            "",
            "Which device holds which tile (rows and columns index the tensor's cut dimensions).",
            "",
        ]
        for d, rows in grids:
            if rows:
                lines += [f"`{d.nodeid}` tensor `{d.tensor}`:", "", "```", *rows, "```", ""]
    changes = baseline_changes(result)
    if changes:
        lines += [
            "",
            f"## Sharding changes against the baseline, reported ({len(changes)})",
            "",
            "Drift on the baseline's release line fails the case on its host (listed above); these are "
            "the rest: new tensors, or another release line.",
            "",
        ] + [f"- {_cell(c)}" for c in changes]
    cost_changes = cost_baseline_changes(result.hosts)
    if cost_changes:
        lines += [
            "",
            f"## Cost changes against the baseline, reported ({len(cost_changes)})",
            "",
            "Cost drift on the baseline's release line and steady-state failures fail the case on its host "
            "(listed above); these are changes on another release line.",
            "",
        ] + [f"- {_cell(c)}" for c in cost_changes]
    return "\n".join(lines) + "\n"


def baseline_changes(result: Aggregate) -> list[str]:
    """Every host compares its cases with the sharding baseline (harness.judges.baseline, in each host's
    pytest); what a passing case reported there, per host."""
    return [
        f"{r.label}: {c.nodeid}: {change}"
        for r in result.hosts
        for c in r.records
        if c.outcome != "failed"
        for change in c.sharding_changes
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verdict_line(result: Aggregate, out_dir: Path | None) -> str:
    where = f"; details in {out_dir / SUMMARY_NAME}" if out_dir else ""
    cases = sum(len(r.records) for r in result.hosts)
    if result.ok:
        return f"VERDICT: PASSED ({len(result.hosts)} hosts, {cases} case results){where}"
    return f"VERDICT: FAILED ({len(result.failures)} failure(s) over {len(result.hosts)} hosts, {cases} case results){where}"
