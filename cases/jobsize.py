"""The sizes of the training job's decoder, by name (--spmd-job-size; harness.config.options.JOB_SIZES
lists the same names). Free of torch: the case modules read it at collection.

`tiny` is what the CPU cases train and the baselines hold: a step compiles in well under a second.
The larger ones are for the nightly GKE job on TPU slices, where the same cases train a model whose
matmuls and collectives are big enough to be worth a device (and whose CPU reference still runs on
the host in seconds per step): `small` about a million parameters, `medium` about 30 million.
"""

from __future__ import annotations

DEFAULT = "tiny"

# vocab, model width, attention heads, MLP width, layers, tokens per row
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"vocab": 64, "dim": 32, "heads": 4, "hidden": 64, "depth": 2, "tokens": 8},
    "small": {"vocab": 512, "dim": 128, "heads": 4, "hidden": 384, "depth": 4, "tokens": 64},
    "medium": {"vocab": 4096, "dim": 512, "heads": 8, "hidden": 1408, "depth": 8, "tokens": 256},
}
