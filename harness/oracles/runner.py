"""Parent side: check many programs per child; a program that kills its child is charged with it.

A batch of programs goes to one child (harness.oracles.body), which records a verdict per
program. When the child dies (a crash, a timeout, a protocol failure), the verdicts it held die
with it: the last start marker in its log tail names the program that was running, that program
gets the crash as its verdict, and the others of the batch run again in a new child. Without a
marker (a log tail cut short), the batch runs again one program per child.
"""

from __future__ import annotations

import re
from typing import Any

from harness.errors import HarnessError
from harness.isolation.parent.evidence import headline
from harness.oracles.body import body_check_programs

STATUSES = ("ok", "mismatch", "xla_error", "invalid", "crashed", "timeout", "protocol")
FAILING = tuple(status for status in STATUSES if status != "ok")
_MARKER = re.compile(r"^harness-oracle: program (\d{1,6}) of (\d{1,6}) starts$", re.MULTILINE)


class OracleRunError(HarnessError):
    """The oracle's own machinery failed in a child (not a verdict on torch_xla)."""


def check_programs(
    spmd: Any, programs: list[dict[str, Any]], fault: str | None = None, batch: int = 16, fresh: bool = False
) -> list[dict[str, str]]:
    """One verdict {"status", "detail"} per program, in order; fresh: each batch in a new process."""
    verdicts: dict[int, dict[str, str]] = {}
    queue = list(range(len(programs)))
    size = batch
    while queue:
        chunk, queue = queue[:size], queue[size:]
        result = spmd.run(
            body_check_programs,
            programs=[programs[i] for i in chunk],
            fault=fault,
            fresh=fresh or bool(fault),
            check=False,
        )
        if result.outcome == "ok":
            verdicts.update(zip(chunk, _answered(result.values.get("verdicts"), len(chunk)), strict=True))
            continue
        if result.outcome == "error":  # the body itself raised: our bug, not a verdict
            raise OracleRunError(f"the oracle's case body failed: {result.error}")
        running = _running(result.log_tail, len(chunk))
        if running is None and len(chunk) > 1:
            queue, size = chunk + queue, 1  # unattributable: one program per child from here
            continue
        culprit = chunk[running or 0]
        verdicts[culprit] = crash_verdict(result)
        queue = [i for i in chunk if i != culprit] + queue
    return [verdicts[i] for i in range(len(programs))]


def _running(log_tail: str, count: int) -> int | None:
    """The program a dead child was running: its last start marker, if the tail still holds one."""
    found = [int(m.group(1)) for m in _MARKER.finditer(log_tail or "") if int(m.group(2)) == count]
    return found[-1] if found and found[-1] < count else None


def _answered(raw: Any, count: int) -> list[dict[str, str]]:
    """The child's verdicts, checked: the child ran the code under test, so they are untrusted."""
    if not isinstance(raw, list) or len(raw) != count:
        raise OracleRunError(f"the child answered {type(raw).__name__} for {count} programs' verdicts")
    answered = []
    for item in raw:
        status = item.get("status") if isinstance(item, dict) else None
        if status not in STATUSES or not isinstance(item.get("detail"), str):
            raise OracleRunError(f"a verdict from the child is malformed: {str(item)[:200]!r}")
        answered.append({"status": status, "detail": item["detail"][:4000]})
    return answered


def crash_verdict(result: Any) -> dict[str, str]:
    """The verdict of a program that killed its child (a crash, a timeout): charged to the program,
    its evidence's first lines as the detail."""
    evidence = getattr(result.error, "evidence", "") or str(result.error)
    return {"status": result.outcome, "detail": headline(evidence, 2000)}
