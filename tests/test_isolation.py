"""Black-box tests of the child-process runner through real pytest runs (pytester), fake backend.

Each test writes a small case file whose bodies pass, raise, abort, segfault or hang, runs pytest
on it in a subprocess, and checks what a user would see: outcomes, signal names, log tails, the
JUnit XML and the results folder.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.selftest

HEADER = """
import os, sys, time, signal
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]
"""

BODIES = """
def body_ok(ctx):
    ctx.record("pid", os.getpid())
    ctx.record_sharding("t", "{replicated}")

def body_raise(ctx):
    raise ValueError("the body said no")

def body_abort(ctx):
    print("F1122 12:00:00.000 hlo_instruction.h:1234] Check failed: has_sharding()", file=sys.stderr, flush=True)
    os.abort()

def body_segfault(ctx):
    print("about to dereference NULL", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)

def body_hang(ctx):
    print("entering a loop that never ends", file=sys.stderr, flush=True)
    while True:
        time.sleep(0.05)

def body_exit(ctx):
    os._exit(7)
"""


def write_cases(pytester: pytest.Pytester, tests: str) -> None:
    pytester.makepyfile(test_cases=HEADER + BODIES + tests)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--spmd-backend", "fake", "-p", "no:cacheprovider", *args)


def records(pytester: pytest.Pytester) -> dict[str, dict]:
    out = {}
    for path in (pytester.path / "results" / "latest").glob("verdicts-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out[rec["nodeid"].split("::")[-1]] = rec
    return out


def test_abort_is_one_failure_naming_sigabrt_with_the_check_line_and_the_run_goes_on(pytester):
    write_cases(
        pytester,
        """
def test_aborts(spmd):
    spmd.run(body_abort)

def test_after(spmd):
    spmd.run(body_ok)
""",
    )
    result = run(pytester, "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    # The failure leads with the signal and the fatal line, then says which case's child it was.
    result.stdout.fnmatch_lines(
        [
            "*CaseCrashed: SIGABRT: F1122 12:00:00.000 hlo_instruction.h:1234] Check failed: has_sharding()",
            "*(the child died while running case test_cases.py::test_aborts)*",
        ]
    )
    junit = ET.parse(pytester.path / "junit.xml").getroot()
    failures = [tc.get("name") for tc in junit.iter("testcase") if tc.find("failure") is not None]
    assert failures == ["test_aborts"]
    assert records(pytester)["test_aborts"]["evidence"].startswith("SIGABRT")


def test_segfault_and_exit_are_named(pytester):
    write_cases(
        pytester,
        """
def test_segv(spmd):
    spmd.run(body_segfault)

def test_exit(spmd):
    spmd.run(body_exit)
""",
    )
    result = run(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*CaseCrashed: SIGSEGV*", "*about to dereference NULL*", "*CaseCrashed: exit code 7*"])


def test_hang_is_killed_after_the_timeout_with_the_log_tail_and_the_run_goes_on(pytester):
    write_cases(
        pytester,
        """
def test_hangs(spmd):
    spmd.run(body_hang)

def test_after(spmd):
    spmd.run(body_ok)
""",
    )
    result = run(pytester, "--spmd-case-timeout", "2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CaseTimedOut: timeout after 2s*",
            "*case test_cases.py::test_hangs ran too long; the child's process group got SIGTERM, then SIGKILL*",
            "*entering a loop that never ends*",
        ]
    )
    # faulthandler dumps the hung child's Python stack on SIGTERM: the user sees where it hung.
    result.stdout.fnmatch_lines(["*body_hang*"])


def test_exception_in_body_shows_the_child_traceback(pytester):
    write_cases(
        pytester,
        """
def test_raises(spmd):
    spmd.run(body_raise)

def test_check_false_returns_the_result(spmd):
    result = spmd.run(body_raise, check=False)
    assert result.outcome == "error"
    assert result.exception.line == "ValueError: the body said no"
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*CaseFailed*", '*raise ValueError("the body said no")*', "*ValueError: the body said no*"]
    )


def test_every_body_gets_a_child_of_its_own_and_a_crash_takes_only_its_own(pytester):
    write_cases(
        pytester,
        """
PIDS = []

def test_a(spmd):
    PIDS.append(spmd.run(body_ok).values["pid"])
    PIDS.append(spmd.run(body_ok).values["pid"])
    assert PIDS[0] != PIDS[1], "a second body of the same case in the first one's process"

def test_b(spmd):
    PIDS.append(spmd.run(body_ok).values["pid"])
    assert PIDS[2] not in PIDS[:2], "the same environment's child was reused"

def test_c_crash(spmd):
    spmd.run(body_abort)

def test_d(spmd):
    pid = spmd.run(body_ok).values["pid"]
    assert pid not in PIDS, "a crashed child must not be reused"

def test_e_fresh(spmd):
    pid = spmd.run(body_ok, fresh=True).values["pid"]
    assert pid not in PIDS

def test_f_other_env(spmd):
    pid = spmd.run(body_ok, functionalization=False).values["pid"]
    assert pid not in PIDS
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=5, failed=1)


def test_crash_log_tail_holds_only_the_crashing_case_output(pytester):
    write_cases(
        pytester,
        """
def body_noisy(ctx):
    print("OUTPUT OF THE FIRST CASE", file=sys.stderr, flush=True)

def test_first(spmd):
    spmd.run(body_noisy)

def test_second(spmd):
    spmd.run(body_abort)
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    failure = "\n".join(line for line in result.outlines if "OUTPUT OF THE FIRST CASE" in line)
    assert failure == "", "the first case's output was attributed to the second case's crash"


def test_bad_backend_is_a_usage_error_naming_the_backends(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("--spmd-backend", "nosuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-backend: invalid choice: 'nosuch' (choose from *cpu*tpu*fake*)*"])


@pytest.mark.parametrize(
    "option, value",
    [
        pytest.param("--spmd-devices", "0", id="zero-devices"),
        pytest.param("--spmd-case-timeout", "-1", id="negative-timeout"),
    ],
)
def test_bad_numbers_are_usage_errors(pytester, option, value):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess(option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument {option}: *{value}* is not a positive*"])


def test_unmet_needs_skip_with_numbers(pytester):
    write_cases(
        pytester,
        """
@pytest.mark.needs(devices=8)
def test_eight(spmd):
    spmd.run(body_ok)

@pytest.mark.needs(backend="tpu", multislice=True)
def test_tpu(spmd):
    spmd.run(body_ok)

@pytest.mark.needs(xla=True)
def test_xla(spmd):
    spmd.run(body_ok)
""",
    )
    result = run(pytester, "-rs", "--spmd-devices", "4")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*needs 8 devices; backend fake has 4*",
            "*needs backend tpu; this run uses backend fake*",
            "*needs torch_xla; backend fake runs without it*",
        ]
    )
    assert records(pytester)["test_eight"]["outcome"] == "skipped"


def test_results_folder_has_one_record_per_case(pytester):
    write_cases(
        pytester,
        """
def test_ok(spmd):
    spmd.run(body_ok)

def test_raises(spmd):
    spmd.run(body_raise)
""",
    )
    run(pytester)
    recs = records(pytester)
    assert recs["test_ok"]["outcome"] == "passed"
    assert recs["test_ok"]["shardings"] == {"t": "{replicated}"}
    assert recs["test_ok"]["backend"] == "fake" and recs["test_ok"]["family"] == "cases"
    assert recs["test_raises"]["outcome"] == "failed"
    assert recs["test_raises"]["evidence"] == "ValueError: the body said no"


def test_xdist_workers_each_write_their_own_records(pytester):
    write_cases(
        pytester,
        "\n".join(
            f"""
def test_{i}(spmd):
    spmd.run(body_ok)
"""
            for i in range(4)
        ),
    )
    result = run(pytester, "-n", "2")
    result.assert_outcomes(passed=4)
    assert sorted(p.name for p in (pytester.path / "results" / "latest").glob("verdicts-*.jsonl")) == [
        "verdicts-gw0.jsonl",
        "verdicts-gw1.jsonl",
    ]
    assert len(records(pytester)) == 4


def test_a_local_function_is_refused_with_a_clear_error(pytester):
    write_cases(
        pytester,
        """
def test_local(spmd):
    def body(ctx):
        pass
    spmd.run(body)
""",
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*must be a module-level function*"])


def test_replay_reruns_the_journalled_bodies_in_bare_processes(pytester):
    write_cases(
        pytester,
        """
def test_ok(spmd):
    spmd.run(body_ok)

def test_raises(spmd):
    spmd.run(body_raise)
""",
    )
    run(pytester)
    replay = pytester.run(sys.executable, "-m", "harness.replay", "--results-dir", str(pytester.path / "results"))
    assert replay.ret == 1  # one body raises
    replay.stdout.fnmatch_lines(
        ["*test_cases.py::test_ok: ok*", "*test_cases.py::test_raises: ValueError: the body said no*"]
    )
