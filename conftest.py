"""Top-level conftest: deliberately thin. The harness is a plugin (harness/plugin.py, registered
through the pytest11 entry point); this file only enables pytester for the harness's self-tests."""

pytest_plugins = ["pytester"]
