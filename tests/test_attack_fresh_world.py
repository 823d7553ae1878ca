"""Issue 51, attacked as a hostile pull request would (fake backend, black-box runs): what the
run's held inputs do not hold yet.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_cpu, run_fake

pytestmark = pytest.mark.selftest

# The helper is imported by a case module (as cases/models.py is), not held by hash: case a rewrites
# it, case b's fresh child imports the rewritten one, case c puts the original bytes back (and its
# mtime) so the end-of-run fingerprint sees nothing changed.
HELPER = """
def check(value):
    assert value == 1, "the real failure"
"""

REWRITES_AND_RESTORES = """
import os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]
HELPER = pathlib.Path(__file__).with_name("helper_models.py")
SAVED = pathlib.Path(__file__).with_name("saved.bin")

def body_rewrites(ctx, path, saved):
    helper = pathlib.Path(path)
    info = helper.stat()
    pathlib.Path(saved).write_bytes(helper.read_bytes())
    helper.write_text("def check(value):\\n    pass\\n")
    os.utime(helper, (info.st_atime + 5, info.st_mtime + 5))

def body_uses(ctx):
    import helper_models
    helper_models.check(2)

def body_restores(ctx, path, saved):
    helper = pathlib.Path(path)
    info = helper.stat()
    helper.write_bytes(pathlib.Path(saved).read_bytes())
    os.utime(helper, (info.st_atime - 5, info.st_mtime - 5))
    pathlib.Path(saved).unlink()

def test_a_rewrites(spmd):
    spmd.run(body_rewrites, path=str(HELPER), saved=str(SAVED))

def test_b_uses(spmd):
    spmd.run(body_uses)

def test_c_restores(spmd):
    spmd.run(body_restores, path=str(HELPER), saved=str(SAVED))
"""


def test_a_helper_module_rewritten_and_put_back_between_cases_does_not_pass_the_run(pytester):
    pytester.makepyfile(helper_models=HELPER, test_attack=REWRITES_AND_RESTORES)
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    out = result.stdout.str()
    assert (pytester.path / "helper_models.py").read_text().strip() == HELPER.strip(), "not put back"
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.stdout.fnmatch_lines(["*changed while the run's cases ran (by a case?): helper_models.py*"])


# A body that kills or stops the fork server its child was forked from (its parent): the run starts
# another server and goes on, but the case that did it must not pass (real torch_xla: the fake
# backend's children do not come from an importing server).
KILLS_SERVER = """
import pytest

pytestmark = [pytest.mark.spmd]

def body_signals_server(ctx, sig):
    import os, signal, time
    keeper = os.getppid()  # the child's keeper; its parent is the server
    server = int(open(f"/proc/{keeper}/stat").read().rsplit(")", 1)[1].split()[1])
    assert server != 1, "the server had ended before this case"
    os.kill(server, getattr(signal, sig))
    time.sleep(1)

def body_ok(ctx):
    pass

@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_a_signals_server(spmd, sig):
    spmd.run(body_signals_server, sig=sig)

def test_b_ok(spmd):
    spmd.run(body_ok)
"""


@pytest.mark.parametrize(
    "sig, said",
    [("SIGKILL", "ended during the case"), ("SIGSTOP", "was stopped during the case")],
)
def test_a_case_that_kills_or_stops_its_fork_server_is_charged_with_it(pytester, sig, said):
    """SIGSTOP: before, the stopping case passed and the next waited 180 s for a server that never
    answered, then the one after it, until the run was killed."""
    pytester.makepyfile(test_attack=KILLS_SERVER)
    result = run_cpu(pytester, "-p", "no:randomly", "-rA", "-k", f"{sig} or test_b_ok")
    out = result.stdout.str()
    assert "PASSED test_attack.py::test_b_ok" in out, out  # the run goes on
    assert f"PASSED test_attack.py::test_a_signals_server[{sig}]" not in out, out
    result.stdout.fnmatch_lines(
        [f"E*CaseCrashed: case *test_a_signals_server*{sig}*: the fork server its child was forked from {said}*"]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
