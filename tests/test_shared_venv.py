"""The plugin in a venv shared with other projects (black-box pytest runs, fake backend): its
options carry the `spmd` prefix and cannot collide with a project's own, every option is also an
ini key, and the run header says what the run uses. See harness/options.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.selftest

PROJECT_CONFTEST = """
def pytest_addoption(parser):
    # Generic names a project may well use for itself.
    parser.addoption("--backend", default="sqlite")
    parser.addoption("--devices", default="none")
"""

PROJECT_TESTS = """
import pytest

def test_projects_own_options(request):
    assert request.config.getoption("backend") == "postgres"
    assert request.config.getoption("devices") == "gpu0"

def body(ctx):
    ctx.record("devices", int(__import__("os").environ["HARNESS_DEVICES"]))

@pytest.mark.spmd
@pytest.mark.needs(xla=False)
def test_spmd_case(spmd):
    assert spmd.run(body).values["devices"] == 2
"""


def test_a_project_that_defines_backend_and_devices_runs_beside_the_plugin(pytester: pytest.Pytester):
    pytester.makeconftest(PROJECT_CONFTEST)
    pytester.makepyfile(test_project=PROJECT_TESTS)
    result = pytester.runpytest_subprocess(
        "--backend=postgres",
        "--devices=gpu0",
        "--spmd-backend=fake",
        "--spmd-devices=2",
        "-p",
        "no:cacheprovider",
        timeout=120,
    )
    result.assert_outcomes(passed=2)


def test_ini_keys_configure_the_run_and_the_header_says_so(pytester: pytest.Pytester):
    pytester.makeini(
        "[pytest]\nspmd_backend = fake\nspmd_devices = 2\nspmd_case_timeout = 30\nspmd_results_dir = out\n"
    )
    pytester.makepyfile(test_project=PROJECT_TESTS.replace("def test_projects_own_options", "def _unused"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["spmd harness *: backend fake, 2 devices; *; results */out/run-*"])
    assert list((pytester.path / "out").glob("run-*/verdicts-main.jsonl"))


def test_the_command_line_beats_the_ini_file(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nspmd_backend = fake\nspmd_devices = 2\n")
    pytester.makepyfile(
        test_project=PROJECT_TESTS.replace("== 2", "== 3").replace("def test_projects_own_options", "def _unused")
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--spmd-devices=3", timeout=120)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "line, message",
    [
        pytest.param(
            "spmd_devices = 0", "*ini key spmd_devices = '0'*: '0' is not a positive whole number*", id="devices"
        ),
        pytest.param(
            "spmd_backend = gpu", "*ini key spmd_backend = 'gpu'*: 'gpu' is not one of cpu, tpu, fake*", id="backend"
        ),
        pytest.param(
            "spmd_case_timeout = nan", "*ini key spmd_case_timeout = 'nan'*not a positive, finite number*", id="timeout"
        ),
    ],
)
def test_a_bad_ini_value_is_a_usage_error_naming_the_key(pytester: pytest.Pytester, line: str, message: str):
    pytester.makeini(f"[pytest]\n{line}\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_each_marker_is_listed_once(pytester: pytest.Pytester):
    result = pytester.runpytest_subprocess("--markers", "-p", "no:cacheprovider", timeout=120)
    for marker in ("spmd", "needs", "known_bug", "no_sharding_baseline"):
        assert sum(line.startswith(f"@pytest.mark.{marker}") for line in result.outlines) == 1, marker
