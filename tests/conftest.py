"""What the self-tests share: the repository's paths and the one way they run the plugin for real.

The tests import these (`from tests.conftest import REPO, run_fake`): a black-box self-test runs
pytest in a subprocess (the plugin starts processes and signal handlers, which an in-process run
would leave behind) on the fake backend, which needs no torch_xla.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

# `--hypothesis-profile=find-only`: no shrinking, so code that breaks a property shows every failing
# parameter quickly (how tests/test_report_hostile.py was shown to fail before its fixes).
settings.register_profile("find-only", phases=[Phase.explicit, Phase.generate])

REPO = Path(__file__).resolve().parents[1]  # the checkout under test
FAKE_RUN = ("--spmd-backend=fake", "-p", "no:cacheprovider")


def run_fake(pytester: pytest.Pytester, *args: str, timeout: float = 120) -> pytest.RunResult:
    """A real pytest run of pytester's files on the fake backend. `timeout` turns a hang into a
    failure (what several self-tests look for)."""
    return pytester.runpytest_subprocess(*FAKE_RUN, *args, timeout=timeout)


CPU_RUN = ("--spmd-backend=cpu", "--spmd-devices=4", "-p", "no:cacheprovider")


def run_cpu(pytester: pytest.Pytester, *args: str, timeout: float = 300) -> pytest.RunResult:
    """A real pytest run of pytester's files on real torch_xla: the CPU backend, 4 virtual devices."""
    return pytester.runpytest_subprocess(*CPU_RUN, *args, timeout=timeout)


def only_run_folder(pytester: pytest.Pytester, results: str = "results") -> Path:
    """The one run folder a run made under pytester's results folder (never the `latest` link)."""
    (folder,) = (p for p in (pytester.path / results).glob("run-*") if not p.is_symlink())
    return folder


def spmd_report(*args: str, text: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """`python -m harness.report ARGS` run as CI's report step runs it: from the checkout, output
    captured, a hang a failure (60 s). kwargs go to subprocess.run (env, timeout, cwd)."""
    kwargs.setdefault("cwd", REPO)
    kwargs.setdefault("timeout", 60)
    return subprocess.run([sys.executable, "-m", "harness.report", *args], capture_output=True, text=text, **kwargs)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """`proc` for the block; at its end, however it ends, killed if still running, reaped and its
    pipes closed. A test that fails on a timeout (`communicate(timeout=...)`) must not leave its
    pytest running into the tests after it, nor a Popen that a later test's gc.collect() reports."""
    with proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
