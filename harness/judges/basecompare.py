"""Judge this build against its base: the same suite's run on the torch_xla a PR started from.

The committed baselines (harness.judges.baseline, harness.costbaseline) fail a change only on their
own release line, so on a PR build of the next release (`2.10.0+git1a2b3c4`) a sharding or cost
change is only reported. `--spmd-compare=PATH` names a run of the same suite on the PR's base
build; every case that passes here and passed there is held to it strictly, whatever the two
versions: its recorded shardings (canonical text, harness.judges.baseline's comparison) and its cost
signature (harness.costbaseline's comparison, so whatever the signature gains is compared too).
One line per item names both builds:

    base 2.10.0+git1111111 -> this build 2.10.0+git2222222: step0: all-gather 38 -> 34 (-5.2 KiB per device)

What the base lacks (a case, a tensor, a training loop) is listed, never failed. The committed
baselines keep their rule beside this one.

This module is the pure part: finding and validating the base run, comparing one case, the
known-bug judgements that changed, and the comparison file a run leaves for harness.report
(`comparison.json` in its folder). The plugin's side: harness.judges.basecheck.

A base run is untrusted input (an artifact of another job, a hand edit): it is refused as a whole
(BaseRunError, a usage error before any case runs) when it did not finish, holds no case records,
was taken on another backend or device count, mixes builds, or holds a record that is damaged or
contradicts its own manifest. Text read from it is escaped before it is printed.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness import costs, findings
from harness.config import jobsize
from harness.errors import DamagedRecord, HarnessUsageError
from harness.isolation.parent.evidence import headline
from harness.isolation.system import files
from harness.judges import shardingcompare
from harness.records import runfolder, vouching
from harness.records.results import CaseRecord, contradicting, read_records, suite_exit_problem
from harness.registry import JudgementKind
from harness.schema import load_json, shown
from harness.sharding import canonical_text

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
JUDGEMENT_KINDS = tuple(kind.value for kind in JudgementKind)
# Registry judgements in which the bug's signature showed, and in which the case passed ("failed":
# another failure, which names no bug).
BUG_SHOWED = ("reproduced", "regressed")
CASE_PASSED = ("passed", "unexpected-pass")
COMPARISON_SCHEMA = 1
MAX_LINES_PER_CASE = 100  # a forged base could differ in every tensor: the failure stays readable
MAX_NEW_LISTED = 10  # more items the base lacks (or bytes within the band) are counted at the end, not listed
# A finish time this far ahead of this host's clock is no clock skew: the manifest was made up.
FUTURE_SLACK = datetime.timedelta(hours=1)


class BaseRunError(HarnessUsageError):
    """The run --spmd-compare names cannot be compared with (missing, unfinished, another backend
    or device count, no case records, a damaged or contradictory record)."""


def printable(text: str) -> str:
    """`text` with every character that is not printable escaped (\\x1b, \\n): a base run's bytes
    cannot move the cursor, colour the terminal or start a line of their own."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclasses.dataclass(frozen=True)
class BaseRun:
    path: Path  # the run folder
    torch_xla: str | None  # the one build its cases ran (None: no child reported one)
    backend: str
    devices: int
    records: dict[str, CaseRecord]  # by case id
    chosen: str = ""  # how the run was chosen among those in the folder --spmd-compare names (choose_run)

    @classmethod
    def load(cls, path: Path, backend: str, devices: int, own_run: Path | None = None) -> BaseRun:
        """The run `path` names (harness.records.runfolder: a run folder, or a results folder's newest
        finished run), validated for comparing a run of `backend` with `devices` devices."""
        run, chosen = choose_run(Path(path), own_run, backend, devices)
        where = f"--spmd-compare: base run {run}"
        manifest = runfolder.read_manifest(run)
        try:
            records: dict[str, CaseRecord] = {}
            for record in read_records(run):
                if record.nodeid in records:
                    raise DamagedRecord(f"case {record.nodeid!r} has two records (two verdicts files)")
                records[record.nodeid] = record
        except DamagedRecord as exc:
            raise BaseRunError(f"{where} holds a damaged record: {printable(str(exc))}; {RERUN}") from None
        except OSError as exc:
            raise BaseRunError(f"{where} cannot be read ({exc.strerror or exc})") from None
        if not any(r.outcome != "skipped" for r in records.values()):
            raise BaseRunError(
                f"{where} holds no case records{' that ran' if records else ''} "
                f"({runfolder.VERDICTS_GLOB}); run the suite on the base build first (pytest -m spmd) and point "
                "--spmd-compare at its results folder or run folder"
            )
        for record in records.values():
            _check_record(record, where)
        for record in contradicting(manifest.failed_ids, records.values()):
            raise BaseRunError(
                f"{where}: pytest reported {record.nodeid!r} failed, but its record says "
                f"{record.outcome}: the records contradict the run's manifest (damaged or edited); {RERUN}"
            )
        setups = {(r.backend, r.devices) for r in records.values()}
        if setups != {(backend, devices)}:
            taken = "; ".join(f"backend {printable(str(b))} with {d} devices" for b, d in sorted(setups, key=str))
            raise BaseRunError(
                f"{where} was taken on {taken}; this run uses backend {backend} with {devices} devices, whose "
                "shardings and costs it does not predict. Compare with a base run of the same backend and "
                "device count (--spmd-backend, --spmd-devices)"
            )
        builds = sorted({r.torch_xla for r in records.values() if r.torch_xla is not None})
        if len(builds) > 1:
            raise BaseRunError(
                f"{where} mixes torch_xla builds ({', '.join(builds)}): it is not one base build's run; {RERUN}"
            )
        # Its report is not fatal to a CI job (its failures are the base build's), so a case there
        # that rewrote a record would otherwise set what this run is compared with.
        rewritten = vouching.problems(run, manifest.record_digests)
        if rewritten:
            raise BaseRunError(
                f"{where} holds records not as pytest wrote them: {printable('; '.join(rewritten))}; {RERUN}"
            )
        if manifest.problems:  # what its own end found a case did to it (a planted build.json, ...)
            said = printable("; ".join(manifest.problems[:3]))
            raise BaseRunError(f"{where} ended with run problem(s): {said}; it is no base to trust; {RERUN}")
        return cls(run, builds[0] if builds else None, backend, devices, records, chosen)


RERUN = "run the suite on the base build again and point --spmd-compare at that run"


def _check_record(record: CaseRecord, where: str) -> None:
    """What CaseRecord.from_dict cannot know: the values a judge acts on, beyond their types."""
    what = f"{where}: record of {record.nodeid!r}"
    if record.outcome not in OUTCOMES:
        raise BaseRunError(f"{what}: outcome {record.outcome!r} is not one of {', '.join(OUTCOMES)}")
    if record.registry_verdict is not None and record.registry_verdict not in JUDGEMENT_KINDS:
        raise BaseRunError(
            f"{what}: registry_verdict {record.registry_verdict!r} is not one of {', '.join(JUDGEMENT_KINDS)}"
        )
    if record.torch_xla is not None:
        try:
            Version(record.torch_xla)
        except InvalidVersion:
            raise BaseRunError(f"{what}: torch_xla {record.torch_xla!r} is not a PEP 440 version; {RERUN}") from None


def find_run(path: Path, own_run: Path | None = None, backend: str | None = None, devices: int | None = None) -> Path:
    """The run folder `path` names (choose_run, without saying why)."""
    return choose_run(path, own_run, backend, devices)[0]


def choose_run(
    path: Path, own_run: Path | None = None, backend: str | None = None, devices: int | None = None
) -> tuple[Path, str]:
    """The run folder `path` names, and how it was chosen: itself when it is one, else the run in
    it that finished last (by its manifest, never by its folder's name) of those that can be a
    base: finished, not itself a comparison (a PR's earlier run with --spmd-compare shares the
    folder and holds the PR's own build), taken on `backend` with `devices` devices. `latest` is
    not followed: it points at whichever run started last, finished or not (this very run, when
    both share a results folder). None fits: refused, naming each candidate and why."""
    path = path.expanduser().absolute()
    if not path.is_dir():
        raise BaseRunError(f"--spmd-compare={path}: no such folder; point it at the base build's results folder")
    if runfolder.is_run_folder(path):
        problem = _unfinished(path) or _comparison_run(path)
        if problem:
            raise BaseRunError(f"--spmd-compare: base run {path} {problem}; point it at a run of the base build")
        return path, "the run folder --spmd-compare names"
    skipped, fitting = [], []
    for run in runfolder.newest_finished_first(runfolder.runs_in(path)):
        if own_run is not None and run.absolute() == own_run.absolute():
            continue
        if runfolder.is_run_folder(run):
            problem = _unfinished(run) or _comparison_run(run) or _other_setup(run, backend, devices)
        else:
            problem = "has no manifest"
        if problem is None:
            fitting.append(run)
        else:
            skipped.append(f"{run.name} {problem}")
    if fitting:
        return fitting[0], _choice(fitting, skipped)
    setup = f", taken on backend {backend} with {devices} devices" if backend is not None else ""
    detail = f": {'; '.join(skipped[:8])}{'; ...' if len(skipped) > 8 else ''}" if skipped else ""
    raise BaseRunError(
        f"--spmd-compare={path} holds no finished run folder ({runfolder.RUN_PREFIX}*/{runfolder.MANIFEST_NAME}) "
        f"that can be a base run (not itself a comparison{setup}){detail}; run the suite on the base build with "
        f"--spmd-results-dir={path} first, or point --spmd-compare at that run's folder"
    )


def _choice(fitting: list[Path], skipped: list[str]) -> str:
    """Which of the fitting runs was taken and why, naming the others and those that could not be
    a base: what a reader of the header needs to see that the base is the run they meant."""
    described = [f"{run.name} (finished {runfolder.finished_at(run)}, torch_xla {_builds(run)})" for run in fitting]
    text = f"the last to finish of {len(fitting)} fitting run(s), by their manifests: {described[0]}"
    if len(fitting) > 1:
        text += f"; not {', '.join(described[1:4])}{', ...' if len(fitting) > 4 else ''}"
    if skipped:
        text += f"; passed over: {'; '.join(skipped[:4])}{'; ...' if len(skipped) > 4 else ''}"
    builds = {_builds(run) for run in fitting}
    if len(builds) > 1:
        text += (
            f". WARNING: the fitting runs hold {len(builds)} builds ({', '.join(sorted(builds))}): point "
            "--spmd-compare at the base build's run folder to choose"
        )
    return text


def _builds(run: Path) -> str:
    """The torch_xla build(s) a run's records name, as text ('?' when none does)."""
    try:
        found = sorted({r.torch_xla for r in read_records(run) if r.torch_xla is not None})
    except (DamagedRecord, OSError):
        return "unreadable"
    return printable("/".join(found) or "?")


def _comparison_run(run: Path) -> str | None:
    """Why a run is no base: it compared its own build with another one (its comparison.json, or
    --spmd-compare on its command line), so its records are a PR build's, not a base build's."""
    if os.path.lexists(run / runfolder.COMPARISON_NAME):
        return f"is itself a comparison (it holds {runfolder.COMPARISON_NAME}: a run with --spmd-compare)"
    try:
        argv = runfolder.read_manifest(run).argv
    except (OSError, ValueError):
        return None  # _unfinished said it already
    if any(arg.startswith("--spmd-compare") for arg in argv):
        return "is itself a comparison (its command line has --spmd-compare)"
    return None


def _other_setup(run: Path, backend: str | None, devices: int | None) -> str | None:
    """Why a run's records cannot predict this run's: another backend or device count. A run whose
    records cannot be read is not skipped: BaseRun.load refuses it by name."""
    if backend is None:
        return None
    try:
        setups = {(r.backend, r.devices) for r in read_records(run)}
    except (DamagedRecord, OSError):
        return None
    if not setups or setups == {(backend, devices)}:
        return None
    taken = "; ".join(f"backend {printable(str(b))} with {d} devices" for b, d in sorted(setups, key=str))
    return f"was taken on {taken}"


def _unfinished(run: Path) -> str | None:
    """Why a run's records are not a whole run, or None."""
    try:
        manifest = runfolder.read_manifest(run)
    except (OSError, ValueError) as exc:
        return f"has an unreadable manifest ({printable(str(exc))})"
    if manifest.status != "finished":
        return "did not finish (killed, or still running)"
    finished = runfolder.finished_at(run)
    if finished is None:
        return f"has no finish time a reader can order by ({printable(shown(manifest.finished))})"
    if finished > datetime.datetime.now(datetime.timezone.utc) + FUTURE_SLACK:
        return f"says it finished at {finished}, in the future: no pytest wrote that manifest"
    problem = suite_exit_problem(manifest.exitstatus)
    return f"is incomplete: {problem}" if problem else None


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CaseComparison:
    """How one case of this run stands against the base run."""

    case: str
    differences: list[str] = dataclasses.field(default_factory=list)  # items that fail it, without the builds
    new: list[str] = dataclasses.field(default_factory=list)  # what the base lacks (listed)
    bytes_listed: list[str] = dataclasses.field(default_factory=list)  # bytes within the band, improvements
    not_compared: str | None = None  # why the base cannot judge it (the base lacks it, or failed it)
    grids: list[str] = dataclasses.field(default_factory=list)  # device grids of the moves the text hides


def compare_case(
    base: BaseRun,
    case: str,
    shardings: Mapping[str, str] | None,
    signatures: Mapping[str, Mapping[str, Any]] | None,
    known_bug: str | None = None,
) -> CaseComparison:
    """Compare a passing case's shardings and cost signatures (None: not judged here, e.g. a
    no_sharding_baseline or no_cost_check case) with its record in the base run. `known_bug`: the
    entry the case reproduced (an xfail), compared with a base record that reproduced it too."""
    result = CaseComparison(case)
    record = base.records.get(case)
    if record is None:
        result.not_compared = "the base run has no record of it" + _other_job_size(case, base.records)
        return result
    same_bug = known_bug is not None and record.outcome == "xfailed" and record.known_bug == known_bug
    if record.outcome != "passed" and not same_bug:
        reason = headline(record.reason or record.late_fault or "", 300)
        result.not_compared = f"the base run's record says {record.outcome}" + (
            f": {printable(reason)}" if reason else ""
        )
        return result
    # The cost lines first: one change in torch_xla (a graph cut in two) moves the counts and
    # renumbers every step-graph parameter; the counts say what happened.
    if signatures is not None:
        measured = {label: sig for label, sig in signatures.items() if label in record.costs}
        result.new += [
            f"{label}: training loop not measured in the base run"
            for label in sorted(signatures)
            if label not in record.costs
        ]
        changes = findings.no_improvement_beside_growth(
            costs.compare_loops(record.costs, measured, reference="base run")
        )
        result.differences += [printable(str(c)) for c in costs.failing(changes)]
        result.bytes_listed += [printable(str(c)) for c in costs.listed(changes)]
        for label, signature in sorted(measured.items()):  # native growth: judged per step against the base's
            result.differences += [
                printable(line) for line in costs.native_against_base(record.costs[label], signature, label)
            ]
    if shardings is not None:
        expected, base_parameters = _split_parameters(record.shardings)
        observed, parameters = _split_parameters(shardings)
        for change in shardingcompare.compare(expected, observed, reference="base run"):
            (result.new if change.before is None else result.differences).append(printable(str(change)))
            grids = change.grids(("base", "this build"))
            if grids:
                result.grids += [printable(f"{change.tensor}:")] + [printable(f"    {row}") for row in grids]
        for graph in sorted(set(base_parameters) | set(parameters)):
            changed = _parameters_change(graph, base_parameters.get(graph), parameters.get(graph))
            if changed is not None:
                (result.differences if changed[0] else result.new).append(printable(changed[1]))
    return result


# A step graph's parameters as the cost meter records them: `step0:parameter(7)`. XLA numbers them
# in the order the graph takes them, so a graph that gains or loses one renumbers the rest: they are
# matched by their shardings (a multiset per graph), never one number against the same number.
GRAPH_PARAMETER = re.compile(r"(?P<graph>.+):parameter\(\d+\)")


def _other_job_size(case: str, records: Mapping[str, Any]) -> str:
    """Where the base ran the same case at another training-job size: say so, and what to do."""
    key = jobsize.plain_id(case)
    for other in records:
        if other != case and jobsize.plain_id(other) == key:
            theirs, ours = jobsize.size_in_id(other) or jobsize.DEFAULT, jobsize.size_in_id(case) or jobsize.DEFAULT
            return (
                f": the base ran the training job at size {theirs} ({printable(other)}), this run at {ours}; "
                f"run the base with --spmd-job-size={ours}"
            )
    return ""


def _split_parameters(shardings: Mapping[str, str]) -> tuple[dict[str, str], dict[str, collections.Counter[str]]]:
    """(the named tensors, each step graph's parameter shardings as a multiset)."""
    named: dict[str, str] = {}
    graphs: dict[str, collections.Counter[str]] = {}
    for name, spec in shardings.items():
        match = GRAPH_PARAMETER.fullmatch(name)
        if match:
            graphs.setdefault(match["graph"], collections.Counter())[canonical_text(spec)] += 1
        else:
            named[name] = canonical_text(spec)
    return named, graphs


def _parameters_change(
    graph: str, before: collections.Counter[str] | None, after: collections.Counter[str] | None
) -> tuple[bool, str] | None:
    """One line for a graph's parameters, None when they match whatever their numbers; (True, line)
    fails the case (a sharding the base's graph had is gone), (False, line) only lists what it gained."""
    if before == after:
        return None
    if before is None:
        return False, f"{graph}: {sum((after or {}).values())} graph parameter(s), a graph the base run lacks"
    after = after or collections.Counter()
    gained, lost = after - before, before - after
    items = [f"-{n} x {spec}" for spec, n in sorted(lost.items())] + [
        f"+{n} x {spec}" for spec, n in sorted(gained.items())
    ]
    line = (
        f"{graph}: graph parameters {sum(before.values())} -> {sum(after.values())} "
        f"(matched by sharding, whatever their numbers): {', '.join(items)}"
    )
    return bool(lost), line


def failure_text(base: BaseRun, this_build: str | None, comparison: CaseComparison) -> str:
    """The failure of a case that differs: one line per item naming both builds, first."""
    builds = f"base {base.torch_xla or '?'} -> this build {this_build or '?'}"
    lines = [f"{builds}: {item}" for item in comparison.differences[:MAX_LINES_PER_CASE]]
    if len(comparison.differences) > MAX_LINES_PER_CASE:
        lines.append(f"... {len(comparison.differences) - MAX_LINES_PER_CASE} more item(s)")
    if comparison.grids:
        lines += ["which device holds which tile:", *comparison.grids[: 4 * MAX_LINES_PER_CASE]]
    lines.append(
        f"(judged against the base run {base.path} by --spmd-compare; a change the PR means "
        "is a change reviewers should see named here)"
    )
    return "\n".join(lines)


def registry_change(entry: str, case: str, before: str | None, after: str | None) -> str | None:
    """A known-bug judgement that differs between the base run and this one, as a line."""
    if before == after or before is None or after is None:
        return None
    detail = f"{entry} ({case}: base {before} -> this build {after})"
    if before in BUG_SHOWED and after in CASE_PASSED:
        return f"fixed by this build: {detail}"
    if before in CASE_PASSED and after in BUG_SHOWED:
        return f"newly failing in this build: {detail}"
    if after == "failed":
        return f"fails in this build without the signature of {detail}"
    return f"judged differently: {detail}"


# --------------------------------------------------------------------------------------------
# The comparison a run leaves in its folder (read by harness.report)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Comparison:
    """What a run's comparison with its base found, for the end of the run and the report."""

    base: str  # the base run folder
    base_torch_xla: str | None
    this_torch_xla: list[str] = dataclasses.field(default_factory=list)
    compared: int = 0  # cases held to the base
    differ: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # case -> failure lines
    new: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # case -> what the base lacks
    not_compared: dict[str, str] = dataclasses.field(default_factory=dict)  # case -> why
    registry: list[str] = dataclasses.field(default_factory=list)  # registry_change lines
    schema: int = COMPARISON_SCHEMA
    # case -> bytes within the band, improvements (listed; the file's `moved`)
    bytes_listed: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    base_build: str | None = None  # each side's build id (harness.records.buildid), where recorded
    this_build: str | None = None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["moved"] = data.pop("bytes_listed")  # the file's name for them, kept
        return json.dumps(data, sort_keys=True, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Comparison:
        """Strict: a file of the wrong shape is a ValueError naming the field."""
        data = load_json(text)
        if not isinstance(data, dict) or data.get("schema") != COMPARISON_SCHEMA:
            raise ValueError(f"not a comparison of schema {COMPARISON_SCHEMA}")
        checks: dict[str, Any] = {
            "base": lambda v: isinstance(v, str),
            "base_torch_xla": lambda v: v is None or isinstance(v, str),
            "this_torch_xla": lambda v: _strings(v),
            "compared": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "differ": lambda v: isinstance(v, dict) and all(_strings(x) for x in v.values()),
            "new": lambda v: isinstance(v, dict) and all(_strings(x) for x in v.values()),
            "not_compared": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
            "registry": lambda v: _strings(v),
        }
        for name, check in checks.items():
            if name not in data or not check(data[name]):
                raise ValueError(f"field {name!r} is {shown(data.get(name))}")
        # `moved` came later: a comparison written before it lists no byte moves.
        moved = data.get("moved", {})
        if not (isinstance(moved, dict) and all(_strings(x) for x in moved.values())):
            raise ValueError(f"field 'moved' is {shown(moved)}")
        for name in ("base_build", "this_build"):  # came later too
            if not (data.get(name) is None or isinstance(data[name], str)):
                raise ValueError(f"field {name!r} is {shown(data[name])}")
        comparison = cls(**{name: data[name] for name in (*checks, "schema")}, bytes_listed=moved)
        comparison.base_build, comparison.this_build = data.get("base_build"), data.get("this_build")
        return comparison

    def lines(self) -> list[str]:
        """The end-of-run listing (also the report's, in Markdown there)."""
        base = f" (build {self.base_build})" if self.base_build else ""
        this = f" (build {self.this_build})" if self.this_build else ""
        out = [
            f"base torch_xla {self.base_torch_xla or '?'}{base} -> this build {', '.join(self.this_torch_xla) or '?'}"
            f"{this}; {self.compared} case(s) compared, {len(self.differ)} differ"
        ]
        if self.base_build and self.base_build == self.this_build:
            out.append(f"WARNING: both sides ran the same build ({self.base_build}): nothing was compared with another")
        elif not (self.base_build and self.this_build) and self.base_torch_xla in self.this_torch_xla:
            out.append(same_build_warning(str(self.base_torch_xla)))
        out += [f"differs: {case}: {lines[0] if lines else ''}" for case, lines in sorted(self.differ.items())]
        out += list(self.registry)  # what failed first; what is only listed after
        new = [f"{case}: {item}" for case, items in sorted(self.new.items()) for item in items]
        if len(new) <= MAX_NEW_LISTED:
            out += [f"new in this build (listed, not failed): {line}" for line in new]
        else:
            out.append(
                f"new in this build (listed, not failed): {len(new)} item(s) the base run lacks, in {len(self.new)} "
                f"case(s); each case's under its result (-rA), all in {runfolder.COMPARISON_NAME}"
            )
        moved = [f"{case}: {item}" for case, items in sorted(self.bytes_listed.items()) for item in items]
        band = f"bytes moved (listed, not failed: {costs.band_text()} band)"
        if len(moved) <= MAX_NEW_LISTED:
            out += [f"{band}: {line}" for line in moved]
        else:  # a regression's run moves many bytes a little: counted, so its differences stay in view
            out.append(
                f"{band}: {len(moved)} item(s) in {len(self.bytes_listed)} case(s), all in {runfolder.COMPARISON_NAME}"
            )
        out += [f"not compared: {case}: {why}" for case, why in sorted(self.not_compared.items())]
        return [printable(line) for line in out]


def same_build_warning(version: str) -> str:
    """Both sides carry one version label: the base run may be a run of this very build."""
    return (
        f"WARNING: the base run and this build are both torch_xla {version}: if the base run is a run of this "
        "build, nothing was compared with the base build (point --spmd-compare at the base build's run)"
    )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def read_comparison(run: Path) -> Comparison | None:
    """The comparison a run left, None where it made none; ValueError for a damaged file."""
    path = run / runfolder.COMPARISON_NAME
    if not path.is_file():
        return None
    return Comparison.from_json(files.read_text(path))


def sorted_unique(values: Iterable[str]) -> list[str]:
    return sorted(set(values))
