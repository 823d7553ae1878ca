"""The training job's size, --spmd-job-size, for the cases that take it: a plugin of its own
(harness.plugin registers this module), a fixture and the hook that puts a size in case ids.

The size is read at collection (a parametrization), where no fixture runs yet; the cases that
take `spmd_job_size` size their decoder by it (cases/jobsize.py lists the sizes).
"""

from __future__ import annotations

import pytest

from harness.config import options


@pytest.fixture
def spmd_job_size() -> str:
    """The training job's size (--spmd-job-size) for a case that takes this argument: the default,
    tiny, what the committed baselines hold; another size parametrizes the case instead
    (pytest_generate_tests below)."""
    return options.JOB_SIZES[0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A case that takes `spmd_job_size` runs at the run's size; a size other than the default goes
    into its id (`[job-small-fsdp]`): the baselines hold the default's shardings and costs under the
    plain ids, so a larger job has no entry there (listed, not failed), and a base run compares it
    with a base of the same size."""
    if "spmd_job_size" not in metafunc.fixturenames:
        return
    size = options.value(metafunc.config, "spmd_job_size")
    if size != options.JOB_SIZES[0]:
        metafunc.parametrize("spmd_job_size", [size], ids=[f"job-{size}"])
