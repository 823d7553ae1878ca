"""Child side: run a program on XLA and measure it for the metamorphic oracle: its outputs, how
many graphs it compiled, and the collectives of their partitioned modules (read by harness.costs
from the dumps the child's set-up asked XLA for, harness.xla.enable_step_dumps)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness import costs, xla
from harness.oracles.interpret import Place, run_program

GRAPH_NAME = f"{xla.STEP_GRAPH_PREFIX}oracle_"
# XLA's optimized (partitioned) module; its buffer assignment has a longer name and is skipped.
AFTER = "after_optimizations.txt"


def _dumps() -> list[Path]:
    folder = os.environ.get(xla.DUMP_DIR_ENV)
    return sorted(Path(folder).iterdir()) if folder and os.path.isdir(folder) else []


def _collectives() -> list[dict[str, Any]] | None:
    if not os.environ.get(xla.DUMP_DIR_ENV):
        return None  # the user's own --xla_dump_to: no dumps to read here
    found: list[dict[str, Any]] = []
    for path in _dumps():
        # Releases that cannot name graphs dump every module; this child compiled only ours.
        if path.name.endswith(AFTER) and (not xla.can_name_graphs() or GRAPH_NAME in path.name):
            found += costs.collectives(path.read_text(encoding="utf-8", errors="replace"), xla.num_devices(), path.name)
    return found


def measure_program(program: dict[str, Any]) -> dict[str, Any]:
    """{"status": "ok", "outputs", "compiles", "collectives"} or {"status": "xla_error", "detail"}."""
    for path in _dumps():
        path.unlink(missing_ok=True)  # graphs compiled before (the set-up's) are not this program's
    previous = xla.name_graphs(GRAPH_NAME)
    compiles = xla.counter("UncachedCompile")
    try:
        values = run_program(program, Place(program["mesh"]))
        outputs = [values[slot] for slot in program["outputs"]]
        xla.sync()
        xla.wait_device_ops()
        # Read before the outputs come to the host: torch_xla 2.4.0 gathers a sharded tensor for
        # .cpu() in a graph of its own (an all-gather), which that release's dumps cannot tell apart.
        counted = {"compiles": xla.counter("UncachedCompile") - compiles, "collectives": _collectives()}
        got = [tensor.cpu().tolist() for tensor in outputs]
    except Exception as exc:
        return {"status": "xla_error", "detail": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        if previous is not None:
            xla.name_graphs(previous)
    return {"status": "ok", "outputs": got, **counted}
