"""The plugin in a venv shared with other projects (black-box pytest runs, fake backend): its
options carry the `spmd` prefix and cannot collide with a project's own, every option is also an
ini key, and the run header says what the run uses. See harness/config/options.py."""

from __future__ import annotations

import os

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
    result.stdout.fnmatch_lines(["spmd harness *: backend fake, 2 devices, pr tier; *; results */out/run-*"])
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


# A foreign project of the same venv (issue 29): 25 plain tests, its own options (one of them
# spmd-like) and its own `needs` / `known_bug` markers, registered in its own ini under
# --strict-markers. The plugin must leave it alone: no process, no file, no line, no marker read.
FOREIGN_INI = """[pytest]
addopts = --strict-markers
markers =
    needs: this project's own resource marker
    known_bug: this project's own ticket marker
    slow: this project's slow tests
"""

FOREIGN_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--backend", default="sqlite")
    parser.addoption("--spmd-mode", default="off")  # spmd-like, but the project's
"""

FOREIGN_TESTS = """
import os
from pathlib import Path

import pytest


def harness_processes():
    # Every process in this project's folder (fork servers inherit pytest's cwd) but pytest's own
    # (under xdist: the controller and its workers), found by cwd, not by parentage: a run started
    # from inside another xdist run inherits PYTEST_XDIST_WORKER without being a worker.
    here = Path.cwd().resolve()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(proc / "cwd").resolve() != here:
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\\0", b" ").decode()
        except OSError:
            continue
        if "pytest" not in command and "execnet" not in command and " -c " not in command:
            found.append(command)
    return found


def test_options_are_the_projects(request):
    assert request.config.getoption("backend") == "postgres"
    assert request.config.getoption("spmd_mode") == "on"


def test_no_harness_process_runs_during_the_run():
    assert harness_processes() == []
    assert "XLA_DUMP_ROOT" not in " ".join(os.environ)


@pytest.mark.needs("network")
def test_needs_with_a_positional_argument():
    pass


@pytest.mark.needs(devices=8)
def test_needs_with_devices_is_not_skipped():
    pass


@pytest.mark.known_bug("JIRA-123")
def test_known_bug_names_a_ticket():
    pass


@pytest.mark.parametrize("n", range(20))
def test_plain(n):
    assert n == n
"""


PYTESTER_OWN = ("runpytest-", "stdout", "stderr")  # pytester's basetemp and captured streams


def _files(root) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if "__pycache__" not in p.parts and not p.relative_to(root).parts[0].startswith(PYTESTER_OWN)
    }


def _processes_in(folder) -> list[str]:
    """Processes but this one whose working folder is `folder` (fork servers inherit pytest's)."""
    from pathlib import Path

    folder = Path(folder).resolve()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != os.getpid() and Path(proc / "cwd").resolve() == folder:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="bare"),
        pytest.param(["-n", "2"], id="xdist"),
        pytest.param(["-m", "not slow"], id="m-other"),  # a marker expression that selects no spmd item
    ],
)
def test_a_bare_pytest_in_a_foreign_project_is_left_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, extra: list[str]
):
    # A foreign project's shell has no harness run around it (this suite's own run exports the
    # dump root to its children, pytester's included).
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT", raising=False)
    pytester.makeini(FOREIGN_INI)
    pytester.makeconftest(FOREIGN_CONFTEST)
    pytester.makepyfile(test_project=FOREIGN_TESTS)
    before = _files(pytester.path)
    result = pytester.runpytest_subprocess(
        "--backend=postgres", "--spmd-mode=on", "-p", "no:cacheprovider", *extra, timeout=120
    )
    result.assert_outcomes(passed=25)
    assert result.ret == pytest.ExitCode.OK
    assert not [line for line in result.outlines + result.errlines if "spmd harness" in line]
    assert _files(pytester.path) == before  # no results/run-*, nothing else
    assert _processes_in(pytester.path) == []  # nothing outlives the run


def test_a_foreign_projects_own_markers_are_listed_once_as_it_wrote_them(pytester: pytest.Pytester):
    pytester.makeini(FOREIGN_INI)
    result = pytester.runpytest_subprocess("--markers", "-p", "no:cacheprovider", timeout=120)
    needs = [line for line in result.outlines if line.startswith("@pytest.mark.needs")]
    assert needs == ["@pytest.mark.needs: this project's own resource marker"]
    assert sum(line.startswith("@pytest.mark.spmd") for line in result.outlines) == 1


def test_the_harness_markers_still_judge_spmd_items(pytester: pytest.Pytester):
    """On items marked spmd the old names keep their meaning: needs(devices=8) skips with the numbers,
    known_bug naming no registry entry is a usage error."""
    pytester.makepyfile(
        test_cases="""
import pytest

@pytest.mark.spmd
@pytest.mark.needs(devices=8, xla=False)
def test_too_many_devices():
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        "--spmd-backend=fake", "--spmd-devices=2", "-rs", "-p", "no:cacheprovider", timeout=120
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs 8 devices; backend fake has 2*"])
    pytester.makepyfile(
        test_cases="""
import pytest

@pytest.mark.spmd
@pytest.mark.known_bug("JIRA-123")
def test_named_bug():
    pass
"""
    )
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*known-bug registry:", "*JIRA-123*"])


def test_a_foreign_project_with_a_spmd_case_gets_the_header_after_collection(pytester: pytest.Pytester):
    pytester.makepyfile(test_project=PROJECT_TESTS.replace("def test_projects_own_options", "def _unused"))
    result = pytester.runpytest_subprocess(
        "--spmd-backend=fake", "--spmd-devices=2", "-p", "no:cacheprovider", timeout=120
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["collected 1 item", "spmd harness *: backend fake, 2 devices, pr tier; *; results *run-*"]
    )
    assert list(pytester.path.glob("results/run-*/verdicts-main.jsonl"))


def test_the_spmd_suite_alone_does_not_collect_the_self_tests():
    """`pytest -m spmd` in this repository (issue 29): the same cases as with both folders named,
    without collecting the ~900 self-tests only to deselect them (the repository's conftest.py)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]

    def collect(*args: str) -> list[str]:
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "spmd"]
        proc = subprocess.run([*command, *args], capture_output=True, text=True, cwd=repo, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.splitlines()

    alone = collect()
    named = collect("cases", "tests")
    items = [line for line in alone if "::" in line]
    assert items and items == [line for line in named if "::" in line]
    assert "deselected" not in alone[-1], alone[-1]  # before: 81/929 tests collected (848 deselected)


def test_under_xdist_the_smoke_then_the_slow_cases_start_first_and_a_serial_run_keeps_the_collection_order(tmp_path):
    """The repository's conftest.py: an xdist worker runs the smoke case first, then the `slow`
    cases, the rest in collection order after them; a serial run (and its --collect-only) keeps the
    collection order."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    # a file of quick cases collected before two of slow ones, the smoke case between those
    files = ["cases/test_costs.py", "cases/test_readback.py", "cases/test_smoke.py", "cases/test_startup_order.py"]
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--spmd-backend=fake", *files]

    def pytest_lines(*args: str) -> list[str]:
        proc = subprocess.run([*command, *args], capture_output=True, text=True, cwd=repo, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.splitlines()

    collected = [line for line in pytest_lines("--collect-only", "-q", "-m", "spmd") if "::" in line]
    slow = [line for line in pytest_lines("--collect-only", "-q", "-m", "spmd and slow") if "::" in line]
    assert slow and collected[: len(slow)] != slow, "the serial collection is sorted: it must keep its order"
    ran = pytest_lines("-m", "spmd", "-n", "1", "-v", f"--spmd-results-dir={tmp_path}")
    order = [m.group(1) for m in (re.match(r"\[gw0\] \[ *\d+%\] [A-Z]+ (\S+)", line) for line in ran) if m]
    smoke = [nodeid for nodeid in collected if nodeid.startswith("cases/test_smoke.py::")]
    assert smoke, collected
    assert order == smoke + slow + [nodeid for nodeid in collected if nodeid not in slow + smoke], order


OWN_SPMD_INI = """[pytest]
testpaths = cases
markers =
    spmd: this project's own sharded tests (not the harness's)
"""

OWN_SPMD_CASES = """
import pytest

pytestmark = pytest.mark.spmd

@pytest.fixture
def spmd():
    return "ours"

def test_own_meaning(spmd):
    assert spmd == "ours"
"""


@pytest.mark.parametrize("extra", [pytest.param([], id="bare"), pytest.param(["-m", "spmd"], id="m-spmd")])
def test_a_project_that_declares_its_own_spmd_marker_owns_it(pytester: pytest.Pytester, extra: list[str]):
    """A foreign project with its own `spmd` marker (declared in its ini) and a cases/ folder: its
    tests are its own, so no fork server starts, no results folder is written, no header is printed."""
    pytester.makeini(OWN_SPMD_INI)
    pytester.mkdir("cases")
    pytester.makepyfile(**{"cases/test_own": OWN_SPMD_CASES})
    before = _files(pytester.path)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *extra, timeout=120)
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines + result.errlines if "spmd harness" in line]
    assert _files(pytester.path) == before
    assert _processes_in(pytester.path) == []


def test_the_harness_fixture_in_a_project_that_owns_the_spmd_marker_says_what_to_do(pytester: pytest.Pytester):
    pytester.makeini(OWN_SPMD_INI)
    pytester.makepyfile(
        test_case="""
import pytest

def body(ctx):
    pass

@pytest.mark.spmd
def test_case(spmd):
    spmd.run(body)
"""
    )
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*this project declares its own 'spmd' marker*remove it from the ini's markers*"])
