"""Update runs of both baselines (harness.baselinefile) through real pytest runs on the fake backend:
two at once on one file, under xdist, a case that errors in teardown, an interrupted run, another
release line, hostile ids in the printed commands, cases outside the rootdir.

Each case body records the shardings and the cost signature the test asks for (CASE_CONFIG); the
fake child claims the torch_xla version in HARNESS_FAKE_TORCH_XLA.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import reaped
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

BODY = """
import json
import os
import pathlib
import time

import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]


def body(ctx, shardings, signature, rendezvous, hang, plant):
    for folder in plant or []:  # an attacker's body: entries for cases this run does not take
        for name in ("shardings.json", "costs.json"):
            path = pathlib.Path(folder, name)
            data = json.loads(path.read_text())
            some_entry = next(iter(data["cases"].values()))
            data["cases"]["test_cases.py::test_never_taken"] = some_entry
            if name == "shardings.json":
                data["cases"]["test_cases.py::test_b"] = {"w": "{planted}"}
            path.write_text(json.dumps(data))
    for name, spec in shardings.items():
        ctx.record_sharding(name, spec)
    ctx.record("harness:costs", {"train": signature})
    if rendezvous:  # [mine, other]: both runs are past their configure (the baseline read) before either ends
        pathlib.Path(rendezvous[0]).touch()
        deadline = time.time() + 60
        while not pathlib.Path(rendezvous[1]).exists() and time.time() < deadline:
            time.sleep(0.05)
    if hang:
        pathlib.Path(hang).touch()
        time.sleep(120)


def run_case(spmd, name):
    config = json.loads(os.environ["CASE_CONFIG"])
    spmd.run(
        body,
        shardings=config["shardings"],
        signature=config["signature"],
        rendezvous=config.get("rendezvous", {}).get(name),
        hang=config.get("hang", {}).get(name),
        plant=config.get("plant", {}).get(name),
    )
"""

CASES = (
    BODY
    + """

def test_a(spmd):
    run_case(spmd, "a")


def test_b(spmd):
    run_case(spmd, "b")


@pytest.fixture
def breaks_in_teardown():
    yield
    raise RuntimeError("teardown failed")


def test_teardown_fails(spmd, breaks_in_teardown):
    run_case(spmd, "teardown_fails")


@pytest.mark.parametrize("n", [1], ids=["x'; touch PWNED; echo '"])
def test_hostile(spmd, n):
    run_case(spmd, "hostile")
"""
)
TILED = "{devices=[4,1]0,1,2,3}"
UPDATE = ("--spmd-update-shardings", "--spmd-update-costs")


def config(shardings: str = TILED, all_gather: int = 3, **extra) -> dict:
    return {"shardings": {"w": shardings}, "signature": signature(all_gather=all_gather), **extra}


def argv(*args: str, results: str = "results") -> list[str]:
    return [
        "--spmd-backend=fake",
        "-p",
        "no:cacheprovider",
        "--spmd-shardings-baseline=shardings.json",
        "--spmd-costs-baseline=costs.json",
        f"--spmd-results-dir={results}",
        "-rA",
        *args,
    ]


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)

    def run(case_config: dict, *args: str, version: str = "2.9.0", timeout: float = 120) -> pytest.RunResult:
        monkeypatch.setenv("CASE_CONFIG", json.dumps(case_config))
        monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
        return pytester.runpytest_subprocess(*argv(*args), timeout=timeout)

    return run


def start(pytester, case_config: dict, *args: str, results: str, version: str = "2.9.0") -> subprocess.Popen[str]:
    env = dict(os.environ, CASE_CONFIG=json.dumps(case_config), HARNESS_FAKE_TORCH_XLA=version)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *argv(*args, results=results)],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def entries(pytester) -> tuple[dict, dict]:
    """The sharding and the cost baseline's cases."""
    return tuple(json.loads((pytester.path / name).read_text())["cases"] for name in ("shardings.json", "costs.json"))


def all_gathers(cost_entry: dict) -> int:
    return cost_entry["train"]["graphs"]["step0"]["collectives"][0]["count"]


def test_two_update_runs_at_once_on_one_file_both_keep_their_entry(suite, pytester):
    """Each run read the file at its start and writes at its end; without a lock and a merge the
    second writer puts the first one's case back to its old value."""
    suite(config(), "-k", "test_a or test_b", *UPDATE).assert_outcomes(passed=2)
    a_ready, b_ready = str(pytester.path / "a.ready"), str(pytester.path / "b.ready")
    with contextlib.ExitStack() as stack:
        runs = [
            stack.enter_context(
                reaped(
                    start(
                        pytester,
                        config("{replicated}", all_gather=5, rendezvous={name: mine_other}),
                        "-k",
                        f"test_{name}",
                        *UPDATE,
                        results=f"results-{name}",
                    )
                )
            )
            for name, mine_other in (("a", [a_ready, b_ready]), ("b", [b_ready, a_ready]))
        ]
        outputs = [run.communicate(timeout=180)[0] for run in runs]
    # Each finds the other's entry changed since it read the file, and written by an update run
    # (the lock file's journal of entry digests): merged, not refused as a case body's write (#51).
    assert [run.returncode for run in runs] == [0, 0], outputs
    shardings, costs = entries(pytester)
    assert shardings == {"test_cases.py::test_a": {"w": "{replicated}"}, "test_cases.py::test_b": {"w": "{replicated}"}}
    assert {case: all_gathers(entry) for case, entry in costs.items()} == {
        "test_cases.py::test_a": 5,
        "test_cases.py::test_b": 5,
    }
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.endswith(".tmp")) == []


def test_an_entry_a_case_body_plants_for_a_case_the_run_did_not_take_is_never_written(suite, pytester):
    """#51: test_a's body adds an entry for a case no run took and changes test_b's; the update of
    test_a alone used to merge both into the file it wrote."""
    suite(config(), "-k", "test_a or test_b", *UPDATE).assert_outcomes(passed=2)
    before = entries(pytester)
    attack = config("{replicated}", 5, plant={"a": [str(pytester.path)]})
    result = suite(attack, "-k", "test_a", *UPDATE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*shardings.json is not written: 2 entries this run did not take changed on disk while it ran "
            "('test_cases.py::test_b', 'test_cases.py::test_never_taken'): written by a case body*",
        ]
    )
    assert (
        "costs.json is not written: 1 entry this run did not take changed on disk while it ran "
        "('test_cases.py::test_never_taken')" in result.stdout.str()
    )
    shardings, costs = entries(pytester)
    for planted in (shardings, costs):  # what the body wrote is there, but the update kept none of it
        assert "test_cases.py::test_never_taken" in planted
    assert shardings["test_cases.py::test_a"] == before[0]["test_cases.py::test_a"]
    assert costs["test_cases.py::test_a"] == before[1]["test_cases.py::test_a"]


@pytest.mark.parametrize("flag", UPDATE)
def test_an_update_under_xdist_dist_and_tx_is_refused_at_once(suite, flag):
    """The same refusal as with -n: before any worker starts (a worker's refusal used to hang the run)."""
    result = suite(config(), "-k", "test_a", flag, "--dist=load", "--tx", "2*popen", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{flag} writes one file: run it without -n or --dist*"])


@pytest.mark.parametrize("flag", UPDATE)
def test_a_dist_mode_without_workers_is_not_distribution(suite, pytester, flag):
    """This repository's own addopts hold --dist=worksteal: without -n or --tx nothing is
    distributed, and the update runs in the one process (it was refused)."""
    result = suite(config(), "-k", "test_a", flag, "--dist=worksteal", timeout=60)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    written = "shardings.json" if flag == UPDATE[0] else "costs.json"
    assert "test_cases.py::test_a" in json.loads((pytester.path / written).read_text())["cases"]


def test_a_case_whose_teardown_errors_is_written_into_neither_baseline(suite, pytester):
    result = suite(config(), "-k", "test_a or teardown_fails", *UPDATE)
    result.assert_outcomes(passed=2, errors=1)  # test_teardown_fails passed its call, then errored
    shardings, costs = entries(pytester)
    assert list(shardings) == ["test_cases.py::test_a"]
    assert list(costs) == ["test_cases.py::test_a"]


def test_an_interrupted_update_run_writes_nothing(pytester):
    """SIGTERM while the second case runs: the first one passed, and still nothing is written."""
    pytester.makepyfile(test_cases=CASES)
    started = pytester.path / "b.started"
    config_b_hangs = config(hang={"b": str(started)})
    with reaped(start(pytester, config_b_hangs, "-k", "test_a or test_b", *UPDATE, results="results")) as run:
        deadline = time.monotonic() + 120
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), run.communicate(timeout=30)[0] if run.poll() is not None else "test_b never started"
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
    assert run.returncode == pytest.ExitCode.INTERRUPTED, output
    assert not (pytester.path / "shardings.json").exists() and not (pytester.path / "costs.json").exists()
    assert "sharding baseline not written" in output and "cost baseline not written" in output
    assert "is not written: the run was interrupted" in output


def test_an_update_on_another_release_line_is_refused_unless_it_retakes_the_whole_file(suite, pytester):
    suite(config(), "-k", "test_a or test_b", *UPDATE).assert_outcomes(passed=2)
    before = [(pytester.path / name).read_bytes() for name in ("shardings.json", "costs.json")]
    refused = suite(config("{replicated}", 5), "-k", "test_a", *UPDATE, version="2.10.0+git1a2b3c4")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stdout.fnmatch_lines(
        [
            "*sharding baseline*shardings.json is not written: it was taken on torch_xla 2.9.0 and this run is on "
            "2.10.0+git1a2b3c4, another release line*",
        ]
    )
    assert "costs.json is not written: it was taken on torch_xla 2.9.0" in refused.stdout.str()
    assert [(pytester.path / name).read_bytes() for name in ("shardings.json", "costs.json")] == before
    # test_b's drift on 2.9.0 still fails: its entry stayed on 2.9.0's line.
    drift = suite(config("{replicated}", 5), "-k", "test_b", version="2.9.0")
    drift.assert_outcomes(failed=1)
    drift.stdout.fnmatch_lines(["*sharding drift: 1 tensor(s) differ from shardings.json (taken on torch_xla 2.9.0*"])
    # Re-taking every entry on the new line is allowed.
    suite(config("{replicated}", 5), "-k", "test_a or test_b", *UPDATE, version="2.10.0+git1a2b3c4").assert_outcomes(
        passed=2
    )
    for name in ("shardings.json", "costs.json"):
        assert json.loads((pytester.path / name).read_text())["torch_xla"] == "2.10.0+git1a2b3c4"


def test_printed_rewrite_commands_are_shell_quoted_and_name_the_baseline_in_use(suite, pytester, tmp_path):
    hostile = "test_cases.py::test_hostile[x'; touch PWNED; echo ']"
    suite(config(), "-k", "hostile", *UPDATE).assert_outcomes(passed=1)
    for drifted, flag, option in (
        (config("{replicated}"), UPDATE[0], f"--spmd-shardings-baseline={pytester.path / 'shardings.json'}"),
        (config(all_gather=5), UPDATE[1], f"--spmd-costs-baseline={pytester.path / 'costs.json'}"),
    ):
        result = suite(drifted, "-k", "hostile")
        result.assert_outcomes(failed=1)
        # The failure shows it once, and the -rA summary again where pytest does not cut the line
        # at the terminal's width (on CI): the same command each time.
        [command] = {
            line.split("rewrite the entry: ", 1)[1] for line in result.stdout.lines if "rewrite the entry: " in line
        }
        # Run as printed, with pytest a shell function that prints its arguments one per line.
        shell = subprocess.run(
            ["bash", "-c", 'pytest() { printf "%s\\n" "$@"; }; ' + command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert not (tmp_path / "PWNED").exists(), command
        assert shell.stdout.splitlines() == [hostile, flag, option, "--spmd-backend=fake"], command


OUTSIDE_CASE = (
    BODY
    + """

def test_loop(spmd):
    run_case(spmd, "loop")
"""
)


def test_cases_outside_the_rootdir_have_one_key_in_both_baselines_and_a_usable_rewrite_command(
    pytester, tmp_path_factory, monkeypatch
):
    """pytorch/xla's tree run with this project's config: pytest's node id of both files is `::test_loop`."""
    project = pytester.path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nspmd_backend = fake\n")
    elsewhere = tmp_path_factory.mktemp("upstream")
    for folder in ("spmd", "distributed"):
        (elsewhere / folder).mkdir()
        (elsewhere / folder / f"test_{folder}_cases.py").write_text(OUTSIDE_CASE)
    files = [str(p) for p in sorted(elsewhere.rglob("test_*.py"))]
    common = [
        "-c",
        str(project / "pytest.ini"),
        f"--rootdir={project}",
        "-p",
        "no:cacheprovider",
        f"--spmd-results-dir={project / 'results'}",
        f"--spmd-shardings-baseline={project / 'shardings.json'}",
        f"--spmd-costs-baseline={project / 'costs.json'}",
    ]
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    monkeypatch.setenv("CASE_CONFIG", json.dumps(config()))
    pytester.runpytest_subprocess(*common, *UPDATE, *files, timeout=120).assert_outcomes(passed=2)
    keys = ["test_distributed_cases.py::test_loop", "test_spmd_cases.py::test_loop"]
    for name in ("shardings.json", "costs.json"):
        assert sorted(json.loads((project / name).read_text())["cases"]) == keys, name

    monkeypatch.setenv("CASE_CONFIG", json.dumps(config(all_gather=5)))
    drift = pytester.runpytest_subprocess(*common, files[1], timeout=120)
    drift.assert_outcomes(failed=1)
    command = next(
        line.split("rewrite the entry: ", 1)[1] for line in drift.stdout.lines if "rewrite the entry: " in line
    )
    argv_printed = shlex.split(command)
    assert argv_printed[0] == "pytest" and argv_printed[1:5] == [
        "-c",
        str(project / "pytest.ini"),
        f"--rootdir={project}",
        f"{files[1]}::test_loop",
    ]
    # The printed command, run as it is, rewrites that one entry.
    rerun = subprocess.run(
        [sys.executable, "-m", *argv_printed, "-p", "no:cacheprovider", f"--spmd-results-dir={project / 'results'}"],
        cwd=tmp_path_factory.mktemp("elsewhere"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0 and "cost baseline" in rerun.stdout and "rewritten for 1 case(s)" in rerun.stdout, (
        rerun.stdout
    )
    costs_now = json.loads((project / "costs.json").read_text())["cases"]
    assert {case: all_gathers(entry) for case, entry in costs_now.items()} == {keys[0]: 3, keys[1]: 5}
    assert Path(files[1]).name == "test_spmd_cases.py"
