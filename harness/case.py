"""The `spmd` fixture's object: run a case body in a child and get a structured result back.

    def test_mark_sharding(spmd):
        result = spmd.run(body_mark_sharding, functionalization=False)
        assert parse_sharding(result.shardings["t"]) == ...

`run` raises CaseFailed / CaseCrashed / CaseTimedOut when the body did not finish cleanly
(pass `check=False` to get the result instead); the known-bug judge reads those errors.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any, Callable

from harness.backends import Backend
from harness.errors import CaseCrashed, CaseError, CaseFailed, CaseTimedOut, HarnessUsageError
from harness.protocol import BodyRef, ChildException
from harness.runner import ChildPool, ChildSpec


@dataclasses.dataclass
class CaseResult:
    case: str
    outcome: str  # "ok" | "error" | "crashed" | "timeout"
    torch_xla: str | None
    duration_s: float
    exception: ChildException | None = None
    observations: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_tail: str = ""
    error: CaseError | None = None  # the parent-side error for anything but "ok"

    @property
    def shardings(self) -> dict[str, str]:
        return self.observations.get("shardings", {})

    @property
    def hlo(self) -> dict[str, str]:
        return self.observations.get("hlo", {})

    @property
    def values(self) -> dict[str, Any]:
        return self.observations.get("values", {})

    def raise_for_outcome(self) -> "CaseResult":
        if self.error is not None:
            raise self.error
        return self


def body_ref(body: Callable[..., Any]) -> BodyRef:
    """Where a child can import `body` from; it must be a module-level function of a file."""
    module = body.__module__
    if module == "__main__" or "<locals>" in body.__qualname__:
        raise HarnessUsageError(
            f"case body {body.__qualname__} must be a module-level function in an importable file"
        )
    path = Path(inspect.getfile(body)).resolve()
    # The folder to put on sys.path: one level up per dotted part (two for a package __init__).
    root = path.parents[module.count(".") + (1 if path.name == "__init__.py" else 0)]
    return BodyRef(module, body.__qualname__, str(root))


def failure_from_verdict(case: str, verdict: dict[str, Any]) -> CaseFailed:
    exc = ChildException.from_dict(verdict["exception"])
    assert exc is not None
    return CaseFailed(
        f"case {case} raised in its child:\n{exc.traceback}--- child log (this case) ---\n{verdict.get('log_tail', '')}",
        evidence=exc.line, log_tail=verdict.get("log_tail", ""),
    )


class SpmdRunner:
    def __init__(
        self, pool: ChildPool, backend: Backend, case_timeout: float, case_id: str, journal: Path | None = None
    ) -> None:
        self.pool = pool
        self.backend = backend
        self.case_timeout = case_timeout
        self.case_id = case_id
        self.journal = journal  # requests-<worker>.jsonl: what ran where, for harness.replay
        self.results: list[CaseResult] = []  # what the plugin reports for this test

    def spec(self, functionalization: bool = True, preload: bool = True, env: dict[str, str] | None = None) -> ChildSpec:
        child_env = {**self.backend.child_env(functionalization), **(env or {})}
        return ChildSpec.build(child_env, self.backend.preload() if preload else ())

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
        """Run `body(ctx, **kwargs)` in a child.

        fresh: the body poisons or inspects process-wide state (JAX start-up, a reintroduced bug,
            an expected crash), so it gets a child of its own that is discarded afterwards.
        preload: run the backend's set-up (import torch_xla, use_spmd) before the body; a body
            that must see the process before torch_xla is imported passes False (implies fresh).
        """
        fresh = fresh or not preload
        spec = self.spec(functionalization, preload, env)
        request = {"case": self.case_id, "body": body_ref(body).to_dict(), "kwargs": kwargs}
        self._log_request(spec, request, fresh)
        child = self.pool.acquire(spec, fresh=fresh)
        result = self._run_in(child, request, timeout or self.case_timeout)
        self.pool.release(child, reusable=not fresh and result.outcome in ("ok", "error"))
        self.results.append(result)
        return result.raise_for_outcome() if check else result

    def _log_request(self, spec: ChildSpec, request: dict[str, Any], fresh: bool) -> None:
        """Journal the request before it runs, so even a run killed mid-case can be replayed."""
        if self.journal is None:
            return
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        entry = {"spec": dataclasses.asdict(spec), "fresh": fresh, "request": request}
        with self.journal.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def _run_in(self, child: Any, request: dict[str, Any], timeout: float) -> CaseResult:
        case = self.case_id
        try:
            verdict = child.run(request, timeout)
        except (CaseCrashed, CaseTimedOut) as err:
            outcome = "crashed" if isinstance(err, CaseCrashed) else "timeout"
            return CaseResult(case, outcome, child.torch_xla, 0.0, log_tail=err.log_tail, error=err)
        result = CaseResult(
            case, verdict["outcome"], child.torch_xla, verdict["duration_s"],
            exception=ChildException.from_dict(verdict["exception"]),
            observations=verdict["observations"], log_tail=verdict.get("log_tail", ""),
        )
        if result.outcome == "error":
            result.error = failure_from_verdict(case, verdict)
        return result

