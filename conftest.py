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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist the `slow` cases start first (longest first, the classic fix for a
    schedule's tail). xdist's worksteal hands each worker a contiguous half of the collection, and
    an idle worker steals from the end of the other's queue: the scan_layers loops, collected late
    and 10-40 s each on 2 cores, would start when little else was left and run alone at the end.
    A serial run keeps the collection order (the same total, and its first verdict comes sooner).
    Every worker sorts the same collection the same way, as xdist requires."""
    if getattr(config, "workerinput", None) is not None:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
