"""Top-level conftest: deliberately thin. The harness is a plugin (harness/plugin.py, registered
through the pytest11 entry point); this file only enables pytester for the harness's self-tests,
picks the Hypothesis profile and keeps `-m spmd` from collecting the self-tests."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

pytest_plugins = ["pytester"]

# CI runs derandomized so a red build reproduces with the same examples on a laptop.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TESTS_DIR = "tests"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """`pytest -m spmd` (the SPMD suite alone) does not collect the ~900 self-tests only to
    deselect them all: none of them is marked spmd (tests/test_shared_venv.py holds this). Only
    when the paths are the ini's testpaths; a path given on the command line is collected as given."""
    if (config.option.markexpr or "").strip() == "spmd" and config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        config.args[:] = [arg for arg in config.args if Path(arg).name != TESTS_DIR]


SMOKE_CASES = "test_smoke.py"  # cases/test_smoke.py: an import and one sharded step


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist the smoke case starts first, then the `slow` cases (longest first, the
    classic fix for a schedule's tail), then the rest in collection order. xdist's worksteal hands
    each worker a contiguous half of the collection, and an idle worker steals from the end of the
    other's queue: the scan_layers loops, collected late and 10-40 s each on 2 cores, started when
    little else was left and ran alone at the end. The smoke case (a fraction of a second once the
    fork server is up) keeps the run's first verdict as early as before: the slow cases would
    otherwise be the first a worker finishes. A serial run keeps the collection order (the same
    total, and its first verdict comes first anyway). Every worker sorts the same collection the
    same way, as xdist requires."""
    if getattr(config, "workerinput", None) is not None:
        items.sort(key=lambda item: 0 if item.path.name == SMOKE_CASES else 1 if item.get_closest_marker("slow") else 2)
