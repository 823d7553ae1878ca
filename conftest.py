"""Top-level conftest: deliberately thin. The harness is a plugin (harness/plugin.py, registered
through the pytest11 entry point); this file only enables pytester for the harness's self-tests
and picks the Hypothesis profile."""

import os

from hypothesis import settings

pytest_plugins = ["pytester"]

# CI runs derandomized so a red build reproduces with the same examples on a laptop.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
