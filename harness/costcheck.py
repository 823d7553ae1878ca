"""The plugin's side of cost signatures: steady state, the cost baseline, records and dumps.

Called by harness.plugin next to the sharding comparison, so the order is the same: the registry
judges first (an xfail is never compared), then shardings, then costs. For every case whose body
recorded signatures (harness.stepcosts):

1. Steady state, whatever the baseline says: a step after the loop's warm-up that compiled a new
   graph fails the case, naming the step and what differs between the two graphs; so does one
   that left more XLA tensors, device bytes or host objects alive than the step before, naming
   what stayed alive.
2. The cost baseline (harness.costbaseline): a change fails on the baseline's release line, one
   line per item; elsewhere it is reported in a section of the test's report and in the record.
3. The partitioned modules the signatures were read from reach the results folder
   (`costs/<case>__<loop>_<graph>.after_optimizations.txt`) only when the case failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import baseline, baselinefile, costs, options, results, runfolder
from harness.costbaseline import CostBaseline, default_path
from harness.errors import HarnessError

SESSION_KEY = pytest.StashKey["CostSession"]()
SIGNATURES_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()
DUMPS_KEY = pytest.StashKey[dict[str, str]]()
CHANGES_KEY = pytest.StashKey[list[str]]()
UPDATE_FLAG = "--spmd-update-costs"
NO_COST_CHECK_MARKER = (
    "no_cost_check(reason): neither steady state nor the cost baseline judges this case "
    "(a self-test whose bodies record a cost regression on purpose)"
)


class CostSession:
    def __init__(self, config: pytest.Config, backend: Any) -> None:
        self._option: str | None = options.value(config, "spmd_costs_baseline")
        self._rootpath = config.rootpath
        self._backend = backend  # a TPU's device count takes a probe: asked only when needed
        self.update: bool = config.getoption(options.UPDATE_COSTS)
        if self.update:
            baselinefile.refuse_under_xdist(config, UPDATE_FLAG)
        self._baseline: CostBaseline | None = None
        self._loaded = False
        self.updates = baselinefile.Updates()  # --spmd-update-costs: the cases it may write
        self.updated: dict[str, list[Any]] | None = None
        self.not_written: str | None = None  # why an update run wrote nothing
        self.cases_without_entry: list[str] = []

    @property
    def backend(self) -> str:
        return str(self._backend.name)

    @property
    def devices(self) -> int:
        return int(self._backend.capabilities().devices)

    @property
    def option_name(self) -> str | None:
        """The option that named the baseline in use, for the hints; None: the default file."""
        return "spmd_costs_baseline" if self._option else None

    @property
    def path(self) -> Path:
        if self._option:
            return Path(self._option).resolve()
        return default_path(self._rootpath, self.backend, self.devices)

    def baseline(self) -> CostBaseline | None:
        if not self._loaded:
            self._loaded = True
            try:
                self._baseline = CostBaseline.load(self.path, self.backend, self.devices)
            except HarnessError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._baseline


def configure(config: pytest.Config, backend: Any, load: bool) -> None:
    """At configure time (the xdist controller too): a damaged baseline is a usage error now."""
    config.addinivalue_line("markers", NO_COST_CHECK_MARKER)
    session = CostSession(config, backend)
    config.stash[SESSION_KEY] = session
    if load:
        session.baseline()


def _signatures(item: pytest.Item, results_of_runs: list[Any]) -> dict[str, dict[str, Any]]:
    """Every loop's signature the case's bodies recorded; their dumps move to the item's stash."""
    signatures: dict[str, dict[str, Any]] = {}
    dumps: dict[str, str] = {}
    for result in results_of_runs:
        values = result.values
        dumps.update(values.pop(costs.DUMPS_KEY, None) or {})
        for label, signature in (values.get(costs.SIGNATURES_KEY) or {}).items():
            signatures[label] = costs.check_signature(signature, f"cost signature {label!r} from the case's child")
    item.stash[DUMPS_KEY] = dumps
    item.stash[SIGNATURES_KEY] = signatures
    return signatures


def judge(item: pytest.Item, report: pytest.TestReport, runner: Any, version: str | None, body_passed: bool) -> None:
    """Steady state, then the baseline, for a case whose bodies passed and that is not an xfail."""
    session: CostSession = item.config.stash[SESSION_KEY]
    if runner is None:
        return
    try:
        signatures = _signatures(item, runner.results)  # a failing body's dumps are kept too
    except costs.CostReadError as exc:
        if body_passed and not hasattr(report, "wasxfail"):
            _fail(report, f"cost signature unreadable: {exc}")
        return
    if not body_passed or hasattr(report, "wasxfail") or report.skipped or item.get_closest_marker("no_cost_check"):
        return
    if not signatures:
        # A case that measures nothing is not judged, unless the baseline measures it: a body that
        # stopped running its meter, or wiped the harness's key, reads as "no longer measured".
        base = None if session.update else session.baseline()
        if base is None or not base.compare(_case_id(item), signatures):
            return
    problems = [line for label, sig in sorted(signatures.items()) for line in costs.steady_state_problems(sig, label)]
    if problems:
        item.stash[CHANGES_KEY] = [f"steady state: {p}" for p in problems]
        _fail(
            report,
            "steady state: a step after the warm-up compiled a new graph (every step pays a compilation) "
            "or left more alive than the step before (every step leaks):\n" + "\n".join(f"  {p}" for p in problems),
        )
    case = _case_id(item)
    if session.update:
        if not problems and report.passed:
            session.updates.observe(item.nodeid, case, signatures, version)  # kept if its teardown passes (settle)
        return
    base = session.baseline()
    if base is None:
        return
    changes = base.compare(case, signatures)
    if changes is None:
        session.cases_without_entry.append(case)
        return
    if not changes:
        return
    lines = [str(c) for c in changes]
    item.stash[CHANGES_KEY] = item.stash.get(CHANGES_KEY, []) + lines
    listing = "\n".join(f"  {line}" for line in lines)
    if base.on_release_line(version) and report.passed:
        _fail(
            report,
            f"cost drift: {len(lines)} item(s) differ from {base.path.name} (taken on torch_xla "
            f"{base.torch_xla}; this run: {version}):\n{listing}\nIf the change is intended, rewrite the "
            f"entry: {baselinefile.rewrite_command(item, UPDATE_FLAG, session.option_name, base.path)}",
        )
    else:
        why = (
            f"torch_xla {version} is not on {base.torch_xla}'s release line"
            if not base.on_release_line(version)
            else "the case failed already"
        )
        report.sections.append((f"cost changes (reported, not failed: {why})", listing))


def settle(item: pytest.Item, passed: bool) -> None:
    """The case's call ended failed (passed=False) or its teardown reported: see baselinefile.Updates."""
    session = item.config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.updates.settle(item.nodeid, passed)


def _case_id(item: pytest.Item) -> str:
    """The case's key in the cost baseline, the sharding baseline's and the records' (results.case_id)."""
    return results.case_id(item.nodeid, item.path, item.config.rootpath)


def _fail(report: pytest.TestReport, message: str) -> None:
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:  # failed already (sharding drift): the cost finding is shown next to it
        report.sections.append(("cost check", message))


def record_fields(item: pytest.Item) -> dict[str, Any]:
    """The record's `costs` (comparable signatures) and `cost_changes` (lines, failed or reported)."""
    signatures = item.stash.get(SIGNATURES_KEY, {})
    changes = item.stash.get(CHANGES_KEY, [])
    return {"costs": {label: costs.comparable(sig) for label, sig in signatures.items()}, "cost_changes": list(changes)}


def keep_dumps(folder: Path, item: pytest.Item, failed: bool) -> None:
    """The partitioned modules of a failing case, for reading what the partitioner did."""
    dumps = item.stash.get(DUMPS_KEY, {})
    if not failed or not dumps:
        return
    target = folder / runfolder.COST_DUMPS_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name, text in dumps.items():
        (
            target / f"{results.safe_filename(_case_id(item))}__{results.safe_filename(name)}.after_optimizations.txt"
        ).write_text(text, encoding="utf-8")


def finish(pytest_session: pytest.Session) -> None:
    session = pytest_session.config.stash.get(SESSION_KEY, None)
    if session is None or not session.update:
        return
    session.updated, session.not_written = baselinefile.write_updates(
        pytest_session,
        session.updates,
        session.path,
        "cost",
        UPDATE_FLAG,
        lambda: CostBaseline.load(session.path, session.backend, session.devices),
        lambda: CostBaseline.empty(session.path, session.backend, session.devices),
    )


def summarise(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    baseline.summarise(
        terminalreporter,
        "cost",
        session.path,
        session.updated,
        session.cases_without_entry,
        UPDATE_FLAG,
        session.not_written,
    )
