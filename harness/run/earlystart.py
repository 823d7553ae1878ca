"""The run's start before pytest reads conftests and test modules (the plugin's
pytest_load_initial_conftests): for a run whose command line selects SPMD cases, its run folder
and its fork servers, so torch_xla's import overlaps pytest's own start-up. What is decided here
is a guess from the command line; pytest_configure decides again from the real config."""

from __future__ import annotations

from typing import Any

import pytest

from harness.config import activation, options
from harness.config.backends import make_backend
from harness.errors import HarnessError
from harness.isolation.parent import runservers
from harness.records import runfolder
from harness.run import caseuser
from harness.run.dumproot import share_dump_root
from harness.run.role import MAIN, looks_like_worker_early
from harness.run.session import EARLY_KEY, RUN_FOLDER_KEY, RUN_SERVERS_KEY, fork_server_wanted

# Options that make pytest print something and stop: the plugin then writes and starts nothing.
INFORMATION_ONLY_OPTIONS = ("help", "version", "collectonly", "markers", "showfixtures", "show_fixtures_per_test")


def _information_only(options: Any) -> bool:
    return any(getattr(options, name, False) for name in INFORMATION_ONLY_OPTIONS)


def start_servers(early_config: pytest.Config) -> None:
    """Before conftests and test modules load: start the run's fork servers (harness.isolation.parent.runservers),
    so torch_xla's import overlaps pytest's own start-up. Only for a run that may hold SPMD cases
    and will run them: `--help` or `--collect-only` write and start nothing."""
    if looks_like_worker_early():
        return  # only the controlling process starts servers; workers get their addresses
    namespace = early_config.known_args_namespace
    if activation.project_owns_spmd_marker(early_config):
        return  # its items marked spmd are its own: nothing starts early (nor late: activation.is_spmd)
    if _information_only(namespace) or not activation.selects_spmd_early(
        namespace, early_config.rootpath, early_config.getini("testpaths")
    ):
        return  # a run that may hold no SPMD case decides after collection (pytest_collection_finish)
    early_config.stash[EARLY_KEY] = True
    try:

        def value(name: str) -> Any:
            return options.value(early_config, name, namespace)

        if not caseuser.configure_early(value("spmd_case_user"), early_config.rootpath):
            return  # pytest_configure refuses the option: nothing may import the build before that
        backend = make_backend(value("spmd_backend"), value("spmd_devices"))
        wanted = fork_server_wanted(value("spmd_fork_server"), backend)
        run = runfolder.RunFolder.new(options.results_dir(early_config, namespace), value("spmd_run_id"))
    except (pytest.UsageError, HarnessError, AttributeError, ValueError, TypeError):
        return  # pytest_configure reports a bad option as a usage error
    early_config.stash[RUN_FOLDER_KEY] = run
    if not (wanted and runservers.servers_can_start(backend)):
        return
    try:
        share_dump_root(run.claim())
    except (HarnessError, OSError):
        return  # pytest_configure or the first case reports it
    servers = runservers.RunServers()
    early_config.stash[RUN_SERVERS_KEY] = servers
    now, after_collection = runservers.specs_to_start(backend, options.xdist_distributes(namespace))
    servers.start(now, run.path / runfolder.LOGS_DIR / MAIN, after_collection=after_collection)
