"""The `spmd` fixture's object: run a case body in a child and get a structured result back.

    def test_mark_sharding(spmd):
        result = spmd.run(body_mark_sharding, functionalization=False)
        assert parse_sharding(result.shardings["t"]) == ...

`run` raises CaseFailed / CaseCrashed / CaseTimedOut when the body did not finish cleanly
(pass `check=False` to get the result instead); the known-bug judge reads those errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.errors import CaseCrashed, CaseError, CaseFailed, HarnessUsageError
from harness.isolation.backend import Backend
from harness.isolation.parent import evidence
from harness.isolation.parent.child_process import ChildProcess, ChildSpec, LateFault
from harness.isolation.parent.evidence import fold_prefix_runs, headline, terminal_safe
from harness.isolation.parent.pool import ChildPool
from harness.isolation.system import files, processes
from harness.isolation.wire import protocol
from harness.isolation.wire.protocol import BodyRef, ChildAnswer, ChildException, json_problem

# Called with each LateFault: the plugin charges it to the case it names.
LateFaultSink = Callable[[LateFault], None]


@dataclasses.dataclass
class CaseResult:
    case: str
    outcome: str  # "ok" | "error" | "crashed" | "timeout" | "protocol"
    torch_xla: str | None
    duration_s: float
    exception: ChildException | None = None
    observations: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_tail: str = ""
    error: CaseError | None = None  # the parent-side error for anything but "ok"
    poisoned: str = ""  # what the body said of its process (ctx.poison), or left running

    @property
    def shardings(self) -> dict[str, str]:
        return Recorded("sharding", self.observations.get("shardings", {}))

    @property
    def hlo(self) -> dict[str, str]:
        return Recorded("HLO text", self.observations.get("hlo", {}))

    @property
    def values(self) -> dict[str, Any]:
        return Recorded("value", self.observations.get("values", {}))

    def raise_for_outcome(self) -> CaseResult:
        __tracebackhide__ = True  # the case's own line leads the traceback, not this one
        if self.error is not None:
            raise self.error
        return self


class Recorded(dict[str, Any]):  # subclassed for __missing__
    """What a case body recorded, by name. A name it did not record says which names it did."""

    def __init__(self, kind: str, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.kind = kind

    def __missing__(self, name: str) -> Any:
        recorded = ", ".join(sorted(self)) or "none"
        raise KeyError(f"the case recorded no {self.kind} named {name!r}; recorded: {recorded}")


# Case module file -> its SHA-256 when this process collected it (hold_sources), before any case
# ran: a body that rewrites a later case's module cannot change what that case's child runs.
HELD_SOURCES: dict[str, str] = {}


def hold_sources(folders: Iterable[Path]) -> None:
    """Take the content of every Python file in the folders of the collected cases (their modules
    and the helpers beside them), once, at the end of collection."""
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            key = str(path.resolve())
            if key not in HELD_SOURCES:
                with contextlib.suppress(OSError):
                    HELD_SOURCES[key] = hashlib.sha256(files.read_bytes(path)).hexdigest()


def body_ref(body: Callable[..., Any]) -> BodyRef:
    """Where a child can import `body` from; it must be a module-level function of a file."""
    name = getattr(body, "__qualname__", repr(body))
    module_name = getattr(body, "__module__", None)
    if not inspect.isfunction(body) or module_name in (None, "__main__") or "<" in name:
        raise HarnessUsageError(
            f"case body {name} must be a module-level function (def, not a lambda or a nested "
            f"function) in an importable file: the child imports it by name"
        )
    module = sys.modules.get(module_name)
    if module is None or getattr(module, name.split(".")[0], None) is None:
        raise HarnessUsageError(f"case body {name} cannot be found as {module_name}.{name}")
    path = Path(inspect.getfile(body)).resolve()
    # The folder to put on sys.path: one level up per dotted part (two for a package __init__).
    root = path.parents[module_name.count(".") + (1 if path.name == "__init__.py" else 0)]
    return BodyRef(module_name, name, str(root), HELD_SOURCES.get(str(path), ""))


def checked_kwargs(body: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs travel to the child as JSON: refuse, naming the key, what would not arrive intact."""
    for key, value in kwargs.items():
        problem = json_problem(value)
        if problem:
            raise HarnessUsageError(
                f"argument {key}={value!r:.80} of case body {body.__qualname__} is not strict JSON ({problem}); "
                f"pass numbers, text, lists and dicts of them (the body runs in another process)"
            )
    return kwargs


# Python 3.11's marks under a traceback's code line (`    ^^^^^^` / `~~~^^^`): half a deep
# child traceback's lines, and the code line above says where.
_CARET_LINE = re.compile(r"^[ \t]*[~^]+[ \t]*\n", re.MULTILINE)


def without_carets(traceback: str) -> str:
    return _CARET_LINE.sub("", traceback)


def failure_from_answer(case: str, answer: ChildAnswer, tail: str) -> CaseFailed:
    exc = ChildException.from_dict(answer.exception)
    assert exc is not None
    return CaseFailed(
        terminal_safe(
            f"{headline(exc.line, 1000)}\n(raised by case {case} in its child)\n{without_carets(exc.traceback)}"
            f"--- child log (this case) ---\n{fold_prefix_runs(tail)}"
        ),
        evidence=exc.line,
        log_tail=tail,
    )


def child_spec(
    backend: Backend, functionalization: bool = True, preload: bool = True, env: dict[str, str] | None = None
) -> ChildSpec:
    """The one place a child's spec is built from a backend and a case's wishes."""
    child_env = {**backend.child_env(functionalization), **(env or {})}
    if os.environ.get(protocol.CASE_USER_ENV):  # set by the plugin from --spmd-case-user
        child_env[protocol.CASE_USER_ENV] = os.environ[protocol.CASE_USER_ENV]
    return ChildSpec.build(child_env, backend.preload() if preload else (), fork_imports=backend.fork_imports(preload))


class SpmdRunner:
    def __init__(
        self,
        pool: ChildPool,
        backend: Backend,
        case_timeout: float,
        case_id: str,
        journal: Path | None = None,
        late_faults: LateFaultSink | None = None,
        tier: str = "pr",
    ) -> None:
        self.pool = pool
        # The run's tier (--spmd-tier: pr or nightly): a case sizes its loops by it, e.g.
        # `steps=20 if spmd.tier == "nightly" else 5`, and passes the size to its body.
        self.tier = tier
        self.backend = backend
        self.case_timeout = case_timeout
        self.case_id = case_id
        self.journal = journal  # requests-<worker>.jsonl: what ran where, for harness.replay
        self.late_faults = late_faults or _raise_late_fault
        self.results: list[CaseResult] = []  # what the plugin reports for this test

    def spec(
        self, functionalization: bool = True, preload: bool = True, env: dict[str, str] | None = None
    ) -> ChildSpec:
        return child_spec(self.backend, functionalization, preload, env)

    def run(
        self,
        body: Callable[..., Any],
        *,
        functionalization: bool = True,
        fresh: bool = False,
        preload: bool = True,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
        **kwargs: Any,
    ) -> CaseResult:
        """Run `body(ctx, **kwargs)` in a child of its own: a process that ran no other body.

        Every body gets a new child, forked from a server that imported torch_xla and ran no case
        code: what a body leaves in its process (a replaced function or `__code__`, a mode left
        entered, a hook, a global mesh) dies with it. Nothing is put back because nothing is reused.
        fresh: kept for the cases that say so; every child is fresh now.
        preload: run the backend's set-up (import torch_xla, use_spmd) before the body; a body
            that must see the process before torch_xla is imported passes False.
        """
        __tracebackhide__ = True  # a failing case's traceback starts at the case's own line
        del fresh  # every body's child is fresh (see above)
        spec = self.spec(functionalization, preload, env)
        ref = body_ref(body).to_dict()
        kwargs = checked_kwargs(body, kwargs)
        self._log_request(spec, {"case": self.case_id, "body": ref, "kwargs": kwargs}, True)
        for fault in self.pool.settle():  # children released unquiet end before this case starts
            self.late_faults(fault)
        child = self.pool.acquire(spec)
        server_was_up = child.server.is_usable()  # a spare forked before an earlier case killed it
        try:
            result, child = self._run_in(child, spec, ref, kwargs, timeout or self.case_timeout)
        except BaseException:
            self.pool.discard(child)  # Ctrl-C or an error of ours: never leave a busy child behind
            raise
        self.pool.release(child)
        _charge_server_fault(result, child, server_was_up)
        self.results.append(result)
        return result.raise_for_outcome() if check else result

    def _log_request(self, spec: ChildSpec, request: dict[str, Any], fresh: bool) -> None:
        """Journal the request before it runs, so even a run killed mid-case can be replayed."""
        if self.journal is None:
            return
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        entry = {"spec": dataclasses.asdict(spec), "fresh": fresh, "request": request}
        files.append_line(self.journal, json.dumps(entry))

    def _run_in(
        self, child: ChildProcess, spec: ChildSpec, ref: dict[str, str], kwargs: dict[str, Any], timeout: float
    ) -> tuple[CaseResult, ChildProcess]:
        case = self.case_id
        deadline = time.monotonic() + timeout
        try:
            try:
                request_id, offset = child.begin(case, ref, kwargs, deadline)
            except LateFault as fault:
                # The child was unfit before this case began: charge its last case, run this one
                # in a new child, whose failures are then this case's own.
                self.pool.discard(child)
                self.late_faults(fault)
                child = self.pool.replacement(spec)
                deadline = time.monotonic() + timeout
                request_id, offset = child.begin(case, ref, kwargs, deadline)
            answer = child.finish(case, request_id, deadline, offset)
        except CaseError as err:
            return CaseResult(case, err.outcome, child.torch_xla, 0.0, log_tail=err.log_tail, error=err), child
        tail = evidence.log_tail(child.log_path, offset)
        result = CaseResult(
            case,
            answer.outcome,
            child.torch_xla,
            answer.duration_s,
            exception=ChildException.from_dict(answer.exception),
            observations=answer.observations,
            log_tail=tail,
            poisoned=answer.poisoned,
        )
        if result.outcome == "error":
            result.error = failure_from_answer(case, answer, tail)
        return result, child


def _charge_server_fault(result: CaseResult, child: ChildProcess, server_was_up: bool) -> None:
    """A body that killed the fork server its child came from passes otherwise (the run starts
    another server and goes on green), and one that stopped it makes the next case wait for a
    server that never answers: its case is charged with either, and a stopped server is resumed."""
    ready = child.server.ready
    stopped = ready is not None and processes.continue_if_stopped(ready.pid)
    if result.error is not None:
        return
    if stopped:
        what, evidence_line = "was stopped during the case (its body sent SIGSTOP?; resumed)", "fork server stopped"
    elif server_was_up and not child.server.is_usable():
        what, evidence_line = "ended during the case (its body killed it?)", "fork server ended"
    else:
        return
    result.outcome = CaseCrashed.outcome
    result.error = CaseCrashed(
        f"case {result.case}: the fork server its child was forked from {what}; the verdict cannot be trusted",
        evidence=evidence_line,
        log_tail=result.log_tail,
    )


def _raise_late_fault(fault: LateFault) -> None:
    raise fault
