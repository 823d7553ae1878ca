"""harness.metering.nativestacks' own parts: which frames a stack shows, the line's escaping, the reasons
given where memray cannot name a stack. The meter's use of it: tests/test_memory.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from harness.metering import nativestacks

pytestmark = pytest.mark.selftest

NUMPY_STACK = [
    ("malloc", "<unknown>", 0),
    ("default_malloc", "<unknown>", 0),
    ("PyDataMem_UserNEW", "<unknown>", 0),
    ("PyArray_NewFromDescr_int", "<unknown>", 0),
    ("PyArray_Empty_int", "<unknown>", 0),
    ("cfunction_vectorcall_FASTCALL_KEYWORDS", "Objects/methodobject.c", 443),
    ("full", "/venv/lib/python3.11/site-packages/numpy/_core/numeric.py", 385),
    ("body_loop", "/tmp/case/test_loop.py", 75),
    ("run_request", "/repo/harness/isolation/child/main.py", 370),
]


def test_a_stack_shows_three_native_frames_the_package_line_and_the_loops_line():
    assert nativestacks._frames(NUMPY_STACK) == [
        "default_malloc",
        "PyDataMem_UserNEW",
        "PyArray_NewFromDescr_int",
        "...",
        "full (numeric.py:385)",
        "body_loop (test_loop.py:75)",
    ]


def test_cpp_names_lose_arguments_and_templates_and_keep_two_scopes():
    name = "torch_xla::runtime::PjRtComputationClient::ExecuteReplicated(std::vector<std::shared_ptr<int>> const&)"
    assert nativestacks._compact(name) == "PjRtComputationClient::ExecuteReplicated"


def test_an_allocation_the_meter_made_is_not_the_loops():
    meter = [("malloc", "", 0), ("_record_alive", "/repo/harness/stepcosts.py", 190), ("body_loop", "t.py", 3)]
    assert nativestacks._frames(meter) == []


def test_the_line_escapes_what_memray_read_and_says_what_share_it_names():
    found = {
        "bytes": 4096,
        "blocks": 2,
        "stacks": [{"bytes": 2048, "blocks": 1, "frames": ["evil\x1b[2J", "f (t.py:1)"]}],
    }
    line = nativestacks._line(3, found, "the step grew native heap (malloc in use) +4 KiB")
    assert "\x1b" not in line and "evil\\x1b[2J" in line
    assert line == (
        "native allocations of step3 alive at its end (memray): 2 KiB in 1 block at evil\\x1b[2J < f (t.py:1) "
        "(these 2 KiB of the 4 KiB memray saw step3 keep; the step grew native heap (malloc in use) +4 KiB)"
    )


def test_the_line_leads_with_the_share_of_the_steps_growth_memray_saw():
    found = {
        "bytes": 36 << 10,
        "blocks": 2,
        "stacks": [{"bytes": 36 << 10, "blocks": 2, "frames": ["forward (models.py:55)"]}],
    }
    line = nativestacks._line(3, found, "the step grew native heap (malloc in use) +257 KiB", 257 << 10)
    assert line.startswith(
        "memray saw 14% of this growth: the rest is allocated where it does not track; native allocations of step3"
    ), line
    assert nativestacks._line(3, found, "", 37 << 10).startswith("memray saw 97% of this growth: native allocations")
    assert nativestacks._line(3, found, "the step grew less").startswith("native allocations")  # no growth: no share


@pytest.mark.parametrize(
    "found",
    [[], {"bytes": -1, "blocks": 0, "stacks": []}, {"bytes": 1, "blocks": 1, "stacks": [{"bytes": 1, "blocks": 1}]}],
)
def test_a_reading_of_another_form_is_refused(found):
    assert not nativestacks._well_formed(found)


def test_without_memray_the_reason_is_given_and_nothing_is_written(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "memray", None)  # import memray raises ImportError
    monkeypatch.setenv(nativestacks.XLA_DUMP_ROOT_ENV, str(tmp_path))
    trace = nativestacks.StepTrace(3)
    assert trace.start() == "memray is not installed here (pip install memray)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("memray") is None, reason="memray is not installed here")
def test_a_second_tracker_cannot_start_and_says_why_and_the_capture_folder_goes(monkeypatch, tmp_path):
    import memray

    monkeypatch.setenv(nativestacks.XLA_DUMP_ROOT_ENV, str(tmp_path))
    # another loop's trace holds memray's one tracker: said so (the parent accepts it)
    first, second, window = nativestacks.StepTrace(3), nativestacks.StepTrace(4), nativestacks.WindowTrace(12)
    assert first.start() is None
    try:
        assert second.start() == window.start() == nativestacks.ANOTHER_LOOP
    finally:
        first.close_after_error()
    assert list(tmp_path.iterdir()) == []
    # a tracker the body started itself: memray's own refusal, which the parent does not accept
    with memray.Tracker(tmp_path / "own.memray"):
        why = nativestacks.StepTrace(5).start()
    assert why is not None and why.startswith("memray could not track (RuntimeError: "), why
    assert [path.name for path in tmp_path.iterdir()] == ["own.memray"]


@pytest.mark.skipif(importlib.util.find_spec("memray") is None, reason="memray is not installed here")
def test_a_raw_mmap_is_summed_apart_and_neither_names_nor_covers_the_heaps_growth(tmp_path):
    # CI once read "memray saw 100%" of a ctypes malloc leak memray cannot see: a 1 MiB pymalloc
    # arena, mapped during the tracked step, was counted against malloc's heap (which it is not in).
    import mmap

    import memray

    capture = tmp_path / "step.memray"
    kept = []
    with memray.Tracker(capture, native_traces=True, file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS):
        kept.append(mmap.mmap(-1, 1 << 20))
        kept.append(bytearray(200 << 10))
    found = nativestacks.summarize(str(capture))
    assert found["mapped"] == 1 << 20
    assert (200 << 10) <= found["bytes"] < (1 << 20), found["bytes"]
    assert nativestacks._well_formed(found)
    line = nativestacks._line(3, found, "the step grew native heap (malloc in use) +2 MiB", 2 << 20)
    assert line.startswith("memray saw 1") and "the rest is allocated where it does not track" in line, line
    assert line.endswith("+2 MiB; and 1 MiB mapped outside malloc's heap)"), line


def test_the_records_reader_allows_as_many_tracked_steps_as_the_meter_tracks():
    from harness.costs import signature

    assert signature.MAX_MEMRAY_STEPS == 1 + nativestacks.WINDOW_STEPS
