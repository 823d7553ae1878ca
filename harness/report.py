"""Turn a results folder into a Markdown job summary and GitHub failure annotations.

    python -m harness.report RESULTS_DIR [--summary FILE] [--step-summary FILE] [--annotate]
        [--github-output FILE] [--pytest-exit-status N]     (also installed as `spmd-report`)

The summary groups cases per bug family (case, verdict, registry entry, reason, evidence) and
ends with a totals line. It is written to summary.md in the run's own folder (in RESULTS_DIR
when that holds no single run, as a GKE launch's folder of hosts), so it travels with the
uploaded results, or to --summary FILE; and appended to $GITHUB_STEP_SUMMARY when that is set.
The counts (cases, failed, regressed, unexpected-passed, xfailed, passed, skipped) are appended
as `name=value` lines to $GITHUB_OUTPUT when that is set: the reusable workflow's outputs.

RESULTS_DIR is a results folder (its `latest` run is read), one run's folder, or a folder of
per-host results folders (a GKE launch). See harness.records.runfolder.

Every text from the results folder reaches the summary, the annotations and the outputs through
one escaping path (harness.records.escaping); the counts and the annotations are written first,
then the summary, capped under GitHub's 1 MiB per workflow step (harness.records.capping, which says what
it left out); a folder or link where the report writes is refused, named, and makes the run red
(harness.records.reportwriting).

A test pytest saw fail that has no case record (not an SPMD case, or its record was lost) is
listed as a failed case.

Every file in a results folder can be written by the code under test (a case body runs as the
same user). A caller that ran pytest itself (scripts/ci-spmd.sh) passes the run's own folder and
--pytest-exit-status N: the manifest must name that folder and agree with N, the failed count is
never below what the controlling pytest process counted (from its manifest), nor 0 when N is
not, and the totals line shows pytest's own tallies.

Exit codes: 0 case records were read, not all of them skipped, the run's manifest agrees with
them and no case failed. 1 a case failed (a failed, regressed or unexpectedly passing case, or
pytest counted a failure), unless --exit-zero-on-failures (the report of a run whose failures
its caller judges, such as the base build's); or the manifest shows a problem the records do not: the run
never finished, pytest exited with another code than 0 or 1 (interrupted, internal or usage
error, nothing collected, a signal), the manifest cannot be read, a test pytest saw fail has a
record that says otherwise, or pytest exited 1 and no failure was recorded; a run folder without
its manifest, a manifest that names another run, says pytest exited otherwise than
--pytest-exit-status, or lists what the controlling pytest process found wrong with it (a case
deleted or changed it). 2 no case record was read (failures pytest saw without one are listed,
but the run executed no case), or every case skipped (a run that executed nothing must not look
green, whatever pytest's own exit code was); also a usage error, or a RESULTS_DIR that does not
exist or is no folder (a pipe, a file; with --pytest-exit-status, a link too: nothing is read
from it). A records file, manifest or comparison beyond 256 MiB is not read (harness.isolation.system.files).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import stat
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from harness import cli, findings
from harness.isolation.system import files
from harness.judges.basecompare import Comparison, read_comparison
from harness.records import capping, reportwriting, runfolder, vouching
from harness.records.escaping import (
    markdown_cell,
    markdown_name,
    plain_line,
    shorten,
    workflow_command,
)
from harness.records.results import CaseRecord, contradicting, family_of, is_failure, read_records, suite_exit_problem

# Long log tails would make the summary table unreadable; the full text is in the uploaded JSON.
EVIDENCE_LIMIT = 400
MAX_FINDING_LINES = 400
ANNOTATION_EVIDENCE_LIMIT = 1000
# GitHub shows at most 10 error annotations per workflow step; the last slot says how many were left out.
MAX_ERROR_ANNOTATIONS = 10

# Failures first: that is what a reader of the summary is looking for.
OUTCOME_ORDER = {"failed": 0, "xfailed": 1, "skipped": 2, "passed": 3}
VERDICT_LABELS = {
    "failed": "❌ failed",
    "xfailed": "⚠️ known bug",
    "skipped": "⏭️ skipped",
    "passed": "✅ passed",
}
EXIT_NO_RECORDS = 2
EXIT_RUN_PROBLEM = 1
EXIT_CASES_FAILED = 1  # as pytest's own "tests failed"


@dataclasses.dataclass
class Results:
    """Everything read from one results folder."""

    records: list[CaseRecord]
    # "verdicts-gw1.jsonl:7" for each line that was not a readable record (e.g. cut by a crash).
    unreadable: list[str] = dataclasses.field(default_factory=list)
    # What the run's manifest says that the records do not: a run that never finished, an exit
    # code that is not "passed" or "failed", a failure pytest saw that has no record. Each one
    # makes the summary red (harness.records.runfolder).
    problems: list[str] = dataclasses.field(default_factory=list)
    # How many records came from the verdicts files (the rest stand for failures pytest saw
    # without a record): a run with none executed nothing, whatever else the report lists.
    case_records: int = 0
    # What the controlling pytest process saw, from the manifest it wrote at the end (its tallies:
    # failed, error, passed, ...), and the exit status the caller got from pytest, if it said.
    pytest_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    pytest_exit: int | None = None
    # What each run found against its base build's run (--spmd-compare; harness.judges.basecompare).
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)
    findings: list[str] = dataclasses.field(default_factory=list)  # the runs' failures by cause (harness.findings)


# ---------------------------------------------------------------------------------------------
# Reading


def load_results(results_dir: Path, pytest_exit: int | None = None) -> Results:
    """Read every verdicts file under results_dir, including per-host subfolders of a GKE run.

    A damaged line is counted instead of raised: the summary of a run whose worker died
    mid-write is exactly the one people need to see.

    pytest_exit: the exit status the caller got from the pytest that made this one run (the CI
    script passes it). The run's manifest must then agree with it, and a non-zero one is never
    reported green, whatever the files say: they are writable by the code under test.
    """
    results = Results(records=[], pytest_exit=pytest_exit)
    results.records = list(read_records(Path(results_dir), results.unreadable, recursive=True))
    results.case_records = len(results.records)
    runs = runfolder.find_runs(Path(results_dir))
    if pytest_exit is not None and Path(results_dir).is_symlink():
        results.problems.append(
            f"{results_dir} is a link, not the run folder the pytest that exited {pytest_exit} made"
        )
    if pytest_exit is not None and len(runs) != 1:
        results.problems.append(
            f"{results_dir} holds {len(runs)} runs, not the one run the pytest that exited {pytest_exit} made"
        )
    for run in runs:
        cross_check_run(run, results, pytest_exit is not None)
        read_run_comparison(run, results)
    if pytest_exit is not None and results.unreadable:
        # Held to a pytest run, every record must be read: a file or line that cannot be (a pipe,
        # a huge file, a cut line) may hide a failure.
        results.problems.append(
            f"{len(results.unreadable)} record file(s) or line(s) could not be read "
            f"({', '.join(results.unreadable[:3])}{' ...' if len(results.unreadable) > 3 else ''}): "
            "the run's records are incomplete, so it is not a pass"
        )
    if pytest_exit not in (None, 0) and not results.problems and not any(is_failure(r) for r in results.records):
        problem = suite_exit_problem(pytest_exit) or f"pytest exited {pytest_exit} (tests failed)"
        results.problems.append(f"{problem}, but no failing test was recorded; see the pytest output")
    return results


def read_run_comparison(run: Path, results: Results) -> None:
    """The run's comparison with its base build's run, if it made one; a damaged one is a problem."""
    try:
        comparison = read_comparison(run)
    except (OSError, ValueError) as exc:
        results.problems.append(f"{run.name}/{runfolder.COMPARISON_NAME} is unreadable ({exc})")
        return
    if comparison is not None:
        results.comparisons.append(comparison)
    try:  # what the run's end said, by cause: the summary leads with it (a case could write it: escaped, capped)
        results.findings += files.read_text(run / findings.FILE_NAME).splitlines()[:MAX_FINDING_LINES]
    except (OSError, ValueError):
        pass


def cross_check_run(run: Path, results: Results, manifest_required: bool = False) -> None:
    """Hold the run's records against its manifest, so nothing pytest saw fail reads as a pass."""
    if not runfolder.is_run_folder(run) and not os.path.lexists(run / runfolder.MANIFEST_NAME):
        if manifest_required or run.name.startswith(runfolder.RUN_PREFIX):
            results.problems.append(
                f"{run.name} has no {runfolder.MANIFEST_NAME} (deleted, or pytest never closed the run): what "
                "pytest saw cannot be checked, so the run is not a pass"
            )
        return  # else a folder of verdicts written without a manifest (tests, copied host reports)
    try:
        manifest = runfolder.read_manifest(run)
    except (OSError, ValueError) as exc:
        results.problems.append(
            f"{run.name}/{runfolder.MANIFEST_NAME} is unreadable ({exc}); the run cannot be checked for lost records"
        )
        return
    if manifest.run_id != run.name:
        results.problems.append(
            f"{run.name}/{runfolder.MANIFEST_NAME} names run {manifest.run_id}: not the manifest pytest wrote there"
        )
    found = [*manifest.problems, *vouching.problems(run, manifest.record_digests)]  # records held to their digests
    results.problems += [f"run {manifest.run_id}: {problem}" for problem in found]
    if manifest.status != "finished":
        results.problems.append(
            f"run {manifest.run_id} did not finish: pytest (pid {manifest.pid} on {manifest.host}, started "
            f"{manifest.started}) ended without closing it, so cases it started may have no record "
            "(killed, out of memory, or still running)"
        )
        return
    if results.pytest_exit is not None and manifest.exitstatus != results.pytest_exit:
        results.problems.append(
            f"run {manifest.run_id}: its manifest says pytest exited {manifest.exitstatus}, but the pytest that "
            f"made it exited {results.pytest_exit}: not that process's manifest"
        )
    for key, value in manifest.counts.items():
        results.pytest_counts[key] = results.pytest_counts.get(key, 0) + value
    problem = suite_exit_problem(manifest.exitstatus)
    if problem:
        results.problems.append(f"run {manifest.run_id}: {problem}; its records may not cover every case")
    recorded = {r.nodeid for r in results.records}
    for record in contradicting(manifest.failed_ids, results.records):
        results.problems.append(
            f"pytest reported {record.nodeid} failed (in setup or teardown?) but its case record says {record.outcome}"
        )
    for nodeid in manifest.failed_ids:
        if nodeid not in recorded:
            results.records.append(
                CaseRecord(
                    nodeid=nodeid,
                    family=family_of(nodeid),
                    outcome="failed",
                    reason="pytest reported this test failed, and the harness holds no record of it "
                    "(not an SPMD case, or its record was lost); see the pytest output or junit.xml",
                )
            )
    if manifest.exitstatus == 1 and not any(is_failure(r) for r in results.records) and not results.problems:
        results.problems.append(
            f"run {manifest.run_id}: pytest exited 1 (tests failed) but no failing test "
            "was recorded; see the pytest output"
        )


def group_by_family(records: Iterable[CaseRecord]) -> dict[str, list[CaseRecord]]:
    groups: dict[str, list[CaseRecord]] = collections.defaultdict(list)
    for record in records:
        groups[record.family or "unknown"].append(record)
    return {
        family: sorted(groups[family], key=lambda r: (OUTCOME_ORDER.get(r.outcome, -1), r.nodeid))
        for family in sorted(groups)
    }


# ---------------------------------------------------------------------------------------------
# Markdown


def case_name(record: CaseRecord) -> str:
    # The family heading already names the file.
    return record.nodeid.split("::", 1)[-1]


def where(record: CaseRecord) -> str:
    if record.slice_id is None and record.host_id is None:
        return ""
    return f"slice {record.slice_id}, host {record.host_id}"


def count_outcomes(records: Sequence[CaseRecord]) -> str:
    counts = collections.Counter(r.outcome for r in records)
    known = [f"{counts.pop(o, 0)} {o}" for o in ("passed", "failed", "xfailed", "skipped")]
    # An outcome no judge writes is a record's text: escaped like any other.
    others = [f"{n} {markdown_cell(outcome, 100)}" for outcome, n in sorted(counts.items())]
    return ", ".join(known + others)


def family_table(records: Sequence[CaseRecord], with_hosts: bool) -> list[str]:
    header = ["Case", "Verdict", "Registry entry", "Reason", "Evidence"]
    if with_hosts:
        header.insert(1, "Where")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for record in records:
        cells = [
            markdown_cell(case_name(record)),
            VERDICT_LABELS.get(record.outcome, f"❌ {markdown_cell(record.outcome)}"),
            markdown_cell(record.known_bug),
            markdown_cell(record.reason, EVIDENCE_LIMIT),
            markdown_cell(record.evidence, EVIDENCE_LIMIT),
        ]
        if with_hosts:
            cells.insert(1, markdown_cell(where(record)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def run_description(records: Sequence[CaseRecord]) -> str:
    """`torch_xla 2.9.0 · backend cpu · 4 devices`, listing every value seen."""

    def values(field: str) -> str:
        seen = sorted({str(getattr(r, field)) for r in records if getattr(r, field) not in (None, "")})
        return markdown_cell("/".join(seen), 200) or "?"  # a record's text: a case could have written it

    return f"torch_xla {values('torch_xla')} · backend {values('backend')} · {values('devices')} devices"


def render_summary(
    results: Results, title: str = "SPMD regression results", left_out: Collection[int] = frozenset()
) -> str:
    """left_out: the id() of records whose rows are left out of the tables (harness.records.capping)."""
    records = results.records
    lines = [f"## {title}", ""]
    for problem in results.problems:
        lines += [f"❌ **{markdown_cell(problem)}**", ""]
    if not records:
        lines += ["❌ **No case records were found: the run executed nothing.**", ""]
    else:
        lines += [run_description(records), ""]
        lines += findings_section(results.findings)
        with_hosts = any(where(r) for r in records)
        for family, members in group_by_family(records).items():
            lines += [f"### `{markdown_name(family)}` ({count_outcomes(members)})", ""]
            rows = [r for r in members if id(r) not in left_out]
            lines += (family_table(rows, with_hosts) if rows else ["(rows left out, see below)"]) + [""]
    for comparison in results.comparisons:
        lines += comparison_section(comparison)
    if results.unreadable:
        shown = ", ".join(results.unreadable[:10])
        lines += [f"⚠️ {len(results.unreadable)} unreadable record line(s): {markdown_cell(shown)}", ""]
    if left_out:
        lines += [capping.left_out_line([r for r in records if id(r) in left_out], len(records)), ""]
    lines.append(f"**Totals:** {totals_line(results)}")
    return "\n".join(lines) + "\n"


def findings_section(found: list[str]) -> list[str]:
    """The run's failed cases by cause (harness.findings), as the end of the run printed them."""
    if not found:
        return []
    items = [f"{'  ' if line.startswith(' ') else ''}- {markdown_cell(line.strip(), 600)}" for line in found]
    return ["### Findings by cause", "", *items, ""]


def comparison_section(comparison: Comparison) -> list[str]:
    """Both builds, what differs (failed), what changed in the registry's judgement, what the base lacks."""
    # A known bug the base passed and this build shows is no difference of a passing case (the
    # registry judged it, by this build's version): not a green check either.
    newly = any(line.startswith(("newly failing", "fails in this build")) for line in comparison.registry)
    mark = "❌" if comparison.differ else "⚠️" if newly else "✅"
    lines = [f"### {mark} Compared with the base build", ""]
    lines += [f"- {markdown_cell(line)}" for line in comparison.lines()]
    return lines + [""]


def totals_line(results: Results) -> str:
    line = f"{len(results.records)} cases: {count_outcomes(results.records)}"
    # What the controlling pytest process saw, where it was asked for (the CI script passes its exit
    # status) or where it counted more failures than the records hold.
    recorded_failures = sum(1 for r in results.records if is_failure(r))
    if results.pytest_exit is not None or counts(results)["failed"] > recorded_failures:
        tallies = ", ".join(f"{n} {markdown_cell(key, 100)}" for key, n in sorted(results.pytest_counts.items()))
        exited = f"exited {results.pytest_exit}" if results.pytest_exit is not None else "counted"
        line += f"; pytest {exited}" + (f" ({tallies})" if tallies else "")
    return line + (f"; {len(results.problems)} run problem(s)" if results.problems else "")


# ---------------------------------------------------------------------------------------------
# GitHub workflow commands


def failure_message(record: CaseRecord) -> str:
    """The reason, then what the record holds that explains it: the registry entry, where it ran,
    the sharding and cost changes (a drift's reason only announces them), the evidence. The
    evidence is left out when the reason already says all of it (a plain assertion's line)."""
    reason = record.reason or f"outcome {record.outcome}"
    parts = [reason]
    if record.known_bug:
        parts.append(f"registry entry: {record.known_bug}")
    if where(record):
        parts.append(where(record))
    parts += [f"  {line}" for line in (*record.sharding_changes, *record.cost_changes)]
    evidence = record.evidence.strip()
    if evidence and evidence not in reason:
        if evidence.startswith(reason.strip()):
            parts[0] = shorten(evidence, ANNOTATION_EVIDENCE_LIMIT)  # the reason is its first line
        else:
            parts.append(shorten(evidence, ANNOTATION_EVIDENCE_LIMIT))
    return "\n".join(parts)


def github_annotations(results: Results) -> list[str]:
    if not results.records:
        return [
            workflow_command(
                "error",
                "No SPMD case records were found: the run executed nothing.",
                title="SPMD regression: empty run",
            )
        ]
    problems = [
        workflow_command("error", problem, title="SPMD regression: incomplete run") for problem in results.problems
    ]
    failures = [r for r in results.records if is_failure(r)]
    shown = failures if len(failures) <= MAX_ERROR_ANNOTATIONS else failures[: MAX_ERROR_ANNOTATIONS - 1]
    commands = problems + [
        workflow_command("error", failure_message(r), title=f"SPMD regression: {r.nodeid}") for r in shown
    ]
    if len(shown) < len(failures):
        commands.append(
            workflow_command(
                "error",
                f"{len(failures) - len(shown)} more failed case(s); see the job summary.",
                title="SPMD regression: more failures",
            )
        )
    if results.unreadable:
        commands.append(
            workflow_command(
                "warning",
                "Unreadable record lines: " + ", ".join(results.unreadable[:10]),
                title="SPMD regression: damaged results",
            )
        )
    return commands


def plain_failure_lines(results: Results) -> list[str]:
    """What a laptop user sees instead of workflow commands."""
    return [f"RUN PROBLEM: {problem}" for problem in results.problems] + [
        f"FAILED {r.nodeid}: {r.reason or r.outcome}" for r in results.records if is_failure(r)
    ]


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.PlainParser(prog=cli.prog("harness.report", "spmd-report"), description=__doc__)
    parser.add_argument(
        "results_dir",
        type=Path,
        metavar="RESULTS_DIR",
        help="a results folder (its latest run), one run's folder, or a GKE launch's folder",
    )
    parser.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        default=None,
        help="where to write the Markdown summary (default: the run's folder/summary.md)",
    )
    parser.add_argument(
        "--step-summary",
        type=Path,
        metavar="FILE",
        default=os.environ.get("GITHUB_STEP_SUMMARY") or None,
        help="also append the summary here (default: $GITHUB_STEP_SUMMARY when set)",
    )
    parser.add_argument(
        "--github-output",
        type=Path,
        metavar="FILE",
        default=os.environ.get("GITHUB_OUTPUT") or None,
        help="append the counts here as name=value lines (default: $GITHUB_OUTPUT when set)",
    )
    parser.add_argument(
        "--annotate",
        action="store_true",
        help="print GitHub workflow commands (::error) for failures instead of a plain list",
    )
    parser.add_argument(
        "--pytest-exit-status",
        type=int,
        metavar="N",
        default=None,
        help="the exit status of the pytest that made RESULTS_DIR (one run's folder), as its caller got it "
        "(scripts/ci-spmd.sh passes it): the run's manifest must agree, and a non-zero N is never green",
    )
    parser.add_argument(
        "--exit-zero-on-failures",
        action="store_true",
        help="exit 0 when cases failed (the report alone is wanted); a run with problems, or that ran nothing, "
        "still exits 1 or 2",
    )
    parser.add_argument("--title", default="SPMD regression results", help="heading of the summary")
    cli.add_version(parser, "spmd-report")
    return parser.parse_args(argv)


def counts(results: Results) -> dict[str, int]:
    """What the reusable workflow exposes as outputs: a caller can branch on regressions alone."""
    outcomes = collections.Counter(r.outcome for r in results.records)
    verdicts = collections.Counter(r.registry_verdict for r in results.records)
    # Never fewer failures than the controlling pytest process counted, nor none when pytest
    # exited non-zero or the run has a problem: records alone can be rewritten by a case.
    failed = max(
        sum(1 for r in results.records if is_failure(r)),
        results.pytest_counts.get("failed", 0) + results.pytest_counts.get("error", 0),
        1 if results.problems or results.pytest_exit not in (None, 0) else 0,
    )
    return {
        "cases": len(results.records),
        "failed": failed,
        "regressed": verdicts["regressed"],
        "unexpected-passed": verdicts["unexpected-pass"],
        "xfailed": outcomes["xfailed"],
        "passed": outcomes["passed"],
        "skipped": outcomes["skipped"],
    }


def write_report(results: Results, args: argparse.Namespace, home: Path) -> bool:
    """The outputs and the annotations first, then the summary (capped, harness.records.capping): a
    summary that cannot be written must not take the rest with it. What is in the way of a write
    (a folder or link a case put there) is refused and named, and makes the run red in what is
    written after it; True when every write went through."""
    summary = args.summary or home / runfolder.SUMMARY_NAME
    appended = {"--step-summary": args.step_summary, "--github-output": args.github_output}
    results.problems += reportwriting.problems(summary, appended)
    failures = []
    if args.github_output is not None:
        failures.append(reportwriting.outputs(args.github_output, counts(results)))
    if args.annotate:
        for command in github_annotations(results):
            print(command)
    else:
        for line in plain_failure_lines(results):
            say(line)
    limit = capping.budget(reportwriting.size_of(args.step_summary))
    text = capping.fit(results.records, lambda left_out: render_summary(results, args.title, left_out), limit)
    failures.append(reportwriting.replace(summary, text))
    if args.step_summary is not None:  # appended: other steps may have written to it
        failures.append(reportwriting.append(args.step_summary, text))
    for failure in filter(None, failures):
        say(f"error: {failure}", error=True)
    return not any(failures)


def say(text: str, error: bool = False) -> None:
    print(plain_line(text), file=sys.stderr if error else sys.stdout)


def results_folder_problem(path: Path, held_to_a_run: bool) -> str | None:
    """Why path cannot be reported, if it cannot: it is untrusted input (an uploaded results
    artifact, a folder a case could write), so it must be a folder, and, when held to a pytest
    run, the folder itself rather than a link a case put there. Nothing is opened to find out."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"results folder {path} does not exist; did pytest run with --spmd-results-dir={path}?"
    if stat.S_ISLNK(info.st_mode):
        if held_to_a_run:
            return (
                f"{path} is a link (to {os.readlink(path)!r}), not the run folder pytest made: "
                "refused, nothing read or written through it"
            )
        if path.is_dir():
            return None
        return f"{path} is a link to no folder ({os.readlink(path)!r}): give the results folder itself"
    if not stat.S_ISDIR(info.st_mode):
        what = f"a file of {info.st_size} bytes" if stat.S_ISREG(info.st_mode) else files.kind_name(info.st_mode)
        return f"{path} is {what}, not a results folder: refused, nothing read from it"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a record's text may hold what UTF-8 cannot (a lone surrogate)
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    problem = results_folder_problem(args.results_dir, args.pytest_exit_status is not None)
    if problem is not None:
        say(f"error: {problem}", error=True)
        return EXIT_NO_RECORDS
    results = load_results(args.results_dir, args.pytest_exit_status)
    if results.unreadable:
        say(
            f"warning: {len(results.unreadable)} damaged record line(s) under {args.results_dir}, not counted as "
            f"cases (cut short by a crash, or not a case record): {', '.join(results.unreadable[:10])}"
            f"{' ...' if len(results.unreadable) > 10 else ''}",
            error=True,
        )
    runs = runfolder.find_runs(args.results_dir)
    home = runs[0] if len(runs) == 1 else args.results_dir  # the run's own folder when there is one
    written = write_report(results, args, home)
    say(f"harness.report {home}: {totals_line(results)}")
    held = runfolder.runs_in(args.results_dir) if home != args.results_dir else []
    if len(held) > 1:  # two venvs, one results folder: say which run this is, and that others are there
        say(
            f"({args.results_dir} holds {len(held)} runs; this report is of {home.name}; name a run's "
            f"folder to report another, e.g. {next(r for r in held if r.resolve() != home.resolve())})"
        )
    if not results.case_records:
        say(
            f"error: no case records ({runfolder.VERDICTS_GLOB}) under {args.results_dir}: the run executed "
            "nothing. Check that cases were collected (-m spmd), that the harness plugin loaded, "
            "and that --spmd-results-dir points here.",
            error=True,
        )
        return EXIT_NO_RECORDS
    if all(r.outcome == "skipped" for r in results.records):
        say(
            f"error: all {len(results.records)} cases under {args.results_dir} were skipped "
            f"(first reason: {results.records[0].reason}); a run that executed nothing is not a pass.",
            error=True,
        )
        return EXIT_NO_RECORDS
    if results.problems or not written:
        return EXIT_RUN_PROBLEM
    failed = counts(results)["failed"]
    if failed and not args.exit_zero_on_failures:
        say(
            f"error: {failed} case(s) failed in the run reported (--exit-zero-on-failures: exit 0 all the same)",
            error=True,
        )
        return EXIT_CASES_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
