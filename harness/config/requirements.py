"""What a case needs from its backend, resolved at run time into a skip reason with numbers.

@pytest.mark.needs(devices=8, jax=True)          # on top of the implied xla=True for spmd cases
@pytest.mark.needs(backend="tpu", multislice=True)
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.isolation.backend import Backend

KNOWN_NEEDS = {"backend", "devices", "jax", "multislice", "xla", "reason"}


def collect_needs(item: pytest.Item) -> dict[str, Any]:
    """Merge every `needs` marker on the item; spmd cases need torch_xla unless they say xla=False."""
    needs: dict[str, Any] = {"xla": item.get_closest_marker("spmd") is not None}
    for marker in reversed(list(item.iter_markers("needs"))):  # closest marker wins
        unknown = set(marker.kwargs) - KNOWN_NEEDS
        if unknown or marker.args:
            raise pytest.UsageError(
                f"{item.nodeid}: needs() takes keyword arguments {sorted(KNOWN_NEEDS)}, got {sorted(unknown) or marker.args}"
            )
        needs.update(marker.kwargs)
    return needs


def unmet_needs(item: pytest.Item, backend: Backend) -> str | None:
    needs = collect_needs(item)
    wanted_backend = needs.get("backend")
    if wanted_backend:
        allowed = (wanted_backend,) if isinstance(wanted_backend, str) else tuple(wanted_backend)
        if backend.name not in allowed:
            why = f" ({needs['reason']})" if needs.get("reason") else ""
            return f"needs backend {' or '.join(allowed)}; this run uses backend {backend.name}{why}"
    caps = backend.capabilities()
    if needs.get("xla") and not caps.has_xla:
        return f"needs torch_xla; backend {backend.name} runs without it"
    devices = int(needs.get("devices") or 0)
    if devices > caps.devices:
        return f"needs {devices} devices; backend {backend.name} has {caps.devices}"
    if needs.get("jax") and not caps.has_jax:
        return f"needs jax (pip install 'torch_xla[pallas]'); backend {backend.name} has none"
    if needs.get("multislice") and caps.slices < 2:
        return f"needs a multi-slice job (MEGASCALE_NUM_SLICES >= 2); backend {backend.name} sees {caps.slices} slice"
    return None


def tier_skip_reason(item: pytest.Item, tier: str) -> str | None:
    """A `nightly` case outside the nightly tier: skipped, naming how to run it."""
    if tier != "nightly" and item.get_closest_marker("nightly") is not None:
        return "nightly tier only: run with --spmd-tier=nightly (or SPMD_TIER=nightly) to include it"
    return None
