"""The training job's size, --spmd-job-size, for the cases that take it: a plugin of its own
(harness.plugin registers this module), a fixture and the hook that puts a size in case ids.

The size is read once, at configure (`configure`; the run header says it, run.json does not), and put
into ids at collection (a parametrization, where no fixture runs yet). The cases that take
`spmd_job_size` size their decoder by it (cases/jobsize.py lists the sizes). Only this plugin's
own fixture is parametrized: a suite with a `spmd_job_size` fixture or parametrization of its own
keeps it as it wrote it.
"""

from __future__ import annotations

import re

import pytest

from harness.config import options

DEFAULT = options.JOB_SIZES[0]  # what the committed baselines hold
SIZE_KEY = pytest.StashKey[str]()


def configure(config: pytest.Config) -> str:
    """The run's job size, read once (a module that sets $SPMD_JOB_SIZE at import changes nothing)."""
    config.stash[SIZE_KEY] = options.value(config, "spmd_job_size")
    return config.stash[SIZE_KEY]


def size_of(config: pytest.Config) -> str:
    return config.stash.get(SIZE_KEY, DEFAULT)


@pytest.fixture
def spmd_job_size() -> str:
    """The training job's size (--spmd-job-size) for a case that takes this argument: the default,
    tiny, what the committed baselines hold; another size parametrizes the case instead
    (pytest_generate_tests below)."""
    return DEFAULT


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A case that takes `spmd_job_size` runs at the run's size; a size other than the default goes
    into its id (`[job-small-fsdp]`): the baselines hold the default's shardings and costs under the
    plain ids, so a larger job has no entry there, and a base run compares it with a base of the
    same size."""
    size = size_of(metafunc.config)
    if size == DEFAULT or not _takes_our_fixture(metafunc):
        return
    metafunc.parametrize("spmd_job_size", [size], ids=[f"job-{size}"])


def _takes_our_fixture(metafunc: pytest.Metafunc) -> bool:
    """The test's `spmd_job_size` is this plugin's fixture: not a conftest's or a module's of the
    same name, and not a parametrization the test writes itself."""
    if "spmd_job_size" not in metafunc.fixturenames:
        return False
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        if "spmd_job_size" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)):
            return False
    definitions = metafunc._arg2fixturedefs.get("spmd_job_size") or ()
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == __name__


# `[job-small-fsdp]`, `[job-medium]`: the id part pytest_generate_tests adds.
_ID_PART = re.compile(r"\[job-(" + "|".join(options.JOB_SIZES) + r")(-|(?=\]))")


def size_in_id(case_id: str) -> str | None:
    """The job size a case id carries (None: the default's plain id)."""
    match = _ID_PART.search(case_id)
    return match.group(1) if match else None


def plain_id(case_id: str) -> str:
    """The case's id at the default size: `t[job-small-fsdp]` -> `t[fsdp]`, `t[job-small]` -> `t`."""
    return _ID_PART.sub("[", case_id, count=1).replace("[]", "")
