"""Cost signatures of training steps: what a step compiles, executes and communicates.

The SPMD regressions users report most change neither an outcome nor a sharding: a spec that
flips between '' and '{replicated}' makes every step compile a new graph (pytorch/xla#9755),
memory grows 2.5x between nightlies (#8423). On CPU XLA their causes are deterministic and cheap
to read, so a case's training loop records them (harness.stepcosts, in the child) as a
*signature*, a JSON value:

    {"warmup": 2,
     "steps":  [{"compiles": 1, "cache_hits": 0, "executions": 1, "graphs": ["step0"]}, ...],
     "graphs": {"step0": {"collectives": [{"kind": "all-gather", "replica_groups": "{{0,1,2,3}}",
                                           "count": 3, "bytes_per_device": 3072}, ...],
                          "aliases": {"donated": 4, "parameters": 9}, "memory": {...}}},
     "memory": {"parameters": 51200, "gradients": 51200, "optimizer_state": 0}}

* per step (deltas of torch_xla's metrics around it): graphs compiled new (`UncachedCompile`),
  graphs served from the compilation cache (`CachedCompile`), executions (`ExecuteReplicated`);
* per distinct compiled step graph (named after the step that compiled it), the collectives of
  XLA's partitioned, optimized module (`*after_optimizations.txt`), read by opcode, never by
  SSA name, grouped by kind and replica groups, with the bytes each device moves;
* the bytes of parameters, gradients and optimizer state one device holds, from each tensor's
  shape and sharding (the device holding the most, where tiles are uneven).

This package is the pure part (standard library only, so the parent pytest process imports it),
one module per job, every public name also here (`from harness import costs; costs.compare`):
  hloread.py     reading a partitioned module: collectives, buffer memory, donations, fingerprint
  signature.py   a signature's fields and the check of one read back from a child or a file
  steady.py      the steady-state rule: what must stop growing after the warm-up, native growth
  comparison.py  two signatures item by item (counts exactly, bytes in a band), for the cost
                 baseline (harness.costbaseline), the base run, the release matrix and GKE
  rendering.py   figures as people read them (kib, summary, the matrix's cell)
The child-side meter that writes signatures is harness.stepcosts (its parts: harness/metering/).
"""

from __future__ import annotations

from harness.costs.comparison import (
    BYTES_BAND_FLOOR,
    BYTES_BAND_RELATIVE,
    FAILS,
    IMPROVEMENT,
    WITHIN_BAND,
    CostChange,
    band_text,
    bytes_judgement,
    compare,
    compare_loops,
    failing,
    listed,
)
from harness.costs.hloread import (
    ELEMENT_BYTES,
    CostReadError,
    buffer_memory,
    collectives,
    entry_inputs,
    fingerprint,
    input_differences,
    module_aliases,
    module_donations,
    program_bytes,
    read_module,
    replica_groups,
    shape_bytes,
    tensor_bytes_per_device,
)
from harness.costs.rendering import (
    collective_groups,
    collectives_listing,
    held_cell,
    kib,
    label_prefix,
    signed_kib,
    summary,
)
from harness.costs.signature import (
    BASELINED_LIVE_FIELDS,
    CAPTURES_VALUE,
    DEFAULT_LABEL,
    DEFAULT_WARMUP,
    DUMPS_VALUE,
    GRAPH_ALIAS_FIELDS,
    GRAPH_MEMORY_FIELDS,
    HELD_PEAK_NAME,
    LIVE_FIELDS,
    MAX_CALL_NAMES,
    MAX_CAPTURE_BYTES,
    MAX_CAPTURES,
    MAX_MEMRAY_STEPS,
    MEMORY_FIELDS,
    NATIVE_FIELDS,
    NATIVE_NAMES,
    SIGNATURES_VALUE,
    STEP_FIELDS,
    CountersReset,
    calls_per_step,
    check_signature,
    comparable,
    new_buffers,
)
from harness.costs.steady import (
    LEAK_STEPS,
    METERED_STEPS,
    NATIVE_GROWTH_PER_STEP,
    NATIVE_MARGIN_OVER_BASE,
    NATIVE_SLOPE_PER_STEP,
    NIGHTLY_METERED_STEPS,
    SLOPE_MIN_STEPS,
    STACK_TRACKER_TAKEN,
    STACK_WINDOW_FIRST,
    STACK_WINDOW_STEPS,
    metered_steps,
    native_against_base,
    native_growth,
    slow_leaks,
    stack_judge_missing,
    steady_state_problems,
    with_native,
)

__all__ = [
    "FAILS",
    "IMPROVEMENT",
    "WITHIN_BAND",
    "BASELINED_LIVE_FIELDS",
    "BYTES_BAND_FLOOR",
    "BYTES_BAND_RELATIVE",
    "CAPTURES_VALUE",
    "CostChange",
    "CostReadError",
    "CountersReset",
    "DEFAULT_LABEL",
    "DEFAULT_WARMUP",
    "DUMPS_VALUE",
    "ELEMENT_BYTES",
    "GRAPH_ALIAS_FIELDS",
    "GRAPH_MEMORY_FIELDS",
    "HELD_PEAK_NAME",
    "LEAK_STEPS",
    "LIVE_FIELDS",
    "MAX_CALL_NAMES",
    "MAX_CAPTURES",
    "MAX_CAPTURE_BYTES",
    "MEMORY_FIELDS",
    "MAX_MEMRAY_STEPS",
    "METERED_STEPS",
    "NATIVE_FIELDS",
    "NATIVE_GROWTH_PER_STEP",
    "NATIVE_MARGIN_OVER_BASE",
    "NATIVE_NAMES",
    "NATIVE_SLOPE_PER_STEP",
    "NIGHTLY_METERED_STEPS",
    "SIGNATURES_VALUE",
    "SLOPE_MIN_STEPS",
    "STACK_TRACKER_TAKEN",
    "STACK_WINDOW_FIRST",
    "STACK_WINDOW_STEPS",
    "STEP_FIELDS",
    "band_text",
    "buffer_memory",
    "bytes_judgement",
    "calls_per_step",
    "check_signature",
    "collective_groups",
    "collectives",
    "collectives_listing",
    "comparable",
    "compare",
    "compare_loops",
    "entry_inputs",
    "failing",
    "fingerprint",
    "held_cell",
    "input_differences",
    "kib",
    "label_prefix",
    "listed",
    "metered_steps",
    "module_aliases",
    "module_donations",
    "native_against_base",
    "native_growth",
    "new_buffers",
    "program_bytes",
    "read_module",
    "replica_groups",
    "shape_bytes",
    "signed_kib",
    "slow_leaks",
    "stack_judge_missing",
    "steady_state_problems",
    "summary",
    "tensor_bytes_per_device",
    "with_native",
]

# Each public class says it is harness.costs's, as it was before the package was split: a child's
# exception is reported by its class's module and name (`harness.costs.CountersReset`).
for _cls in (CostChange, CostReadError, CountersReset):
    _cls.__module__ = __name__
