"""Faults injected into the child runner (fake backend): each charged to its own case, nothing left running.

Every test writes a case file in which a faulty body is followed by a healthy case, runs pytest
on it in a subprocess, and checks what a maintainer would see: which case failed and why, that
the healthy case ran in a sound child, one record per case, and no process left over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.isolation.system.processes import is_running
from tests.conftest import reaped

pytestmark = pytest.mark.selftest

HEADER = '''
import json, os, resource, signal, subprocess, sys, threading, time
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    ctx.record("pid", os.getpid())
    ctx.record("rlimit_as", list(resource.getrlimit(resource.RLIMIT_AS)))
    ctx.record("stdio_open", all(os.path.exists(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)))

def healthy(spmd):
    """The innocent next case: it must pass, in a child no fault has touched."""
    values = spmd.run(body_ok).values
    assert values["stdio_open"]
    return values["pid"]
'''


def write(pytester: pytest.Pytester, tests: str) -> None:
    pytester.makepyfile(test_faults_cases=HEADER + tests)


def run(pytester: pytest.Pytester, *args: str, timeout: float = 120) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--spmd-backend=fake", "-p", "no:cacheprovider", "--junitxml=junit.xml", *args, timeout=timeout
    )


def records(pytester: pytest.Pytester) -> dict[str, dict]:
    """Records by test name, amendments folded in (as harness.records.results.read_records does)."""
    from harness.records.results import read_records

    return {r.nodeid.split("::")[-1]: r.__dict__ for r in read_records(pytester.path / "results")}


def raw_record_lines(pytester: pytest.Pytester) -> list[dict]:
    lines = []
    for path in (pytester.path / "results" / "latest").glob("verdicts-*.jsonl"):
        lines += [json.loads(line, parse_constant=_no_constants) for line in path.read_text().splitlines()]
    return lines


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} in a verdicts file: not valid JSON")


def leftover_processes(folder: Path) -> list[str]:
    """Live processes whose working directory is the test's folder (children inherit pytest's)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) != folder:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found.append(f"{proc.name} [{state}] {cmdline}")
    return found


def assert_nothing_left(folder: Path, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while leftover_processes(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftover_processes(folder) == [], "processes of the run outlived it"


# ------------------------------------------------------------------------------------------
# 1. Descendants
# ------------------------------------------------------------------------------------------


def test_helpers_a_body_starts_do_not_outlive_the_run(pytester):
    write(
        pytester,
        """
def body_starts_helpers(ctx):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)

def test_helpers(spmd):
    spmd.run(body_starts_helpers)

def test_after(spmd):
    healthy(spmd)
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)
    assert_nothing_left(pytester.path)


def test_a_body_that_forks_then_aborts_is_a_sigabrt_at_once_not_a_timeout(pytester):
    write(
        pytester,
        """
def body_forks_then_aborts(ctx):
    if os.fork() == 0:  # the copy keeps the result pipe open
        time.sleep(600)
        os._exit(0)
    print("F0101 00:00:00.000000 1 x.cc:1] Check failed: the parent half", file=sys.stderr, flush=True)
    os.abort()

def test_forks_then_aborts(spmd):
    spmd.run(body_forks_then_aborts)

def test_after(spmd):
    healthy(spmd)
""",
    )
    started = time.monotonic()
    result = run(pytester, "--spmd-case-timeout=60")
    assert time.monotonic() - started < 40, "the crash waited for the case timeout"
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CaseCrashed: SIGABRT: F0101 *Check failed: the parent half"])
    assert records(pytester)["test_forks_then_aborts"]["evidence"].startswith("SIGABRT: F0101")
    assert_nothing_left(pytester.path)


# ------------------------------------------------------------------------------------------
# 2. Stopping pytest
# ------------------------------------------------------------------------------------------

STOPPABLE = """
def body_busy(ctx, marker):
    with open(marker, "w") as fh:
        fh.write(str(os.getpid()))
    while True:  # busy, never reads stdin
        pass

def test_a_finishes(spmd):
    healthy(spmd)

def test_b_busy(spmd):
    spmd.run(body_busy, marker=os.path.abspath("busy.pid"))
"""


# How the run is set up: children exec'd by pytest itself, or forked by the run's shared fork
# server under two xdist workers (server, keepers, workers and children must all go).
STOP_MODES = {"fresh": [], "forked-xdist": ["--spmd-fork-server=on", "-m", "spmd", "-n", "2"]}


def _sigint_at_its_default() -> None:
    """In the pytest about to start (after the fork, before its exec): SIGINT at its default and
    not blocked, whatever this process has. A process a non-interactive shell starts in the
    background (`CI=true bash .ci/run &`) ignores SIGINT; exec keeps an ignored signal ignored and
    Python then installs no Ctrl-C handler, so the pytest under test would never see the SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.parametrize("mode", list(STOP_MODES))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_stopping_pytest_ends_the_busy_child(pytester, sig, mode):
    write(pytester, STOPPABLE)
    with reaped(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "--spmd-backend=fake",
                "-p",
                "no:cacheprovider",
                "--junitxml=junit.xml",
                *STOP_MODES[mode],
                "test_faults_cases.py",
            ],
            cwd=pytester.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_sigint_at_its_default,
        )
    ) as pytest_proc:
        marker = pytester.path / "busy.pid"
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline and pytest_proc.poll() is None, "the busy case never started"
            time.sleep(0.05)
        busy_pid = int(marker.read_text())
        pytest_proc.send_signal(sig)
        try:
            output = pytest_proc.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"pytest still ran 60 s after {sig.name}:\n{(exc.output or b'').decode(errors='replace')}")
    assert_nothing_left(pytester.path, within_s=10.0)
    assert not is_running(busy_pid), "the busy child outlived pytest"
    if sig is not signal.SIGKILL and mode == "fresh":  # a graceful stop keeps what finished
        assert pytest_proc.returncode == pytest.ExitCode.INTERRUPTED, output
        assert records(pytester)["test_a_finishes"]["outcome"] == "passed"
        junit = ET.parse(pytester.path / "junit.xml").getroot()
        assert "test_a_finishes" in [tc.get("name") for tc in junit.iter("testcase")]


# ------------------------------------------------------------------------------------------
# 3. Answers matched to requests; deaths after a verdict charged to the case that caused them
# ------------------------------------------------------------------------------------------

SEND_EXTRA = """
def send(line: bytes):
    os.write(int(os.environ["HARNESS_RESULT_FD"]), line)

def body_answers_twice(ctx):
    send(b'{"kind": "verdict", "id": 999, "case": "x", "outcome": "ok", "exception": null, '
         b'"observations": {"shardings": {}, "hlo": {}, "values": {}}, "duration_s": 0.0}\\n')

def body_forked_copy_answers(ctx):
    if os.fork() == 0:
        return  # the copy finishes the request too and sends its own verdict
    time.sleep(0.5)
"""


@pytest.mark.parametrize("body", ["body_answers_twice", "body_forked_copy_answers"])
def test_an_extra_answer_fails_its_own_case_and_the_next_case_runs_in_a_new_child(pytester, body):
    write(
        pytester,
        SEND_EXTRA
        + f"""
PIDS = []

def test_faulty(spmd):
    PIDS.append(spmd.run(body_ok).values["pid"])
    spmd.run({body})

def test_after(spmd):
    time.sleep(2.5)  # well past the fault, also on a loaded machine
    assert healthy(spmd) not in PIDS
""",
    )
    result = run(pytester)
    # The wrong id is seen in flight; a forked copy's duplicate may come after the verdict, and is
    # then charged to the same case when the next one starts: either way the faulty case fails.
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    faulty = records(pytester)["test_faulty"]
    assert faulty["outcome"] == "failed"
    assert "protocol failure" in (faulty["evidence"] + faulty["late_fault"])
    assert records(pytester)["test_after"]["outcome"] == "passed"
    assert_nothing_left(pytester.path)


def test_a_crash_after_the_verdict_is_charged_to_the_case_that_caused_it(pytester):
    write(
        pytester,
        """
def body_crashes_in_the_background(ctx):
    def later():
        time.sleep(0.3)
        print("F0101 00:00:00.000000 1 async.cc:1] Check failed: async work after the body", file=sys.stderr, flush=True)
        os.abort()
    threading.Thread(target=later).start()

def test_faulty(spmd):
    spmd.run(body_crashes_in_the_background)

def test_after(spmd):
    time.sleep(2.5)  # the crash happens while the child is idle, also on a loaded machine
    healthy(spmd)
""",
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*faults after a case's verdict (charged to that case)*",
            "FAULT test_faults_cases.py::test_faulty: SIGABRT after the verdict of this case*Check failed: async work*",
        ]
    )
    recs = records(pytester)
    assert recs["test_faulty"]["outcome"] == "failed"
    assert recs["test_faulty"]["late_fault"].startswith("SIGABRT after the verdict of this case")
    assert recs["test_after"]["outcome"] == "passed"


def test_a_crash_after_the_last_verdict_is_found_at_the_end_of_the_session(pytester):
    write(
        pytester,
        """
def body_crashes_in_the_background(ctx):
    def later():
        time.sleep(0.3)
        os.abort()
    threading.Thread(target=later).start()

def test_last(spmd):
    spmd.run(body_crashes_in_the_background)
    time.sleep(2.5)  # well past the fault, also on a loaded machine
""",
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert records(pytester)["test_last"]["late_fault"].startswith("SIGABRT")


def test_a_body_that_closes_stdio_costs_the_next_case_nothing(pytester):
    write(
        pytester,
        """
PIDS = []

def body_closes_stdio(ctx):
    ctx.record("pid", os.getpid())
    for fd in (0, 1, 2):
        os.close(fd)

def test_closes(spmd):
    PIDS.append(spmd.run(body_closes_stdio).values["pid"])

def test_after(spmd):
    assert healthy(spmd) not in PIDS
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)


# ------------------------------------------------------------------------------------------
# 4. Garbage on the result pipe
# ------------------------------------------------------------------------------------------


def test_garbage_on_the_result_pipe_is_a_protocol_failure_of_its_case(pytester):
    write(
        pytester,
        """
PIDS = []

def body_garbles(ctx):
    print("about to write garbage", file=sys.stderr, flush=True)
    os.write(int(os.environ["HARNESS_RESULT_FD"]), b"\\xff\\xfe not json at all\\n")
    time.sleep(0.5)

def test_garbles(spmd):
    PIDS.append(spmd.run(body_ok).values["pid"])
    spmd.run(body_garbles)

def test_after(spmd):
    assert healthy(spmd) not in PIDS
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CaseProtocolError: protocol failure: the child sent undecodable line*",
            "*(case test_faults_cases.py::test_garbles; the child was discarded)*",
            "*about to write garbage*",
        ]
    )


# ------------------------------------------------------------------------------------------
# 5, 6. Output size
# ------------------------------------------------------------------------------------------


def test_a_50_mb_log_line_is_cut_in_the_failure_and_the_junit(pytester):
    write(
        pytester,
        """
def body_floods(ctx):
    sys.stderr.write("x" * 50_000_000 + "\\n")
    sys.stderr.flush()
    print("F0101 00:00:00.000000 1 x.cc:1] Check failed: after the flood", file=sys.stderr, flush=True)
    os.abort()

def test_floods(spmd):
    spmd.run(body_floods)
""",
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert (pytester.path / "junit.xml").stat().st_size < 200_000
    assert len("\n".join(result.outlines)) < 200_000
    result.stdout.fnmatch_lines(["*CaseCrashed: SIGABRT: F0101 *Check failed: after the flood"])


def test_a_30_mb_observation_arrives_whole(pytester):
    write(
        pytester,
        """
def body_big(ctx):
    ctx.record_hlo("big", "y" * 30_000_000)

def test_big(spmd):
    assert len(spmd.run(body_big).hlo["big"]) == 30_000_000
""",
    )
    run(pytester).assert_outcomes(passed=1)


def test_an_80_mb_verdict_arrives_well_within_the_case_timeout(pytester):
    """Reading a verdict is linear: 80 MB once took 33 s after the body ended, past this timeout;
    it takes under a second now (benchmarks/verdict_transfer.py has the numbers)."""
    write(
        pytester,
        """
def body_big(ctx):
    ctx.record_hlo("big", "y" * 80_000_000)

def test_big(spmd):
    assert len(spmd.run(body_big).hlo["big"]) == 80_000_000
""",
    )
    run(pytester, "--spmd-case-timeout=20").assert_outcomes(passed=1)


def test_observations_over_the_limit_are_a_clear_error(pytester):
    write(
        pytester,
        """
from harness.isolation.wire.protocol import MAX_MESSAGE_BYTES

def body_too_big(ctx):
    ctx.record_hlo("huge", "z" * (MAX_MESSAGE_BYTES + 1000))

def test_too_big(spmd):
    spmd.run(body_too_big)

def test_after(spmd):
    healthy(spmd)
""",
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ObservationsTooLarge*over the harness's limit of 134 MB*hlo?'huge'?*"])


# ------------------------------------------------------------------------------------------
# 7. Configuration mistakes: refused before any case runs
# ------------------------------------------------------------------------------------------


def test_an_unknown_known_bug_id_is_a_usage_error_naming_the_closest(pytester):
    write(
        pytester,
        """
def body_marks(ctx):
    open("body-ran", "w").close()

@pytest.mark.known_bug("fsdpv2-scalar-param-specs")
def test_typo(spmd):
    spmd.run(body_marks)
""",
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*no known-bug entry 'fsdpv2-scalar-param-specs'*did you mean fsdpv2-scalar-param-spec*"]
    )
    assert not (pytester.path / "body-ran").exists()


def test_overlapping_entries_on_one_case_are_a_usage_error(pytester):
    write(
        pytester,
        """
@pytest.mark.known_bug("fsdpv2-scalar-param-spec")
@pytest.mark.known_bug("fsdpv2-scalar-output-spec")
def test_both(spmd):
    spmd.run(body_ok)
""",
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*both claim torch_xla*"])


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_an_unusable_results_dir_is_a_usage_error(pytester, where):
    (pytester.path / "a-file").write_text("")
    write(pytester, "def test_x(spmd):\n    healthy(spmd)\n")
    result = run(pytester, f"--spmd-results-dir={where}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-results-dir=*cannot be used*writable folder*"])


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-3"])
def test_timeouts_must_be_positive_and_finite(pytester, value):
    write(pytester, "def test_x(spmd):\n    healthy(spmd)\n")
    result = run(pytester, f"--spmd-case-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-case-timeout*is not a positive, finite number of seconds*"])


# ------------------------------------------------------------------------------------------
# 8. Smaller things
# ------------------------------------------------------------------------------------------


def test_a_memory_error_under_a_lowered_limit_does_not_reach_the_next_case(pytester):
    write(
        pytester,
        """
FIRST = {}

def body_limits_itself(ctx):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    ctx.record("pid", os.getpid())
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, hard))
    bytearray(4_000_000_000)

def test_memory_error(spmd):
    FIRST.update(spmd.run(body_ok).values)
    result = spmd.run(body_limits_itself, check=False)
    assert result.exception.type == "MemoryError"

def test_after(spmd):
    values = spmd.run(body_ok).values
    assert values["pid"] != FIRST["pid"]
    assert values["rlimit_as"] == FIRST["rlimit_as"]
""",
    )
    run(pytester).assert_outcomes(passed=2)


def test_bodies_and_arguments_that_cannot_travel_are_usage_errors_naming_them(pytester):
    write(
        pytester,
        """
body_lambda = lambda ctx: None

def test_lambda(spmd):
    spmd.run(body_lambda)

def test_set_argument(spmd):
    spmd.run(body_ok, shapes={1, 2})

def test_nan_argument(spmd):
    spmd.run(body_ok, scale=float("nan"))
""",
    )
    result = run(pytester)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*HarnessUsageError: case body <lambda> must be a module-level function (def, not a lambda*",
            "*HarnessUsageError: argument shapes={1, 2} of case body body_ok is not strict JSON*",
            "*HarnessUsageError: argument scale=nan of case body body_ok is not strict JSON*",
        ]
    )


def test_observations_that_are_not_json_fail_naming_the_key_and_verdicts_stay_valid_json(pytester):
    write(
        pytester,
        """
def body_records_a_set(ctx):
    ctx.record("devices", {1, 2})

def body_records_infinity(ctx):
    ctx.record("loss", float("inf"))

def body_appends_infinity_later(ctx):
    ctx.record("losses", []).append(float("inf"))

def test_set(spmd):
    spmd.run(body_records_a_set)

def test_infinity(spmd):
    spmd.run(body_records_infinity)

def test_appended(spmd):
    spmd.run(body_appends_infinity_later)
""",
    )
    result = run(pytester)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*ctx.record('devices', ...): the value is not strict JSON*",
            "*ctx.record('loss', ...): the value is not strict JSON*",
            "*ctx values 'losses' is not strict JSON*",
        ]
    )
    assert len(raw_record_lines(pytester)) == 3


# ------------------------------------------------------------------------------------------
# All of it in one run
# ------------------------------------------------------------------------------------------


def test_one_run_of_every_fault_leaves_one_record_per_case_and_nothing_running(pytester):
    write(
        pytester,
        SEND_EXTRA
        + """
def body_forks_then_aborts(ctx):
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    os.abort()

def body_hangs(ctx):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    while True:
        time.sleep(0.05)

def body_crashes_later(ctx):
    threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGSEGV))).start()

def body_garbles(ctx):
    os.write(int(os.environ["HARNESS_RESULT_FD"]), b"\\x00\\x01\\n")
    time.sleep(0.5)

def test_1_forks_then_aborts(spmd):
    spmd.run(body_forks_then_aborts)

def test_2_hangs(spmd):
    spmd.run(body_hangs)

def test_3_crashes_later(spmd):
    spmd.run(body_crashes_later)

def test_4_garbles(spmd):
    time.sleep(2.5)  # well past the fault, also on a loaded machine
    spmd.run(body_garbles)

def test_5_answers_twice(spmd):
    spmd.run(body_answers_twice)

def test_6_healthy(spmd):
    time.sleep(2.5)  # well past the fault, also on a loaded machine
    healthy(spmd)
""",
    )
    result = run(pytester, "--spmd-case-timeout=3")
    recs = records(pytester)
    assert len([line for line in raw_record_lines(pytester) if "amends" not in line]) == 6
    causes = {
        name: (rec["outcome"], (rec["late_fault"] or rec["evidence"] or "-").splitlines()[0])
        for name, rec in recs.items()
    }
    assert causes["test_1_forks_then_aborts"][1].startswith("SIGABRT"), causes
    assert causes["test_2_hangs"][1].startswith("timeout after 3s"), causes
    assert causes["test_3_crashes_later"][1].startswith("SIGSEGV after the verdict of this case"), causes
    assert causes["test_4_garbles"][1].startswith("protocol failure: the child sent undecodable line"), causes
    assert causes["test_5_answers_twice"][1].startswith("protocol failure"), causes
    assert causes["test_6_healthy"][0] == "passed", causes
    assert all(outcome == "failed" for name, (outcome, _) in causes.items() if name != "test_6_healthy"), causes
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_nothing_left(pytester.path)


# ------------------------------------------------------------------------------------------
# 9. Trust at the edges: keepers, escaped helpers, threads left running (issue #18, 5-7)
# ------------------------------------------------------------------------------------------

# Both ways a child is started: exec'd fresh, or forked by a fork server. Either way its parent
# is a keeper that waits for it (harness/isolation/server/forkserver.py).
CHILD_MODES = {"fresh": ["--spmd-fork-server=off"], "forked": ["--spmd-fork-server=on"]}


def kill_recorded(folder: Path) -> None:
    """Clean up after a failing run: SIGKILL every pid a body wrote to helper-*.pid."""
    for path in folder.glob("helper-*.pid"):
        try:
            os.kill(int(path.read_text() or 0), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize("mode", list(CHILD_MODES))
def test_a_body_that_stops_its_keeper_does_not_hang_the_run(pytester, mode):
    write(
        pytester,
        """
def body_stops_keeper(ctx):
    os.kill(os.getppid(), signal.SIGSTOP)

def test_stops(spmd):
    spmd.run(body_stops_keeper)

def test_after(spmd):
    healthy(spmd)
""",
    )
    started = time.monotonic()
    result = run(pytester, *CHILD_MODES[mode], timeout=90)
    result.assert_outcomes(passed=2)
    assert time.monotonic() - started < 60, "closing the pool waited on the stopped keeper"
    assert_nothing_left(pytester.path)


@pytest.mark.parametrize("mode", list(CHILD_MODES))
def test_a_keeper_killed_before_its_child_aborts_leaves_the_childs_sigabrt(pytester, mode):
    write(
        pytester,
        """
def body_kills_keeper_then_aborts(ctx):
    keeper = os.getppid()
    os.kill(keeper, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.getppid() == keeper and time.monotonic() < deadline:  # adopted by whoever reaps orphans
        time.sleep(0.01)
    print("F0101 00:00:00.000000 1 x.cc:1] Check failed: after the keeper died", file=sys.stderr, flush=True)
    os.abort()

def test_kills_keeper(spmd):
    spmd.run(body_kills_keeper_then_aborts)

def test_after(spmd):
    healthy(spmd)
""",
    )
    result = run(pytester, *CHILD_MODES[mode], timeout=90)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CaseCrashed: SIGABRT: F0101 *Check failed: after the keeper died"])
    assert records(pytester)["test_kills_keeper"]["evidence"].startswith("SIGABRT: F0101")
    assert_nothing_left(pytester.path)


ESCAPING_HELPERS = """
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"

def sleeper(name):
    return [sys.executable, "-c", SLEEPER, os.path.abspath(f"helper-{name}.pid")]

def body_escapes(ctx):
    # A session of its own: the child's process group no longer holds it.
    subprocess.Popen(sleeper("new-session"), start_new_session=True)
    # A double fork: the middle process exits, the helper is an orphan in a session of its own.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, sleeper("double-fork"))
        os._exit(0)
    deadline = time.monotonic() + 30
    while len([p for p in os.listdir() if p.startswith("helper-") and open(p).read()]) < 2:
        assert time.monotonic() < deadline, "the helpers did not start"
        time.sleep(0.05)
"""


@pytest.mark.parametrize("mode", list(CHILD_MODES))
def test_helpers_that_leave_the_session_do_not_outlive_their_child(pytester, mode):
    write(
        pytester,
        ESCAPING_HELPERS
        + """
PIDS = []

def test_escapes(spmd):
    PIDS.append(spmd.run(body_escapes).values.get("pid"))

def test_after(spmd):
    assert healthy(spmd) not in PIDS, "a child that left helpers running was reused"
""",
    )
    try:
        result = run(pytester, *CHILD_MODES[mode], timeout=90)
        result.assert_outcomes(passed=2)
        pids = [int(path.read_text()) for path in pytester.path.glob("helper-*.pid")]
        assert len(pids) == 2
        assert_nothing_left(pytester.path)
        assert not [pid for pid in pids if is_running(pid)], "an escaped helper outlived the run"
    finally:
        kill_recorded(pytester.path)


@pytest.mark.parametrize("mode", list(CHILD_MODES))
def test_a_thread_left_running_is_charged_to_its_case_not_the_next(pytester, mode):
    write(
        pytester,
        """
PIDS = []

def body_leaves_a_thread(ctx, go):
    ctx.record("pid", os.getpid())
    def later():  # fires only once the next case has begun (in whatever child that runs)
        while not os.path.exists(go):
            time.sleep(0.01)
        print("F0101 00:00:00.000000 1 async.cc:1] Check failed: left running", file=sys.stderr, flush=True)
        os.abort()
    threading.Thread(target=later, daemon=True).start()

def body_next(ctx, go):
    open(go, "w").close()
    time.sleep(3)  # long enough for a thread waiting on `go` in this process to fire
    body_ok(ctx)

def test_leaves_thread(spmd):
    PIDS.append(spmd.run(body_leaves_a_thread, go=os.path.abspath("go")).values["pid"])

def test_next(spmd):
    assert spmd.run(body_next, go=os.path.abspath("go")).values["pid"] not in PIDS
""",
    )
    result = run(pytester, *CHILD_MODES[mode], timeout=90)
    result.assert_outcomes(passed=2)
    recs = records(pytester)
    assert recs["test_next"]["outcome"] == "passed"
    assert "left running" not in (recs["test_next"]["evidence"] or "")
    assert_nothing_left(pytester.path)


def test_pending_device_work_is_waited_for_before_the_verdict(pytester):
    """The child waits for torch_xla's device work before it answers (here a stand-in module whose
    wait fails like asynchronous XLA work), so a failure there is charged to the case that queued it."""
    write(
        pytester,
        """
import types

def body_queues_failing_work(ctx):
    def wait_device_ops(devices=()):
        print("F0101 00:00:00.000000 1 async.cc:1] Check failed: queued device work", file=sys.stderr, flush=True)
        os.abort()
    for name in ("torch_xla", "torch_xla.core", "torch_xla.core.xla_model"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torch_xla.core.xla_model"].wait_device_ops = wait_device_ops

def test_queues(spmd):
    spmd.run(body_queues_failing_work)

def test_after(spmd):
    healthy(spmd)
""",
    )
    result = run(pytester, timeout=90)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CaseCrashed: SIGABRT: F0101 *Check failed: queued device work"])
    assert_nothing_left(pytester.path)


def test_a_body_that_turns_the_collector_off_does_not_turn_it_off_for_the_next_case(pytester):
    write(
        pytester,
        """
def body_collector(ctx):
    import gc
    ctx.record("pid", os.getpid())
    ctx.record("collector", [gc.isenabled(), list(gc.get_threshold())])

def body_turns_it_off(ctx):
    import gc
    gc.disable()
    gc.set_threshold(1, 1, 1)

def test_collector(spmd):
    first = spmd.run(body_collector).values
    spmd.run(body_turns_it_off)
    after = spmd.run(body_collector).values
    assert after["pid"] != first["pid"], "a body's child runs no other body"
    assert after["collector"] == first["collector"] == [True, [700, 10, 10]]
""",
    )
    run(pytester).assert_outcomes(passed=1)
