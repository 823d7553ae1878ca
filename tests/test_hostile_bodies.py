"""Case bodies that attack the run itself, as a hostile pull request would (fake backend, black-box
runs): a body runs as the same user as pytest, so it can put a named pipe or a link where the
harness expects its own file, stop the pytest process, delete a lock, or change its process for the
case after it. None of it may hang the run, be written through, lose an update or change a
later case's verdict.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.records import runfolder
from tests.conftest import REPO, only_run_folder, run_fake, spmd_report

pytestmark = pytest.mark.selftest


def run(pytester: pytest.Pytester, *args: str, timeout: float = 90) -> pytest.RunResult:
    # A hang is what these tests look for: pytester's timeout turns it into a failure.
    return run_fake(pytester, "-rA", *args, timeout=timeout)


# --- a named pipe where the run expects its own file --------------------------------------------

PIPES = """
import os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def run_folder():
    (folder,) = (p for p in pathlib.Path("results").glob("run-*") if not p.is_symlink())
    return folder.absolute()

def pipe_in_place_of(path):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)

def body_plants(ctx, target, folder):
    folder = pathlib.Path(folder)
    ctx.record_hlo("m", "HloModule m")
    if target == "manifest":
        pipe_in_place_of(folder / "run.json")
    elif target == "verdicts":
        pipe_in_place_of(folder / "verdicts-main.jsonl")
    elif target == "journal":
        pipe_in_place_of(folder / "requests-main.jsonl")
    elif target == "hlo":
        pipe_in_place_of(folder / "hlo" / "test_pipes.py_test_a_plants__m.txt")
    elif target == "log":
        pipe_in_place_of(os.readlink("/proc/self/fd/2"))
        raise RuntimeError("the case fails, so its log is read")

def body_ok(ctx):
    pass

def test_a_plants(spmd):
    spmd.run(body_ok)  # the run folder exists from here on
    spmd.run(body_plants, target=os.environ["TARGET"], folder=str(run_folder()))

def test_b_later(spmd):
    spmd.run(body_ok)
"""


@pytest.mark.parametrize("target", ["manifest", "verdicts", "journal", "hlo", "log"])
def test_a_named_pipe_planted_in_place_of_a_run_file_does_not_hang_the_run(pytester, monkeypatch, target):
    pytester.makepyfile(test_pipes=PIPES)
    monkeypatch.setenv("TARGET", target)
    result = run(pytester)
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text
    if target == "log":
        result.assert_outcomes(failed=1, passed=1)
        result.stdout.fnmatch_lines(
            [
                "*RuntimeError: the case fails, so its log is read*",
                "*(no log at */child-*.log: not a regular file (a named pipe*",
            ],
            consecutive=False,
        )
    else:
        result.assert_outcomes(passed=2)
    folder = only_run_folder(pytester)
    if target == "manifest":
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*spmd harness: run.json of run-* was changed while the run's cases ran*"])
        assert runfolder.read_manifest(folder).status == "finished"  # the pipe was replaced, not opened
    if target == "hlo":
        kept = folder / "hlo" / "test_pipes.py_test_a_plants__m.txt"
        assert kept.is_file() and kept.read_text() == "HloModule m"


def test_a_named_pipe_in_place_of_the_manifest_under_xdist_fails_the_run_it_does_not_hang(pytester, monkeypatch):
    """The xdist controller never ran a case itself: it must still close the run, and fail it."""
    pytester.makepyfile(test_pipes=PIPES)
    monkeypatch.setenv("TARGET", "manifest")
    result = run(pytester, "-n", "2")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*spmd harness: run.json of run-* was changed while the run's cases ran*"])
    assert runfolder.read_manifest(only_run_folder(pytester)).status == "finished"


JUNIT_PIPE = """
import os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx, path):
    os.mkfifo(path)

def test_a(spmd):
    spmd.run(body, path=os.path.abspath("results/junit.xml"))
"""


def test_a_named_pipe_in_place_of_the_junit_file_does_not_hang_the_run(pytester):
    pytester.makepyfile(test_junit=JUNIT_PIPE)
    (pytester.path / "results").mkdir()
    result = run(pytester, "--junitxml=results/junit.xml", timeout=60)
    result.assert_outcomes(passed=1)
    assert (pytester.path / "results" / "junit.xml").is_file()


STALE_OWNER = """
import os, sys
from pathlib import Path
from harness.run import dumproot

dumproot.MEMORY_FOLDER = Path(sys.argv[1])
dumproot._remove_stale_roots()
print("swept")
"""


def test_a_named_pipe_as_a_stale_dump_roots_owner_stamp_does_not_hang_the_next_run(tmp_path: Path):
    # Not in the real /dev/shm: other runs of this user on the machine would sweep it too.
    stale = tmp_path / f"spmd-xla-dumps-{os.getuid()}-run-20260101-000000-p1"
    stale.mkdir()
    os.mkfifo(stale / ".owner")
    proc = subprocess.run(
        [sys.executable, "-c", STALE_OWNER, str(tmp_path)], capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert proc.stdout.strip() == "swept", proc.stderr
    assert stale.is_dir(), "a root whose owner cannot be read is left alone"


# --- a body that stops the pytest process waiting for its verdict -------------------------------

STOPS = """
import os, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def body_stops(ctx, pid):
    os.kill(pid, signal.SIGSTOP)

def test_a_stops_pytest(spmd):
    spmd.run(body_stops, pid=os.getpid())  # the pytest process (an xdist worker) that waits for the verdict

def test_b_later(spmd):
    spmd.run(body_ok)
"""


@pytest.mark.parametrize("workers", [None, "2"])
def test_a_body_that_stops_the_pytest_process_does_not_stop_the_run(pytester, workers):
    pytester.makepyfile(test_stops=STOPS)
    result = run(pytester, *(("-n", workers) if workers else ()), timeout=60)
    result.assert_outcomes(passed=2)


# --- a body that deletes the baseline's lock while another update run holds it ------------------

DELETES_LOCK = """
import os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx, lock):
    ctx.record_sharding("w", "{replicated}")
    if lock:
        pathlib.Path(lock).unlink()

def test_b(spmd):
    spmd.run(body, lock=os.environ.get("DELETE_LOCK", ""))
"""


def test_a_body_deleting_the_baseline_lock_while_another_update_run_holds_it_loses_no_entry(pytester, monkeypatch):
    """Update run A holds the lock and has read the file; a case of update run B deletes the lock,
    then B locks a new lock file and writes its entry. A must not overwrite it."""
    from harness import baselinefile
    from harness.judges.baseline import Baseline

    pytester.makepyfile(test_deleter=DELETES_LOCK)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    update = ("--spmd-shardings-baseline=shardings.json", "--spmd-update-shardings")
    run(pytester, *update).assert_outcomes(passed=1)  # the file, taken once
    path = pytester.path / "shardings.json"
    taken = json.loads(path.read_text())
    path.write_text(json.dumps({**taken, "cases": {}}))  # test_b's entry is B's to write again
    other_run: list[pytest.RunResult] = []

    def load_then_let_b_run() -> Baseline | None:
        found = Baseline.load(path, taken["backend"], taken["devices"])
        if not other_run:
            monkeypatch.setenv("DELETE_LOCK", str(path.with_name("shardings.json.lock")))
            other_run.append(run(pytester, *update))
        return found

    baselinefile.rewrite(
        path,
        "sharding",
        "--spmd-update-shardings",
        load_then_let_b_run,
        lambda: Baseline.empty(path, taken["backend"], taken["devices"]),
        {"test_a.py::test_a": ({"w": "{replicated}"}, "2.9.0")},
    )
    other_run[0].assert_outcomes(passed=1)
    assert sorted(json.loads(path.read_text())["cases"]) == ["test_a.py::test_a", "test_deleter.py::test_b"]


# --- a body that changes its process: the case after it runs in a process of its own ------------

LEAVES_STATE = """
import os, signal, sys
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

UMASK = os.umask(0o022)  # the run's (children inherit it)
os.umask(UMASK)

def body_changes(ctx):
    os.umask(0o077 if UMASK != 0o077 else 0o027)
    os.environ["XLA_DISABLE_FUNCTIONALIZATION"] = "1"
    os.environ["LEFT_BY_A"] = "1"
    os.putenv(b"LEFT_NATIVELY", b"1")  # what native code's setenv does: os.environ does not see it
    os.chdir("/")
    sys.path.insert(0, "/left/by/a")

def body_signals(ctx):
    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])

def body_monkeypatches(ctx):
    os.getpid = lambda: 1

def body_looks(ctx):
    import ctypes
    mask = os.umask(0o022)
    os.umask(mask)
    ctx.record("seen", {
        "bodies_before": ctx.bodies_before,
        "umask": mask,
        "functionalization": ctx.functionalization,
        "left": os.environ.get("LEFT_BY_A"),
        "native": ctypes.CDLL(None).getenv(b"LEFT_NATIVELY") != 0,
        "cwd_is_root": os.getcwd() == "/",
        "path": sys.path[0],
        "handler": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
        "blocked": signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, []),
        "getpid": os.getpid() != 1,
    })

def test_a_changes(spmd):
    spmd.run(body_changes)

def test_b_looks(spmd):
    seen = spmd.run(body_looks).values["seen"]
    assert seen["bodies_before"] == 0, "run in the process test_a used"
    assert seen == {**seen, "umask": UMASK, "functionalization": True, "left": None, "native": False,
                    "cwd_is_root": False}, seen
    assert seen["path"] != "/left/by/a"

def test_c_signals(spmd):
    spmd.run(body_signals)

def test_d_looks(spmd):
    seen = spmd.run(body_looks).values["seen"]
    assert seen["handler"] and not seen["blocked"], seen
    assert seen["bodies_before"] == 0, "run in the process test_c used"

def test_e_monkeypatches(spmd):
    spmd.run(body_monkeypatches)

def test_f_looks(spmd):
    seen = spmd.run(body_looks).values["seen"]
    assert seen["getpid"] and seen["bodies_before"] == 0, seen
"""


def test_the_next_case_starts_in_a_process_no_body_changed(pytester):
    pytester.makepyfile(test_state=LEAVES_STATE)
    result = run(pytester, "-p", "no:randomly")
    result.assert_outcomes(passed=6)


# --- files nested too deeply to read, a damaged default baseline under xdist ---------------------

ONE_CASE = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    ctx.record_sharding("w", "{replicated}")

def test_a(spmd):
    spmd.run(body)

def test_b(spmd):
    spmd.run(body)
    assert False, "test_b fails"
"""
DEEP = "[" * 100_000 + "]" * 100_000


def test_a_base_run_record_nested_too_deeply_is_a_usage_error_naming_it(pytester):
    pytester.makepyfile(test_one=ONE_CASE)
    run(pytester, "--spmd-results-dir=base").assert_outcomes(passed=1, failed=1)
    (base,) = (pytester.path / "base").glob("run-*")
    with (base / "verdicts-main.jsonl").open("a") as fh:
        fh.write(DEEP + "\n")
    result = run(pytester, "--spmd-compare=base", "--spmd-results-dir=pr")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(
        ["*--spmd-compare: base run * holds a damaged record: *verdicts-main.jsonl:3: *nested too deeply*"]
    )


def test_the_report_of_a_run_whose_verdicts_hold_a_line_nested_too_deeply_still_counts_and_fails(pytester):
    pytester.makepyfile(test_one=ONE_CASE)
    run(pytester).assert_outcomes(passed=1, failed=1)
    folder = only_run_folder(pytester)
    with (folder / "verdicts-main.jsonl").open("a") as fh:
        fh.write(DEEP + "\n")
    proc = spmd_report(str(folder), "--pytest-exit-status", "1", "--annotate")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "::error title=SPMD regression%3A test_one.py%3A%3Atest_b::" in proc.stdout, proc.stdout
    assert "2 cases: 1 passed, 1 failed" in proc.stdout + proc.stderr, proc.stdout
    assert "1 damaged record line(s)" in proc.stdout + proc.stderr
    assert (folder / "summary.md").is_file()


def test_a_damaged_default_sharding_baseline_under_xdist_is_the_usage_error_serial_gives(pytester):
    pytester.makepyfile(test_one=ONE_CASE)
    (pytester.path / "baselines" / "shardings").mkdir(parents=True)
    (pytester.path / "baselines" / "shardings" / "fake-4.json").write_text('{"backend": "fake", "dev')
    for workers in ((), ("-n", "2")):
        result = run(pytester, *workers)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (workers, result.stdout.str() + result.stderr.str())
        result.stderr.fnmatch_lines(["ERROR: sharding baseline */baselines/shardings/fake-4.json is not valid JSON*"])


# --- a body that edits the base run, then kills its xdist worker so a new one starts ------------

EDITS_BASE = """
import json, os, pathlib, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx, spec):
    ctx.record_sharding("w", spec)

def body_forges(ctx, base, spec, worker):
    for verdicts in pathlib.Path(base).glob("run-*/verdicts-*.jsonl"):
        records = [json.loads(line) for line in verdicts.read_text().splitlines() if line.strip()]
        for record in records:
            if record["nodeid"].endswith("test_b"):
                record["shardings"] = {"w": spec}
        verdicts.write_text("".join(json.dumps(r) + "\\n" for r in records))
    os.kill(worker, signal.SIGKILL)

def test_a(spmd):
    if os.environ.get("FORGE") and not os.path.exists("forged"):  # once: xdist may run test_a again
        pathlib.Path("forged").touch()
        spmd.run(body_forges, base=os.path.abspath("base"), spec=os.environ["SPEC_B"], worker=os.getpid())
    spmd.run(body, spec="{replicated}")

def test_b(spmd):
    spmd.run(body, spec=os.environ["SPEC_B"])
"""


def test_a_restarted_xdist_worker_holds_its_cases_to_the_base_the_run_read_at_its_start(pytester, monkeypatch):
    pytester.makepyfile(test_edits=EDITS_BASE)
    monkeypatch.setenv("SPEC_B", "{replicated}")
    run(pytester, "--spmd-results-dir=base").assert_outcomes(passed=2)
    monkeypatch.setenv("SPEC_B", "{devices=[4,1]0,1,2,3}")  # the regression the base must catch
    monkeypatch.setenv("FORGE", "1")
    result = run(pytester, "--spmd-results-dir=pr", "--spmd-compare=base", "-n", "2", "--dist=loadfile")
    text = result.stdout.str()
    assert "replacing crashed worker" in text, "the body did not kill its worker: nothing was tested"
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED test_edits.py::test_b*"])


# --- text of the code under test where it reaches Markdown or the runner ------------------------


def test_a_records_torch_xla_text_cannot_restyle_or_hide_the_summary(pytester, monkeypatch):
    pytester.makepyfile(test_one=ONE_CASE)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0\n## ✅ all green ![x](https://example.com/x.png) <!--")
    run(pytester).assert_outcomes(passed=1, failed=1)
    folder = only_run_folder(pytester)
    proc = spmd_report(str(folder), "--pytest-exit-status", "1")
    summary = (folder / "summary.md").read_text()
    assert "<!--" not in summary and "![x](" not in summary, summary
    assert not any(line.startswith("## ✅") for line in summary.splitlines()), summary
    assert "| test\\_b | ❌ failed" in summary, proc.stdout + proc.stderr  # the tables are not hidden


def test_a_wheel_name_cannot_stop_the_runners_commands(tmp_path: Path):
    for name in ("torch-##[stop-commands]x-cp311-cp311-linux_x86_64.whl", "torch_xla-1-cp311-cp311-linux_x86_64.whl"):
        (tmp_path / name).touch()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.wheeltags", str(tmp_path), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "is not a wheel filename" in proc.stderr, proc.stderr
    assert "##[" not in proc.stdout + proc.stderr
    (tmp_path / "torch-1-cp311-cp311-linux_x86_64.whl").touch()
    script = subprocess.run(
        ["bash", str(REPO / "scripts" / "ci-spmd.sh"), "--wheels", str(tmp_path), "--venv", str(tmp_path / "v")],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")},
    )
    assert "expected one torch-*.whl" in script.stderr + script.stdout, script.stderr
    assert "##[" not in script.stdout + script.stderr


# --- case children as a user of their own (--spmd-case-user, a run with root) --------------------

AS_USER = """
import errno, json, os, signal, sys
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx, pid, targets):
    tried = {}
    attempts = {name: (lambda path=path: open(path, "a")) for name, path in targets.items()}
    attempts["new file in results"] = lambda: open(os.path.join(os.path.dirname(targets["results"]), "forged.jsonl"), "x")
    attempts["SIGSTOP pytest"] = lambda: os.kill(pid, signal.SIGSTOP)
    attempts["SIGKILL pytest"] = lambda: os.kill(pid, signal.SIGKILL)
    for what, attempt in attempts.items():
        try:
            attempt()
            tried[what] = "done"
        except OSError as exc:
            tried[what] = errno.errorcode.get(exc.errno, str(exc))
    keeper = os.getppid()  # the fork server's keeper of this child; its parent is the server
    server = int(open(f"/proc/{keeper}/stat").read().rsplit(")", 1)[1].split()[1])
    if server == 0:  # a pid namespace of its own: its init (forked from the keeper, the server's uid) stands in
        server = keeper
    uid = lambda pid: int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")).split()[1])
    import ctypes
    dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    ctx.record("seen", {"uid": os.geteuid(), "tried": tried, "server_uid": uid(server), "home": os.environ["HOME"],
                        "dumpable": dumpable})

def test_u(spmd):
    (folder,) = [p for p in os.scandir("results") if p.name.startswith("run-") and not p.is_symlink()]
    targets = {
        "results": os.path.abspath(os.path.join(folder.path, "run.json")),
        "checkout": os.path.abspath(__file__),
        "baselines": os.environ["SPMD_TEST_BASELINE"],
        "venv": os.path.join(sys.prefix, "pyvenv.cfg"),
    }
    seen = spmd.run(body, pid=os.getpid(), targets=targets).values["seen"]
    with open("seen.json", "w") as fh:  # written by pytest (root), read by the test below
        json.dump(seen, fh)
    assert seen["uid"] != 0, seen
"""


def test_the_run_header_says_whether_cases_are_isolated(pytester):
    pytester.makepyfile(test_one=ONE_CASE)
    result = run(pytester)
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    result.stdout.fnmatch_lines([f"cases run as pytest's own user ({who}): unisolated, a case body can write*"])
    refused = run(pytester, "--spmd-case-user=no-such-user-here")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--spmd-case-user=no-such-user-here: no such user on this machine*"])


@pytest.mark.skipif(os.geteuid() != 0, reason="only a run with root can run its cases as another user")
def test_a_case_user_that_cannot_reach_python_or_the_checkout_is_refused_before_any_case(pytester):
    # pytester's folder is under root's 0700 tmp folder (and here Python may be under /root too):
    # a child dropped to the user would fail at its first import, far from the cause.
    pytester.makepyfile(test_one=ONE_CASE)
    result = run(pytester, "--spmd-case-user=nobody")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-case-user=nobody: nobody cannot reach * is mode 700. Put Python*"])
    assert "cases run as" not in result.stdout.str()


def readable_by_others(path: Path) -> bool:
    """Every folder down to path can be entered by any user (the case user must reach Python)."""
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents] if p.is_dir())


def case_user_unusable() -> str | None:
    """Why this machine cannot run a case as another user, if it cannot."""
    if os.geteuid() != 0:
        return "only a run with root can run its cases as another user"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return "no user `nobody` on this machine"
    for what, path in (("Python", Path(sys.base_prefix)), ("venv", Path(sys.prefix)), ("checkout", REPO)):
        if not readable_by_others(path):
            return (
                f"this machine's {what} ({path}) is not readable by other users (e.g. under /root, mode 0700); "
                "run from a venv made with a world-readable Python, as the CI image has"
            )
    return None


@pytest.fixture
def world_readable_folder() -> Iterator[Path]:
    """A folder the case user can enter (pytest's own tmp_path is root's, mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="spmd-case-user-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.skipif(case_user_unusable() is not None, reason=str(case_user_unusable()))
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_case_run_as_the_case_user_cannot_write_the_runs_files_nor_signal_it(
    world_readable_folder: Path, workers: list[str]
):
    (world_readable_folder / "test_u.py").write_text(AS_USER)
    baseline = sorted((REPO / "baselines" / "shardings").glob("*.json"))[0]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider"]
        + ["--spmd-case-user=nobody", *workers],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=world_readable_folder,
        env={**os.environ, "SPMD_TEST_BASELINE": str(baseline)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cases and the fork servers that import torch_xla run as user nobody (uid 65534)" in proc.stdout
    assert "not isolated from each other" in proc.stdout  # the header says what does not hold too
    if namespaces_refused() is None:
        assert "runs in user, pid and mount namespaces of its own" in proc.stdout
    seen = json.loads((world_readable_folder / "seen.json").read_text())
    assert seen["server_uid"] != 0, "the fork server that imports the build ran as root"
    assert seen["dumpable"] == 0, "another case of the same uid could read this case's memory"
    assert not Path(seen["home"]).exists(), f"the case's HOME {seen['home']} was left behind"
    # pytest's process: EPERM where the case shares its pid namespace, ESRCH where it has one of its own
    signals = {
        what: "refused" if seen["tried"].get(what) in ("EPERM", "ESRCH") else seen["tried"].get(what)
        for what in ("SIGSTOP pytest", "SIGKILL pytest")
    }
    assert {**seen["tried"], **signals} == {
        "results": "EACCES",
        "checkout": "EACCES",
        "baselines": "EACCES",
        "venv": "EACCES",
        "new file in results": "EACCES",
        "SIGSTOP pytest": "refused",
        "SIGKILL pytest": "refused",
    }, seen


CASES_ATTACK_EACH_OTHER = """
import errno, json, os, pathlib, signal, time
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def wait_for(path):
    deadline = time.time() + 60
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)

def body_victim(ctx, shared):
    SHARED = pathlib.Path(shared)
    home = pathlib.Path(os.environ["HOME"])
    (home / "secret").write_text("victim's secret")
    import tempfile  # a file where the case's XLA dumps go (the run's dump root)
    dump = pathlib.Path(tempfile.mkdtemp(dir=os.environ["HARNESS_XLA_DUMP_ROOT"]), "step.txt")
    dump.write_text("victim's dump")
    (SHARED / "victim.json").write_text(json.dumps({"home": str(home), "pid": os.getpid(), "dump": str(dump)}))
    wait_for(SHARED / "attacker.done")

def body_attacker(ctx, shared):
    SHARED = pathlib.Path(shared)
    wait_for(SHARED / "victim.json")
    victim = json.loads((SHARED / "victim.json").read_text())
    me, ancestors = os.getpid(), {os.getpid(), os.getppid()}
    # the attacker's own family (what its init or it started) is its own to signal
    def ppid(pid):
        try:
            return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return -1
    visible = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    grew = True
    while grew:
        family = {pid for pid in visible if ppid(pid) in ancestors} - ancestors
        grew = bool(family)
        ancestors |= family
    reached = {}
    # What an attacker does: every process of its uid it can see, and the pid the victim published.
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in ancestors:
            continue
        pid = int(entry.name)
        try:
            if os.stat(entry.path).st_uid != os.getuid():
                continue
            os.kill(pid, signal.SIGSTOP)
            os.kill(pid, signal.SIGCONT)
            reached[f"signal {pid}"] = "done"
        except OSError as exc:
            reached[f"signal {pid}"] = errno.errorcode.get(exc.errno, str(exc))
        try:
            open(f"/proc/{pid}/environ", "rb").read()
            reached[f"environ {pid}"] = "done"
        except OSError as exc:
            pass  # not dumpable: refused either way
    if victim["pid"] not in ancestors:
        try:
            os.kill(victim["pid"], 0)
            reached["signal the victim's own pid"] = "done"
        except OSError as exc:
            pass
    try:
        reached["victim's HOME"] = pathlib.Path(victim["home"], "secret").read_text()
    except OSError as exc:
        pass
    try:
        reached["victim's dumps"] = pathlib.Path(victim["dump"]).read_text()
    except OSError as exc:
        pass
    (SHARED / "attacker.json").write_text(json.dumps(reached))
    (SHARED / "attacker.done").touch()

# the case's child has the harness's environment, not the test's: the folder travels as an argument
def test_victim(spmd):
    spmd.run(body_victim, shared=os.environ["SPMD_TEST_SHARED"])

def test_attacker(spmd):
    spmd.run(body_attacker, shared=os.environ["SPMD_TEST_SHARED"])
"""


def namespaces_refused() -> str | None:
    from harness.run import caseuser

    nobody = pwd.getpwnam("nobody")
    return caseuser.namespaces_refused(nobody.pw_uid, nobody.pw_gid)


@pytest.mark.skipif(case_user_unusable() is not None, reason=str(case_user_unusable()))
def test_a_case_cannot_signal_read_or_see_another_case_running_at_once(world_readable_folder: Path):
    """#51 item 2: two cases at once (-n 2) as one case user; the attacker SIGSTOPs every process
    of its uid it sees, reads their environ, signals the pid the victim published and reads the
    victim's HOME. Each case's own namespaces leave it nothing of the other to reach."""
    if namespaces_refused() is not None:
        pytest.skip(f"the kernel refuses the case user namespaces: {namespaces_refused()}")
    (world_readable_folder / "test_pair.py").write_text(CASES_ATTACK_EACH_OTHER)
    shared = world_readable_folder / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider"]
        + ["--spmd-case-user=nobody", "-n", "2", "-rA"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=world_readable_folder,
        env={**os.environ, "SPMD_TEST_SHARED": str(shared)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reached = json.loads((shared / "attacker.json").read_text())
    assert {what: how for what, how in reached.items() if how != "ESRCH"} == {}, reached
    home = json.loads((shared / "victim.json").read_text())["home"]
    assert not Path(home).exists(), f"the victim's HOME {home} was left behind"


DAEMON_OUTLIVES_ITS_CASE = """
import json, os, pathlib, time
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_daemon(ctx, shared):
    beat = pathlib.Path(shared, "heartbeat")
    if os.fork() == 0:  # double fork and a session of its own: what a daemon does to outlive its parent
        os.setsid()
        if os.fork() == 0:
            for fd in range(3):
                os.close(fd)
            while True:
                beat.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
                time.sleep(0.05)
        os._exit(0)
    while not beat.exists():
        time.sleep(0.05)

def body_looks(ctx, shared):
    beat = pathlib.Path(shared, "heartbeat")
    first = beat.read_text()
    time.sleep(1.0)
    ctx.record("still beating", beat.read_text() != first)

def test_a_daemon(spmd):
    spmd.run(body_daemon, shared=os.environ["SPMD_TEST_SHARED"])

def test_b_looks(spmd):
    assert spmd.run(body_looks, shared=os.environ["SPMD_TEST_SHARED"]).values["still beating"] is False
"""


@pytest.mark.skipif(case_user_unusable() is not None, reason=str(case_user_unusable()))
def test_a_daemon_a_case_user_body_starts_does_not_outlive_its_case(world_readable_folder: Path):
    """#51: a body run as the case user double-forks a daemon into a session of its own. It is
    ended with its case (the next case sees its heartbeat stopped), and nothing of the case user
    is left when the run ends."""
    (world_readable_folder / "test_daemon.py").write_text(DAEMON_OUTLIVES_ITS_CASE)
    shared = world_readable_folder / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider", "-p", "no:randomly"]
        + ["--spmd-case-user=nobody", "-rA"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=world_readable_folder,
        env={**os.environ, "SPMD_TEST_SHARED": str(shared)},
    )
    daemon = json.loads((shared / "heartbeat").read_text())["pid"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nobody = pwd.getpwnam("nobody").pw_uid
    left = [e.name for e in os.scandir("/proc") if e.name.isdigit() and _uid_of(e.name) == nobody]
    assert left == [], f"processes of the case user left after the run: {left} (the daemon was {daemon})"


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
