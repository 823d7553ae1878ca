"""The pytest process must never import torch or torch_xla: case files and harness modules are
imported there, and only case bodies (in children) may import them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.selftest

# Imported by child processes only: the oracle's interpreter and comparison run programs in torch
# (harness.oracles.body imports them inside the body).
IN_CHILDREN_ONLY = {
    "harness.xla",
    "harness.isolation.child.main",
    "harness.oracles.compare",
    "harness.oracles.interpret",
    "harness.oracles.measure",
}


def test_importing_the_harness_and_every_case_file_loads_no_torch():
    # Every module of every subpackage (isolation/, gke/, matrix/, ...): a new one is covered without
    # editing this list. A package's __init__ counts as the package itself.
    modules = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in (REPO / "harness").rglob("*.py")]
    modules = [m.removesuffix(".__init__") for m in modules]
    modules += [f"cases.{p.stem}" for p in (REPO / "cases").glob("test_*.py")]
    modules = sorted(set(modules) - IN_CHILDREN_ONLY)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'torch_xla', 'jax') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"imported in the parent: {out.stdout.strip()}"
