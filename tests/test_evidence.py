"""Crash evidence leads with the cause: saved real child logs and verdicts, and synthetic floods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.isolation.parent.case import failure_from_answer
from harness.isolation.parent.evidence import (
    crash_evidence,
    first_fatal_line,
    fold_prefix_runs,
    fold_thread_dumps,
    headline,
    log_tail,
)
from harness.isolation.system.logtail import tail_file, tail_text
from harness.isolation.system.processes import describe_exit, signal_name
from harness.isolation.wire.protocol import ChildAnswer
from harness.registry import JudgementKind, get_entry, judge

pytestmark = pytest.mark.selftest

DATA = Path(__file__).parent / "data" / "child-logs"
# torch_xla 2.5.1, FSDPv2 auto-wrapped ViT step with functionalization off: a real SIGABRT.
SIGABRT_LOG = DATA / "sigabrt-torch_xla-2.5.1-fsdpv2-vit-func-off.log"
# torch_xla 2.9.0, torch.mm on a distribute_tensor weight with functionalization on: a real exception.
EXCEPTION_VERDICT = DATA / "exception-torch_xla-2.9.0-dtensor-mm-func-on.json"
HAS_SHARDING = "F external/xla/xla/hlo/ir/hlo_instruction.h:1901] Check failed: has_sharding()"


def test_a_real_sigabrt_log_gives_the_signal_and_the_check_line_first():
    evidence, tail = crash_evidence("SIGABRT", SIGABRT_LOG)
    first = headline(evidence)
    assert first.startswith("SIGABRT: ") and first.endswith(HAS_SHARDING), first
    assert "Extension modules: numpy" not in evidence, "faulthandler's module list crowds the tail"
    assert "in sync" in tail, "the current thread's innermost frames are kept"
    judgement = judge(get_entry("fsdpv2-vit-step-has-sharding"), "2.5.1", evidence)
    assert judgement.kind is JudgementKind.REPRODUCED
    assert "on torch_xla 2.5.1: SIGABRT: " in judgement.message and HAS_SHARDING in judgement.message


def test_the_cause_survives_a_flood_of_thread_dumps_and_output(tmp_path):
    log = tmp_path / "child.log"
    dump = "".join(
        f'Thread 0x{i:016x} (most recent call first):\n  File "/x/subproc_pool.py", line 47 in _recv_msg\n\n'
        for i in range(500)
    )
    log.write_text(SIGABRT_LOG.read_text() + "y" * 2_000_000 + "\n" + dump + "Extension modules: numpy (total: 1)\n")
    evidence, tail = crash_evidence("SIGABRT", log)
    assert headline(evidence).endswith(HAS_SHARDING)
    assert len(evidence.encode()) < 10_000
    assert "_recv_msg" not in tail and "stack of thread" in tail


def test_a_real_exception_verdict_gives_its_exception_line_as_evidence():
    saved = json.loads(EXCEPTION_VERDICT.read_text())
    answer = ChildAnswer(id=1, case="c", outcome="error", exception=saved["exception"], observations={}, duration_s=0.1)
    failure = failure_from_answer("c", answer, "log tail")
    assert failure.evidence.startswith("RuntimeError: !at::functionalization::impl::isFunctionalTensor(t)")
    assert str(failure).splitlines()[0] == failure.evidence  # the failure's first line is the cause
    judgement = judge(get_entry("dtensor-distribute-tensor-matmul"), saved["torch_xla"], failure.evidence)
    assert judgement.kind is JudgementKind.REPRODUCED


@pytest.mark.parametrize(
    "lines, expected",
    [
        # A glog FATAL beats an earlier glog ERROR.
        pytest.param(
            ["E0101 00:00:00.0 1 a.cc:1] noise", "F0101 00:00:00.0 1 b.cc:2] Check failed: x"],
            "F0101 00:00:00.0 1 b.cc:2] Check failed: x",
            id="fatal-over-error",
        ),
        # XLA's RET_CHECK raised inside an exception message printed to the log.
        pytest.param(
            ["RuntimeError: Bad StatusOr access: INTERNAL: RET_CHECK failure (x.cc:1) has_sharding()"],
            "RuntimeError: Bad StatusOr access: INTERNAL: RET_CHECK failure (x.cc:1) has_sharding()",
            id="ret-check",
        ),
        # Only faulthandler's own header: that is the best there is.
        pytest.param(
            ["some output", "Fatal Python error: Segmentation fault"],
            "Fatal Python error: Segmentation fault",
            id="python-fatal",
        ),
        pytest.param(
            ["E0101 00:00:00.0 1 a.cc:1] only an error"], "E0101 00:00:00.0 1 a.cc:1] only an error", id="error-only"
        ),
        pytest.param(["nothing", "fatal here"], None, id="none"),
    ],
)
def test_first_fatal_line_ranks_the_causes(lines, expected):
    assert first_fatal_line(lines) == expected


def test_tails_are_bounded_in_bytes_at_line_boundaries_with_a_marker():
    text = "\n".join(f"line {i} " + "x" * 100 for i in range(1000))
    tail = tail_text(text, lines=40, max_bytes=1000)
    assert len(tail.encode()) <= 1100
    assert tail.splitlines()[0].startswith("[... ") and "bytes of the log cut" in tail.splitlines()[0]
    assert tail.splitlines()[-1].startswith("line 999 ")
    assert all(line.startswith(("line ", "[... ")) for line in tail.splitlines()), "a line was cut in the middle"


def test_one_huge_line_keeps_its_end():
    tail = tail_text("a" * 5_000_000 + "THE END", max_bytes=1000)
    assert len(tail) < 1200 and tail.endswith("THE END") and "characters of this line cut" in tail


def test_log_tail_reads_only_the_end_of_a_big_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("z" * 20_000_000 + "\nthe last line\n")
    assert log_tail(log).endswith("the last line")


def test_a_tail_starts_at_since_and_folds_only_when_asked(tmp_path):
    log = tmp_path / "child.log"
    dump = 'Thread 0x01 (most recent call first):\n  File "a.py", line 1 in idle\n'
    log.write_text("the previous case\n" + dump + "this case's last line\n")
    since = len("the previous case\n")
    assert tail_file(log, since) == dump + "this case's last line"
    assert log_tail(log, since) == "[faulthandler: stack of thread 0x01 (1 frames) folded]\nthis case's last line"
    assert tail_file(tmp_path / "missing.log") == f"(no log at {tmp_path / 'missing.log'}: No such file or directory)"


def test_folding_keeps_the_current_thread_top_frames():
    dump = (
        'Thread 0x01 (most recent call first):\n  File "a.py", line 1 in idle\n\n'
        "Current thread 0x02 (most recent call first):\n"
        + "".join(f'  File "b.py", line {i} in f{i}\n' for i in range(10))
    )
    folded = fold_thread_dumps(dump)
    assert "idle" not in folded and "f0" in folded and "f5" in folded and "f9" not in folded
    assert "4 outer frames folded" in folded


@pytest.mark.parametrize(
    "returncode, words",
    [
        (-6, "SIGABRT"),
        (-11, "SIGSEGV"),
        (7, "exit code 7"),
        (134, "exit code 134 (SIGABRT)"),
        (None, "still running"),
    ],
)
def test_exits_are_described(returncode, words):
    assert describe_exit(returncode) == words


def test_an_unknown_signal_number_is_named_without_raising():
    assert signal_name(250) == "signal 250"
    assert describe_exit(-250) == "signal 250"


ANALYSIS = [f"Unexpected Execution Analysis:   frame {i} (/site-packages/torch/x.py:{i})" for i in range(17)]


def test_a_long_run_of_one_prefix_keeps_its_first_lines_and_says_how_many_more():
    text = "\n".join(["[harness] case x starts", *ANALYSIS, "RuntimeError: after it"])
    folded = fold_prefix_runs(text).splitlines()
    assert folded[0] == "[harness] case x starts" and folded[-1] == "RuntimeError: after it"
    assert folded[1:7] == ANALYSIS[:6]
    assert (
        folded[7]
        == "Unexpected Execution Analysis: ... 11 more line(s) like these (the run folder's logs/ has them all)"
    )
    assert len(folded) == 9


@pytest.mark.parametrize(
    "lines",
    [
        ANALYSIS[:10],  # not longer than 10: whole
        [f"E: short prefix {i}" for i in range(20)],  # a prefix under 12 characters is no block's
        [f"line {i} with no colon at all" for i in range(20)],
        [f"{'Analysis A' if i % 2 else 'Analysis Block'}: {i}" for i in range(20)],  # prefixes alternate
    ],
    ids=["ten", "short-prefix", "no-colon", "alternating"],
)
def test_other_text_is_left_as_it_is(lines):
    text = "\n".join(lines)
    assert fold_prefix_runs(text) == text


def test_a_raised_failure_shows_the_folded_log_and_keeps_its_evidence():
    saved = json.loads(EXCEPTION_VERDICT.read_text())
    answer = ChildAnswer(id=1, case="c", outcome="error", exception=saved["exception"], observations={}, duration_s=0.1)
    tail = "\n".join(ANALYSIS)
    failure = failure_from_answer("c::case", answer, tail)
    assert "... 11 more line(s) like these" in str(failure)
    assert failure.log_tail == tail and failure.evidence.startswith("RuntimeError: !at::functionalization")
