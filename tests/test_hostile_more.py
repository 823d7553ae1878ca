"""More case bodies that attack the run, beyond tests/test_hostile_bodies.py (fake backend, black-box
runs): what a body leaves in its process for the case after it (timers, faulthandler, tracing,
warnings, interpreter limits, torch's modes, replaced methods, stdio pointed elsewhere), and the
checkout rewritten under a running run. A later case's verdict must not depend on it: it runs in a
process of its own (issue 51; tests/test_fresh_world.py has that round's attacks).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_fake, spmd_report

pytestmark = pytest.mark.selftest


def run(pytester: pytest.Pytester, *args: str, timeout: float = 120) -> pytest.RunResult:
    return run_fake(pytester, "-p", "no:randomly", "-rA", *args, timeout=timeout)


# --- what a body leaves in its process for the next case -------------------------------------------

LEAVES = """
import faulthandler, os, signal, sys, time, warnings
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # CPU time too: ITIMER_PROF counts it
        pass

def leave_itimer(ctx):
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # SIGALRM, default action: the process ends

def leave_prof_timer(ctx):
    signal.setitimer(signal.ITIMER_PROF, 0.5)

def leave_faulthandler_exit(ctx):
    faulthandler.dump_traceback_later(1.0, exit=True)

def after_a_timer(ctx):
    spin(2.5)

after_itimer = after_prof_timer = after_faulthandler_exit = after_a_timer

def leave_warnings_as_errors(ctx):
    warnings.simplefilter("error")

def after_warnings_as_errors(ctx):
    warnings.warn("a harmless warning", UserWarning)

def leave_trace(ctx):
    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_name.startswith("after_"):
            raise RuntimeError("a trace function left by the case before")
    sys.settrace(trace)

def after_trace(ctx):
    pass

def leave_recursion_limit(ctx):
    sys.setrecursionlimit(80)

def after_recursion_limit(ctx):
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)
    depth(300)

def leave_torch_modes(ctx):
    import torch
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)

def after_torch_modes(ctx):
    import torch
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32, "torch's modes were left"

def leave_tensor_patch(ctx):
    import torch
    torch.Tensor.sum = lambda self, *a, **k: torch.tensor(0.0)

def after_tensor_patch(ctx):
    import torch
    assert float(torch.ones(3).sum()) == 3.0, "torch.Tensor.sum was replaced by the case before"

def leave_context_patch(ctx):
    from harness.isolation.child.context import CaseContext
    CaseContext.record_sharding = lambda self, name, spec: self.shardings.__setitem__(name, "{replicated}")

def after_context_patch(ctx):
    ctx.record_sharding("w", "{devices=[4,1]0,1,2,3}")
    assert ctx.shardings["w"] == "{devices=[4,1]0,1,2,3}", "the sharding recorded was forged"

def leave_body_patch(ctx):
    globals()["after_body_patch"] = lambda ctx: None  # the next case's body, made a no-op

def after_body_patch(ctx):
    raise AssertionError("the real failure of the next case")

def leave_stdio_elsewhere(ctx):
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)

def after_stdio_elsewhere(ctx):
    print("the next case's output", file=sys.stderr, flush=True)
    raise AssertionError("the next case fails, and its log says so")

def leave_descriptors(ctx):
    global KEPT
    KEPT = []
    try:
        while True:  # up to RLIMIT_NOFILE
            KEPT.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass

def after_descriptors(ctx):
    for fd in [os.open(os.devnull, os.O_RDONLY) for _ in range(40)]:
        os.close(fd)

def test_a_leaves(spmd):
    spmd.run(globals()["leave_" + os.environ["ATTACK"]])

def test_b_after(spmd):
    attack = os.environ["ATTACK"]
    spmd.run(globals()["after_" + attack])
"""

# attack -> the next case's outcome (its own: "failed" where its body fails by itself).
LEFT = {
    "itimer": "passed",
    "prof_timer": "passed",
    "faulthandler_exit": "passed",
    "warnings_as_errors": "passed",
    "trace": "passed",
    "recursion_limit": "passed",
    "torch_modes": "passed",
    "tensor_patch": "passed",
    "context_patch": "passed",
    "descriptors": "passed",
    "body_patch": "failed",
    "stdio_elsewhere": "failed",
}


@pytest.mark.parametrize("attack", sorted(LEFT))
def test_what_a_body_leaves_in_its_child_never_reaches_the_next_case(pytester, monkeypatch, attack):
    pytester.makepyfile(test_leaves=LEAVES)
    monkeypatch.setenv("ATTACK", attack)
    result = run(pytester)
    text = result.stdout.str()
    assert "INTERNALERROR" not in text + result.stderr.str()
    if LEFT[attack] == "passed":
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["FAILED test_leaves.py::test_b_after - *the next case*"])
    logs = [p.read_text(errors="replace") for p in pytester.path.glob("results/run-*/logs/*/child-*.log")]
    started = sorted(n for n in (log.count("[harness] case ") for log in logs) if n)
    if attack != "stdio_elsewhere":  # its own case's note went where the body pointed stderr
        assert started == [1, 1], f"cases started per child process: {started}"
    else:
        result.stdout.fnmatch_lines(["E * the next case's output"])


# --- the checkout rewritten while the run's cases run ----------------------------------------------

REWRITES_HARNESS = """
import os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_rewrites(ctx):
    import harness.isolation.child.main as child
    path = pathlib.Path(child.__file__)
    old = "        body(ctx, **request.kwargs)\\n"
    new = "        try:\\n            body(ctx, **request.kwargs)\\n        except Exception:\\n            pass\\n"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    ctx.poison("the next case takes a new child, which imports the harness from disk")

def body_fails(ctx):
    raise AssertionError("the real failure")

def test_a_rewrites(spmd):
    spmd.run(body_rewrites, check=False)

def test_b_fails(spmd):
    spmd.run(body_fails)
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2", "--dist=loadfile")])
def test_a_body_that_rewrites_the_harness_in_the_checkout_fails_the_run(pytester, workers):
    """The fake backend's children are exec'd fresh, so they import the rewritten child loop."""
    shutil.copytree(REPO / "harness", pytester.path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    pytester.makepyfile(test_rewrites=REWRITES_HARNESS)
    result = run(pytester, *workers)
    assert "except Exception" in (pytester.path / "harness" / "isolation" / "child" / "main.py").read_text(), (
        "not rewritten"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*spmd harness: the harness's code or the run's case files changed while the run's cases ran (by a case?): "
            "harness/isolation/child/main.py;*"
        ]
    )


# --- a body that stops the xdist controller ---------------------------------------------------------

STOPS_CONTROLLER = """
import os, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_stops(ctx, pid, sig):
    os.kill(pid, getattr(signal, sig))

def body_fails(ctx):
    raise AssertionError("the real failure")

def test_a_stops_the_controller(spmd):
    spmd.run(body_stops, pid=os.getppid(), sig=os.environ["SIG"])  # a worker's parent: the controller

def test_b_fails(spmd):
    spmd.run(body_fails)
"""


@pytest.mark.parametrize("sig", ["SIGSTOP", "SIGTSTP"])
def test_a_body_that_stops_the_xdist_controller_does_not_stop_the_run(pytester, monkeypatch, sig):
    pytester.makepyfile(test_stops=STOPS_CONTROLLER)
    monkeypatch.setenv("SIG", sig)
    result = run(pytester, "-n", "2", timeout=90)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_stops.py::test_b_fails - *AssertionError: the real failure"])


# --- links, huge files under results/ ---------------------------------------------------------------

PLANTS = """
import os, pathlib, shutil
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def run_folder():
    (folder,) = (p for p in pathlib.Path("results").glob("run-*") if not p.is_symlink())
    return folder.absolute()

def body_plants(ctx, attack, folder, outside):
    folder = pathlib.Path(folder)
    if attack == "hlo":
        shutil.rmtree(folder / "hlo", ignore_errors=True)
        (folder / "hlo").symlink_to(outside)
    elif attack == "logs":
        shutil.rmtree(folder / "logs")
        (folder / "logs").symlink_to(outside)
    elif attack == "sparse":
        with open(folder / "verdicts-main.jsonl", "r+b") as fh:
            fh.truncate(50 * 2**30)  # sparse: no disk used, one 50 GB line of NULs

def body_keeps(ctx):
    ctx.record_hlo("m", "HloModule m")

def test_a(spmd):
    spmd.run(body_keeps)

def test_b_plants(spmd):
    spmd.run(body_plants, attack=os.environ["ATTACK"], folder=str(run_folder()), outside=os.environ["OUTSIDE"])
    spmd.run(body_keeps, fresh=True)  # a new child: a new log
"""


@pytest.mark.parametrize("attack", ["hlo", "logs"])
def test_a_link_planted_in_place_of_a_run_subfolder_is_not_written_through(pytester, monkeypatch, tmp_path, attack):
    outside = tmp_path / "outside"
    outside.mkdir()
    pytester.makepyfile(test_plants=PLANTS)
    monkeypatch.setenv("ATTACK", attack)
    monkeypatch.setenv("OUTSIDE", str(outside))
    run(pytester).assert_outcomes(passed=2)
    assert list(outside.iterdir()) == [], "written through the link"
    (folder,) = (p for p in (pytester.path / "results").glob("run-*") if not p.is_symlink())
    if attack == "hlo":
        assert (folder / "hlo" / "test_plants.py_test_b_plants__m.txt").is_file()


def test_a_verdicts_file_grown_sparse_to_50_gb_is_damaged_not_read(pytester, monkeypatch):
    pytester.makepyfile(test_plants=PLANTS)
    monkeypatch.setenv("ATTACK", "sparse")
    monkeypatch.setenv("OUTSIDE", "")
    run(pytester).assert_outcomes(passed=2)
    (folder,) = (p for p in (pytester.path / "results").glob("run-*") if not p.is_symlink())
    proc = spmd_report(str(folder), "--pytest-exit-status", "0")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "verdicts-main.jsonl (51200 MiB, more than any file the harness writes (256 MiB); not read)" in (
        proc.stdout + proc.stderr
    )


# --- what a body raises: text UTF-8 cannot hold, a message of 200 MB, terminal escapes --------------

RAISES = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_raises(ctx, kind):
    if kind == "surrogates":
        raise RuntimeError("\\udcff\\x00 not UTF-8")
    if kind == "huge":
        raise RuntimeError("A" * (200 * 2**20))
    raise RuntimeError("the screen \\x1b[2J\\x1b]0;a title\\x07cleared")

@pytest.mark.parametrize("kind", ["surrogates", "huge", "escapes"])
def test_w(spmd, kind):
    spmd.run(body_raises, kind=kind)
"""


def test_a_failure_text_utf8_cannot_hold_still_gets_its_summary_and_annotation(pytester):
    pytester.makepyfile(test_raises=RAISES)
    # Not runpytest: pytest prints the failure's text with the surrogate as a raw 0xff byte, which
    # pytester cannot decode.
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "--spmd-backend=fake", "-p", "no:cacheprovider", "-k", "surrogates"],
        capture_output=True,
        timeout=120,
        cwd=pytester.path,
    )
    assert ran.returncode == 1 and b"1 failed" in ran.stdout, ran.stdout + ran.stderr
    (folder,) = (p for p in (pytester.path / "results").glob("run-*") if not p.is_symlink())
    proc = spmd_report(str(folder), "--pytest-exit-status", "1", "--annotate", text=False)
    assert b"Traceback" not in proc.stderr, proc.stderr
    assert b"::error title=SPMD regression%3A test_raises.py%3A%3Atest_w[surrogates]::" in proc.stdout
    assert "\\udcff" in (folder / "summary.md").read_text()


def test_a_200_mb_exception_message_is_cut_and_still_leads_the_evidence(pytester):
    pytester.makepyfile(test_raises=RAISES)
    result = run(pytester, "-k", "huge")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED test_raises.py::test_w?huge? - RuntimeError: AAAA*"])


def test_terminal_escapes_a_body_raises_do_not_reach_the_terminal_raw(pytester):
    pytester.makepyfile(test_raises=RAISES)
    result = run(pytester, "-k", "escapes")
    result.assert_outcomes(failed=1)
    assert "\x1b" not in result.stdout.str()
    result.stdout.fnmatch_lines(["E * RuntimeError: the screen \\x1b?2J\\x1b?0;a title\\x07cleared"])


# --- open: a module object put in sys.modules before its first import -------------------------------

PLANTS_MODULE = """
import sys, types
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_plants(ctx):
    planted = types.ModuleType("spmd_not_imported_yet")
    planted.VALUE = "the body's"
    sys.modules["spmd_not_imported_yet"] = planted

def body_imports(ctx):
    try:
        import spmd_not_imported_yet
    except ImportError:
        return
    raise AssertionError(f"import gave {spmd_not_imported_yet.VALUE} module")

def test_a(spmd):
    spmd.run(body_plants)

def test_b(spmd):
    spmd.run(body_imports)
"""


def test_a_module_planted_in_sys_modules_before_its_import_does_not_reach_the_next_case(pytester):
    pytester.makepyfile(test_plants_module=PLANTS_MODULE)
    run(pytester).assert_outcomes(passed=2)
