"""The case body that checks programs in a child (imported there by name; harness.oracles.runner
starts it). It imports torch only inside, like every case body."""

from __future__ import annotations

import sys
from typing import Any

# One line on the child's log before each program: after a crash the parent reads the last one
# from the log tail to charge the crash to the program that was running (harness.oracles.runner).
MARKER = "harness-oracle: program {index} of {count} starts"


def body_check_programs(ctx: Any, programs: list[dict[str, Any]], fault: str | None = None) -> None:
    """Record one verdict per program (harness.oracles.compare), in order, as "verdicts"."""
    from harness.oracles import compare, faults

    if fault:
        ctx.poison(f"fault {fault} injected into torch_xla")  # this process must not run another case
        faults.inject(fault)
    verdicts = ctx.record("verdicts", [])
    for index, program in enumerate(programs):
        print(MARKER.format(index=index, count=len(programs)), file=sys.stderr, flush=True)
        verdicts.append(compare.check_program_on_xla(program))


def body_measure_program(ctx: Any, program: dict[str, Any], fault: str | None = None) -> None:
    """Record the program's measurement (harness.oracles.measure) as "measure"."""
    from harness.oracles import faults, measure

    if fault:
        ctx.poison(f"fault {fault} injected into torch_xla")
        faults.inject(fault)
    ctx.record("measure", measure.measure_program(program))
