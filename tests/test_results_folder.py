"""The results folder as users meet it (fake backend, black-box pytest runs): the harness writes
only into a run folder of its own, never deletes what it did not write, keeps concurrent runs
apart, leaves a record for every started case (a crashed xdist worker included), and a full disk
stops the run with a message instead of an INTERNALERROR. See harness/records/runfolder.py."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import report
from harness.records import results, runfolder
from harness.records.results import read_records
from harness.run import dumproot
from tests.conftest import reaped, spmd_report

pytestmark = pytest.mark.selftest

CASES = """
import os, signal, sys
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    ctx.record("pid", os.getpid())

def body_aborts(ctx):
    print("F0101 00:00:00.000000 1 x.cc:1] Check failed: first run's crash", file=sys.stderr, flush=True)
    os.abort()

def test_ok(spmd):
    spmd.run(body_ok)

@pytest.mark.skipif(not os.environ.get("ABORT_CASE"), reason="only in the run that wants it")
def test_aborts(spmd):
    spmd.run(body_aborts)
"""

# Someone else's files in the folder the harness is pointed at (names the harness itself uses).
FOREIGN = {
    "logs/keep.log": "mine",
    "hlo/keep.txt": "mine",
    "verdicts-other.jsonl": "{}\n",
    "requests-main.jsonl": "mine",
    "latest": "a file of mine named latest",
}


def plant_foreign_files(folder: Path) -> None:
    for name, text in FOREIGN.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under folder, except what pytest and pytester write (bytecode, basetemp, output)."""

    def pytesters(path: Path) -> bool:
        top = path.relative_to(folder).parts[0]
        return "__pycache__" in path.parts or top.startswith("runpytest-") or top in ("stdout", "stderr")

    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not pytesters(p)}


def run(pytester: pytest.Pytester, *args: str, **env: str) -> pytest.RunResult:
    """pytest in a subprocess, as a user starts it: without the variables of the xdist worker
    this test may run in (an inherited PYTEST_XDIST_WORKER once hid the deletions this guards)."""
    saved = dict(os.environ)
    os.environ.update(env)
    for key in [k for k in os.environ if k.startswith("PYTEST_XDIST_")]:
        del os.environ[key]
    try:
        return pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", *args, timeout=120)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--help"], id="help"),
        pytest.param(["--collect-only", "-m", "spmd"], id="collect-only"),
        pytest.param(["-m", "not spmd"], id="no-spmd-case-selected"),
        pytest.param(["--markers"], id="markers"),
    ],
)
def test_runs_with_no_spmd_work_touch_nothing(pytester: pytest.Pytester, args: list[str]):
    pytester.makepyfile(test_cases=CASES, test_plain="def test_plain():\n    pass\n")
    plant_foreign_files(pytester.path / "results")
    before = tree(pytester.path)
    run(pytester, *args)
    assert tree(pytester.path) == before
    assert not list((pytester.path / "results").glob("run-*"))


def test_results_dir_dot_keeps_every_file_and_adds_only_a_run_folder(pytester: pytest.Pytester):
    pytester.makepyfile(test_cases=CASES)
    plant_foreign_files(pytester.path)
    before = tree(pytester.path)
    result = run(pytester, "--spmd-results-dir=.", "-m", "spmd")
    result.assert_outcomes(passed=1, skipped=1)
    after = tree(pytester.path)
    assert {k: v for k, v in after.items() if k in before} == before, "a file the harness did not write changed"
    added = {k.split("/")[0] for k in after if k not in before}
    assert len(added) == 1 and added.pop().startswith("run-"), f"written outside the run folder: {added}"
    assert (pytester.path / "latest").read_text() == FOREIGN["latest"], "a user's `latest` was replaced"
    assert not (pytester.path / "latest").is_symlink()


def test_a_second_run_keeps_the_first_runs_crash_evidence(pytester: pytest.Pytester):
    pytester.makepyfile(test_cases=CASES)
    first = run(pytester, "-m", "spmd", ABORT_CASE="1")
    first.assert_outcomes(passed=1, failed=1)
    first_run = (pytester.path / "results" / "latest").resolve()
    crash = {r.nodeid.split("::")[-1]: r for r in read_records(first_run)}["test_aborts"]
    second = run(pytester, "-m", "spmd")
    second.assert_outcomes(passed=1, skipped=1)
    assert (pytester.path / "results" / "latest").resolve() != first_run
    # The first run's evidence still leads with the signal, and the log it points at is still there.
    again = {r.nodeid.split("::")[-1]: r for r in read_records(first_run)}["test_aborts"]
    assert again.evidence == crash.evidence and again.evidence.startswith("SIGABRT: F0101")
    assert any("first run's crash" in p.read_text() for p in (first_run / "logs").rglob("child-*.log"))
    # Each run's report speaks of that run only.
    assert report.load_results(first_run).records[0].outcome in ("passed", "failed")
    assert report.totals_line(report.load_results(first_run)) == "2 cases: 1 passed, 1 failed, 0 xfailed, 0 skipped"
    assert report.totals_line(report.load_results(pytester.path / "results")) == (
        "2 cases: 1 passed, 0 failed, 0 xfailed, 1 skipped"
    )


def test_two_concurrent_runs_in_one_folder_keep_each_others_files(pytester: pytest.Pytester):
    pytester.makepyfile(test_cases=CASES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")} | {"ABORT_CASE": "1"}
    argv = [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider", "-m", "spmd"]
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                reaped(
                    subprocess.Popen(
                        argv, cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
                    )
                )
            )
            for _ in range(2)
        ]
        assert [p.wait(timeout=120) for p in procs] == [1, 1]
    runs = sorted(p for p in (pytester.path / "results").glob("run-*"))
    assert len(runs) == 2, f"expected a folder per run: {runs}"
    for folder in runs:
        manifest = runfolder.read_manifest(folder)
        assert manifest.status == "finished" and manifest.exitstatus == 1
        records = {r.nodeid.split("::")[-1]: r for r in read_records(folder)}
        assert set(records) == {"test_ok", "test_aborts"}
        assert records["test_aborts"].evidence.startswith("SIGABRT")
        assert list((folder / "logs").rglob("child-*.log")), f"{folder.name} lost its child logs"


CRASHES_ITS_WORKER = """
import os, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    ctx.record("pid", os.getpid())

@pytest.mark.parametrize("n", range(3))
def test_ok(spmd, n):
    spmd.run(body_ok)

def test_kills_its_worker(spmd):
    spmd.run(body_ok)
    os.kill(os.getpid(), signal.SIGKILL)  # the xdist worker dies mid-case: it can write no record
"""


def test_a_crashed_xdist_worker_leaves_a_failed_record_and_a_red_report(pytester: pytest.Pytester):
    pytester.makepyfile(test_crash=CRASHES_ITS_WORKER)
    result = run(pytester, "-m", "spmd", "-n", "2")
    assert result.ret == 1
    records = {r.nodeid.split("::")[-1]: r for r in read_records(pytester.path / "results")}
    crashed = records["test_kills_its_worker"]
    assert crashed.outcome == "failed" and "crashed while running this case" in crashed.reason
    proc = spmd_report(str(pytester.path / "results"), "--annotate")
    assert "::error title=SPMD regression%3A test_crash.py%3A%3Atest_kills_its_worker::xdist worker" in proc.stdout
    assert "1 failed" in proc.stdout and "0 failed" not in proc.stdout


def test_the_report_of_a_run_that_never_finished_is_red(pytester: pytest.Pytester):
    """pytest SIGKILLed mid-run (no xdist): whatever the records say, the run is incomplete."""
    pytester.makepyfile(
        test_killed="""
import os, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def test_a(spmd):
    spmd.run(body_ok)

def test_b_kills_pytest(spmd):
    os.kill(os.getpid(), signal.SIGKILL)
"""
    )
    run(pytester, "-m", "spmd")
    results = report.load_results(pytester.path / "results")
    assert [r.outcome for r in results.records] == ["passed"]
    assert results.problems and "did not finish" in results.problems[0]
    assert report.main([str(pytester.path / "results")]) == report.EXIT_RUN_PROBLEM


def test_failures_pytest_saw_without_a_record_are_failures_in_the_report(pytester: pytest.Pytester):
    pytester.makepyfile(test_cases=CASES, test_plain="def test_plain_fails():\n    assert False\n")
    result = run(pytester)
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    results = report.load_results(pytester.path / "results")
    by_name = {r.nodeid.split("::")[-1]: r for r in results.records}
    assert by_name["test_plain_fails"].outcome == "failed"
    assert "holds no record" in by_name["test_plain_fails"].reason


@pytest.mark.skipif(
    not shutil.which("unshare") or os.geteuid() != 0,
    reason="a full disk is made with a small tmpfs in a private mount namespace (needs root and unshare)",
)
def test_a_full_disk_stops_the_run_with_a_message_and_keeps_the_records(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_fill="""
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_fails_long(ctx, n):
    raise RuntimeError(f"case {n}: " + "x" * 7000)

@pytest.mark.parametrize("n", range(40))
def test_long_failure(spmd, n):
    spmd.run(body_fails_long, n=n)
"""
    )
    results = pytester.path / "results"
    results.mkdir()
    script = (
        f"mount -t tmpfs -o size=160k tmpfs {results} && cd {pytester.path} && "
        f"{sys.executable} -m pytest --spmd-backend=fake -p no:cacheprovider -m spmd --spmd-fork-server=off "
        f"--spmd-results-dir={results}; echo EXIT=$?; cat {results}/latest/verdicts-main.jsonl > {pytester.path}/kept.jsonl"
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if "mount" in out and "permission denied" in out.lower():
        pytest.skip("tmpfs mount refused here")
    assert "INTERNALERROR" not in out, out[-3000:]
    assert "cannot be written (No space left on device); the run stops here" in out, out[-3000:]
    assert "EXIT=2" in out, "a run stopped by a full disk is interrupted (exit 2)"
    kept = [line for line in (pytester.path / "kept.jsonl").read_text().splitlines() if line]
    complete = []
    for line in kept:
        try:
            complete.append(json.loads(line))
        except ValueError:
            pass  # the line the disk cut
    assert 1 <= len(complete) < 40 and len(kept) - len(complete) <= 1
    assert all(r["outcome"] == "failed" for r in complete)


OUTSIDE_CASE = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    ctx.record("where", __file__)

def test_x(spmd):
    spmd.run(body)
"""


def test_cases_outside_the_rootdir_keep_distinct_stable_names(pytester: pytest.Pytester, tmp_path_factory):
    """pytorch/xla's tree run with this project's config: two case files outside the rootdir,
    with the same test name, must not collide (pytest's own node id for both files, given as
    files, is `::test_x`)."""
    project = pytester.path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nspmd_backend = fake\n")
    elsewhere = tmp_path_factory.mktemp("upstream")
    for folder in ("spmd", "distributed"):
        (elsewhere / folder).mkdir()
        (elsewhere / folder / f"test_{folder}_cases.py").write_text(OUTSIDE_CASE)
    result = pytester.runpytest_subprocess(
        "-c",
        str(project / "pytest.ini"),
        f"--rootdir={project}",
        "-p",
        "no:cacheprovider",
        f"--spmd-results-dir={project / 'results'}",
        *(str(p) for p in sorted(elsewhere.rglob("test_*.py"))),
        timeout=120,
    )
    result.assert_outcomes(passed=2)
    records = list(read_records(project / "results"))
    assert sorted(r.nodeid for r in records) == ["test_distributed_cases.py::test_x", "test_spmd_cases.py::test_x"]
    assert sorted(r.family for r in records) == ["distributed_cases", "spmd_cases"]


def test_records_carry_the_stack_the_harness_and_the_schema(pytester: pytest.Pytester):
    from harness.records import versions

    pytester.makepyfile(test_cases=CASES)
    run(pytester, "-m", "spmd").assert_outcomes(passed=1, skipped=1)
    for record in read_records(pytester.path / "results"):
        assert record.schema == results.RECORD_SCHEMA
        assert record.harness == versions.harness() and record.harness != "unknown"
        assert (record.torch, record.jax) == (versions.installed("torch"), versions.installed("jax"))


COST_MEASURED_CASE = """
import pytest

pytestmark = pytest.mark.spmd

def body_train(ctx):
    import torch
    import torch_xla.distributed.spmd as xs
    from harness import stepcosts, xla
    model = torch.nn.Linear(8, 8).to(xla.device())
    xs.mark_sharding(model.weight, xla.mesh((4, 1), ("fsdp", "model")), ("fsdp", None))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = stepcosts.StepMeter(ctx, parameters=model.parameters(), optimizer=optimizer)
    for _ in range(3):
        with meter.step():
            loss = model(torch.ones(4, 8).to(xla.device())).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            xla.sync()

@pytest.mark.no_sharding_baseline("a throwaway case")
@pytest.mark.parametrize("n", range(2))
def test_train(spmd, n):
    spmd.run(body_train, fresh=True)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla (XLA dumps of a real step)")
def test_xla_dumps_of_forked_children_go_with_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
):
    """A forked child ends through os._exit, so a dump folder it made in /tmp for itself stayed
    there (one per child, up to a megabyte each); they now live in the run's own dump folder (in
    memory where /dev/shm is a tmpfs, else the run folder) until the run ends."""
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT", raising=False)  # this suite's own run exports its root
    pytester.makepyfile(
        test_costly=COST_MEASURED_CASE
        + """
def test_dumps_went_to_the_runs_own_folder():
    import os
    from harness.run.dumproot import MEMORY_FOLDER, _is_tmpfs
    root = os.environ["HARNESS_XLA_DUMP_ROOT"]
    expected = str(MEMORY_FOLDER) if _is_tmpfs(MEMORY_FOLDER) else os.path.join("results", "run-")
    assert expected in root and os.path.isdir(root), root
"""
    )
    # Other runs of this suite may dump to the shared /tmp meanwhile. Short: the fork server's
    # socket lives under TMPDIR, and a Unix socket path holds at most 107 bytes.
    private_tmp = Path(tempfile.mkdtemp(prefix="spmd-t-"))
    request.addfinalizer(lambda: shutil.rmtree(private_tmp, ignore_errors=True))
    result = run(
        pytester, "--spmd-backend=cpu", "--spmd-fork-server=on", "-m", "spmd or not spmd", TMPDIR=str(private_tmp)
    )
    result.assert_outcomes(passed=3)
    assert list(private_tmp.glob("spmd-xla-dumps-*")) == []
    run_path = (pytester.path / "results" / "latest").resolve()
    assert not (run_path / "xla-dumps").exists()
    # Named after the run: other runs of this suite may hold roots of their own there meanwhile.
    assert not dumproot._memory_dump_root(run_path).exists()


def test_a_dump_root_the_environment_names_is_kept_and_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The user's own root is used as it is and never removed; the run's own goes with it."""
    run_path = tmp_path / "run-1"
    run_path.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    monkeypatch.setenv("HARNESS_XLA_DUMP_ROOT", str(theirs))
    dumproot.share_dump_root(run_path)
    dumproot.remove_dump_root(run_path)
    assert theirs.is_dir() and os.environ["HARNESS_XLA_DUMP_ROOT"] == str(theirs)
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT")
    dumproot.share_dump_root(run_path)
    ours = Path(os.environ["HARNESS_XLA_DUMP_ROOT"])
    assert ours.is_dir() and ours != theirs
    dumproot.remove_dump_root(run_path)
    assert not ours.exists() and "HARNESS_XLA_DUMP_ROOT" not in os.environ


@pytest.fixture
def memory_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private stand-in for /dev/shm (taken for a tmpfs), and no dump root named by the
    environment (this suite's own run exports its root)."""
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT", raising=False)
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(dumproot, "MEMORY_FOLDER", folder)
    monkeypatch.setattr(dumproot, "_is_tmpfs", lambda folder: True)
    return folder


def test_a_memory_dump_root_that_exists_already_is_not_taken(tmp_path: Path, memory_folder: Path):
    """A folder of the run's memory-root name that someone else made is neither used nor removed."""
    run_path = tmp_path / "run-2"
    run_path.mkdir()
    squatted = dumproot._memory_dump_root(run_path)
    squatted.mkdir()
    (squatted / "theirs.txt").write_text("not the harness's")
    dumproot.share_dump_root(run_path)
    assert os.environ["HARNESS_XLA_DUMP_ROOT"] == str(run_path / "xla-dumps")
    dumproot.remove_dump_root(run_path)
    assert (squatted / "theirs.txt").read_text() == "not the harness's"
    assert not (run_path / "xla-dumps").exists() and "HARNESS_XLA_DUMP_ROOT" not in os.environ


def test_a_run_that_stops_before_its_session_leaves_no_dump_root(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """The early start makes the run's dump root before conftests load; a conftest that fails to
    import ends pytest before pytest_configure (so before pytest_unconfigure): the root in
    /dev/shm stayed, one per such run, until the machine rebooted."""
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT", raising=False)
    pytester.makeconftest("raise ImportError('a broken conftest')")
    pytester.makepyfile(test_a="import pytest\npytestmark = pytest.mark.spmd\ndef test_a(spmd):\n    pass\n")
    run_id = f"run-early-{os.getpid()}-{time.monotonic_ns()}"
    result = run(pytester, "--spmd-fork-server=on", f"--spmd-run-id={run_id}", "-m", "spmd")
    assert result.ret != 0
    run_path = (pytester.path / "results" / run_id).resolve()
    assert run_path.is_dir(), result.stdout.str()  # the early start did claim it (else this tests nothing)
    assert not dumproot._memory_dump_root(run_path).exists()


def test_a_dump_root_a_body_replaced_by_a_symlink_goes_without_what_it_points_to(tmp_path: Path, memory_folder: Path):
    """A body may swap the run's root for a symlink: the run's end removed nothing then (rmtree
    refuses a symlink), leaving the link in /dev/shm; it must go, and never what it points to."""
    run_path = tmp_path / "run-3"
    run_path.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs.txt").write_text("not the harness's")
    dumproot.share_dump_root(run_path)
    root = Path(os.environ["HARNESS_XLA_DUMP_ROOT"])
    shutil.rmtree(root)
    root.symlink_to(elsewhere)
    dumproot.remove_dump_root(run_path)
    assert (elsewhere / "theirs.txt").read_text() == "not the harness's"
    assert not os.path.lexists(root) and "HARNESS_XLA_DUMP_ROOT" not in os.environ


def test_a_dump_root_a_body_deleted_is_made_again_not_left_for_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A body that deletes the run's dump root sent every later child's dumps to /tmp, where a
    forked child (it ends through os._exit, its atexit never runs) left them: one folder each."""
    from harness import xla

    root = tmp_path / "run-4" / "xla-dumps"  # the run's root, deleted by a body
    monkeypatch.setenv("HARNESS_XLA_DUMP_ROOT", str(root))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv(xla.DUMP_DIR_ENV, raising=False)
    monkeypatch.setattr(xla, "can_name_graphs", lambda: True)
    folder = xla.enable_step_dumps()
    assert folder is not None and Path(folder).parent == root


def test_xdist_workers_share_one_dump_root_when_the_run_starts_late(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """A run the command line does not name SPMD (no -m spmd, no cases/ path) makes its folder in
    the workers: each made the run's memory root itself, the first won it, the other fell back to
    the run folder on disk, and no one removed the winner's (only the controller removes roots).
    Workers make no root in memory now: they share the run folder's, which the controller removes."""
    monkeypatch.delenv("HARNESS_XLA_DUMP_ROOT", raising=False)
    roots = pytester.path / "roots.txt"
    pytester.makepyfile(
        test_late=f"""
import os
import pytest
pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

@pytest.mark.parametrize("n", range(4))
def test_root(spmd, n):
    spmd.run(body_ok)
    with open({str(roots)!r}, "a") as f:
        f.write(os.environ["HARNESS_XLA_DUMP_ROOT"] + "\\n")
"""
    )
    result = run(pytester, "-n", "2", "--dist=load", "-rs", "test_late.py")
    result.assert_outcomes(passed=4)
    seen = set(roots.read_text().split())
    assert len(seen) == 1, seen
    assert not any(os.path.lexists(root) for root in seen)


def test_memory_roots_of_runs_that_were_killed_are_removed_by_the_next_run(tmp_path: Path, memory_folder: Path):
    """SIGKILL leaves a run's memory root behind; the next run removes it when the process its
    stamp names is gone, and leaves a live owner's, an unstamped folder and a link alone."""
    shm = memory_folder
    prefix = f"spmd-xla-dumps-{os.getuid()}-"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_stamp = dumproot._owner_stamp(gone.pid) or f"{gone.pid} 1"
    gone.wait()
    killed = shm / (prefix + "run-killed")
    killed.mkdir()
    (killed / dumproot.OWNER_FILE).write_text(gone_stamp)
    (killed / "step0.txt").write_text("a dump")
    reused = shm / (prefix + "run-pid-reused")  # the pid lives, but it is another process now
    reused.mkdir()
    (reused / dumproot.OWNER_FILE).write_text(f"{os.getpid()} 1")
    alive = shm / (prefix + "run-alive")
    alive.mkdir()
    (alive / dumproot.OWNER_FILE).write_text(dumproot._owner_stamp(os.getpid()) or "")
    unstamped = shm / (prefix + "run-unstamped")
    unstamped.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / dumproot.OWNER_FILE).write_text(gone_stamp)
    (shm / (prefix + "run-link")).symlink_to(elsewhere)
    run_path = tmp_path / "run-new"
    run_path.mkdir()
    dumproot.share_dump_root(run_path)
    left = sorted(p.name.removeprefix(prefix) for p in shm.iterdir())
    assert left == ["run-alive", "run-link", "run-new", "run-unstamped"]
    assert elsewhere.is_dir() and (elsewhere / dumproot.OWNER_FILE).exists()
    assert (shm / (prefix + "run-new") / dumproot.OWNER_FILE).read_text() == dumproot._owner_stamp(os.getpid())
    dumproot.remove_dump_root(run_path)
