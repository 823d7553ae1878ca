"""--spmd-compare (harness.judges.basecompare, harness.judges.basecheck) through real pytest runs.

Each test runs the same case file twice on the fake backend: first as the base build, then as
the PR's build with --spmd-compare pointing at the first run. What "torch_xla" does differently
on the PR side is what the environment tells the bodies (a unit that gathers more, an output
spec that moves); the fake child claims the version in HARNESS_FAKE_TORCH_XLA, so the builds
read `2.10.0+git...`, as pytorch/xla's PR builds do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.test_baseline import lit
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

BASE_BUILD = "2.10.0+git1111111"
PR_BUILD = "2.10.0+git2222222"
TILED = "{devices=[4,1]0,1,2,3}"

CASES = """
import json
import sys
import os
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_trains(ctx, shardings, signature):
    for name, spec in shardings.items():
        ctx.record_sharding(name, spec)
    ctx.record("harness:costs", {"train": signature})

def body_lists(ctx, fixed):
    if not fixed:
        raise TypeError("unhashable type: 'list'")

def test_block(spmd):
    spmd.run(
        body_trains,
        shardings=json.loads(os.environ["CASE_SHARDINGS"]),
        signature=json.loads(os.environ["CASE_SIGNATURE"]),
    )

def test_steady(spmd):
    spmd.run(body_trains, shardings={"w": "{replicated}"}, signature=json.loads(os.environ["STEADY_SIGNATURE"]))

@pytest.mark.known_bug("mark-sharding-list-spec")  # open: carried by every release
def test_list_spec(spmd):
    spmd.run(body_lists, fixed=os.environ.get("LIST_SPEC_FIXED") == "1")
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("STEADY_SIGNATURE", json.dumps(signature()))

    def run(
        *args: str,
        version: str = PR_BUILD,
        shardings: dict[str, str] | None = None,
        costs: dict | None = None,
        results: str = "pr",
        fixed: bool = False,
    ) -> pytest.RunResult:
        monkeypatch.setenv("CASE_SHARDINGS", json.dumps(shardings or {"blocks.0:output": TILED}))
        monkeypatch.setenv("CASE_SIGNATURE", json.dumps(costs or signature()))
        monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
        monkeypatch.setenv("LIST_SPEC_FIXED", "1" if fixed else "0")
        return pytester.runpytest_subprocess(
            "--spmd-backend=fake",
            "-p",
            "no:cacheprovider",
            f"--spmd-results-dir={results}",
            "--spmd-shardings-baseline=shardings.json",
            "--spmd-costs-baseline=costs.json",
            "-rA",
            *args,
            timeout=120,
        )

    return run


def only_run(folder: Path) -> Path:
    (run,) = list(folder.glob("run-*"))
    return run


# --------------------------------------------------------------------------------------------
# The same build agrees; a change inside torch_xla fails the PR with one line per item
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_two_runs_of_the_same_build_agree(suite, pytester, workers):
    suite(version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base", *workers, version=BASE_BUILD)
    result.assert_outcomes(passed=2, xfailed=1)  # the xfail is compared too: its bug reproduced on both sides
    # Under xdist the controller collects nothing: the header comes at the end, still before the
    # comparison's section (plugin.pytest_terminal_summary runs first).
    result.stdout.fnmatch_lines(
        [
            "*compared with base run*base*run-*(torch_xla 2.10.0+git1111111, 3 case records)*",
            "*compared with the base run*",
            "base torch_xla 2.10.0+git1111111 -> this build 2.10.0+git1111111; 3 case(s) compared, 0 differ",
        ]
    )
    comparison = json.loads((only_run(pytester.path / "pr") / "comparison.json").read_text())
    assert comparison["compared"] == 3 and comparison["differ"] == {} and comparison["registry"] == []


def test_a_unit_that_gathers_more_fails_against_its_base_naming_both_builds(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base", costs=signature(all_gather=5))
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    line = "base 2.10.0+git1111111 -> this build 2.10.0+git2222222: step0: all-gather 3 -> 5 (+64 KiB per device)"
    result.stdout.fnmatch_lines(
        [lit(line), "*judged against the base run*", "*differs: test_cases.py::test_block: " + lit(line)]
    )
    record = json.loads((only_run(pytester.path / "pr") / "verdicts-main.jsonl").read_text().splitlines()[0])
    assert record["outcome"] == "failed" and record["reason"] == line


def test_a_changed_output_spec_fails_against_its_base_under_xdist(suite):
    suite(version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base", "-n", "2", shardings={"blocks.0:output": "{devices=[1,4]0,1,2,3}"})
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*"
            + lit(
                "base 2.10.0+git1111111 -> this build 2.10.0+git2222222: "
                "blocks.0:output: {devices=[4,1]0,1,2,3} -> {devices=[1,4]0,1,2,3}"
            ),
            "*3 case(s) compared, 1 differ*",
        ]
    )


def test_off_the_baselines_release_line_a_cost_change_is_only_reported_but_fails_against_the_base(suite, pytester):
    """The issue: committed baselines taken on 2.9.0 only report a change on a 2.10.0+git build."""
    suite("--spmd-update-costs", version="2.9.0", results="taken")
    suite(version=BASE_BUILD, results="base").assert_outcomes(passed=2, xfailed=1)
    without = suite(costs=signature(all_gather=5))
    without.assert_outcomes(passed=2, xfailed=1)
    without.stdout.fnmatch_lines(["*cost changes (reported, not failed: torch_xla 2.10.0+git2222222 is not on*"])
    with_base = suite("--spmd-compare=base", costs=signature(all_gather=5))
    with_base.assert_outcomes(failed=1, passed=1, xfailed=1)
    with_base.stdout.fnmatch_lines(["*this build 2.10.0+git2222222: step0: all-gather 3 -> 5*"])
    # The committed baseline's "reported" section would show the same change against an older
    # reference: a case the base run fails shows the base run's lines alone (the record keeps both).
    assert "cost changes (reported, not failed" not in with_base.stdout.str()
    records = (pytester.path / "pr" / "latest" / "verdicts-main.jsonl").read_text().splitlines()
    (block,) = [r for r in map(json.loads, records) if r["nodeid"] == "test_cases.py::test_block"]
    assert block["cost_changes"] == ["step0: all-gather 3 -> 5 (+64 KiB per device)"]


def test_bytes_that_move_within_the_band_or_down_are_listed_and_growth_beyond_it_fails(suite, pytester):
    """Seen from torch_xla 2.8.1 to 2.9.0: a peak +16 B on 177.3 KiB; from 2.6.1: temp down 113.8 -> 95.1 KiB."""
    suite(version=BASE_BUILD, results="base", costs=signature(temp=181555))
    nearly = signature(temp=181555)
    nearly["graphs"]["step0"]["memory"]["peak"] += 16
    result = suite("--spmd-compare=base", costs=nearly)
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 case(s) compared, 0 differ",
            "bytes moved (listed, not failed: +5% and +1 KiB band): test_cases.py::test_block: "
            + lit("step0: peak 185.3 KiB -> 185.3 KiB (+16 B) per device [within the band, listed]"),
        ]
    )
    assert json.loads((only_run(pytester.path / "pr") / "comparison.json").read_text())["moved"] == {
        "test_cases.py::test_block": ["step0: peak 185.3 KiB -> 185.3 KiB (+16 B) per device [within the band, listed]"]
    }
    down = suite("--spmd-compare=base", costs=signature(temp=97382), results="pr-down")
    down.assert_outcomes(passed=2, xfailed=1)
    down.stdout.fnmatch_lines(
        ["bytes moved *: test_cases.py::test_block: step0: temp 177.3 KiB -> 95.1 KiB * [[]improvement, listed[]]"]
    )
    grown = suite("--spmd-compare=base", costs=signature(temp=2 * 181555), results="pr-grown")
    grown.assert_outcomes(failed=1, passed=1, xfailed=1)
    grown.stdout.fnmatch_lines(["*this build 2.10.0+git2222222: step0: temp 177.3 KiB -> 354.6 KiB per device, peak *"])


def test_what_the_base_lacks_is_listed_not_failed(suite):
    suite("-k", "block or list_spec", version=BASE_BUILD, results="base", shardings={"w": TILED})
    result = suite("--spmd-compare=base", "-k", "block or steady", shardings={"w": TILED, "blocks.0:output": TILED})
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*new in this build (listed, not failed): test_cases.py::test_block: "
            + lit("blocks.0:output: new, {devices=[4,1]0,1,2,3} (not in the base run)"),
            "not compared: test_cases.py::test_steady: the base run has no record of it",
        ]
    )


def test_a_known_bug_this_build_fixes_is_named(suite):
    suite(version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base", fixed=True)
    # The registry still says every release carries it: its own rule fails the case (update carried_by).
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*fixed by this build: mark-sharding-list-spec (test_cases.py::test_list_spec: "
            "base reproduced -> this build unexpected-pass)*"
        ]
    )


def test_a_known_bug_this_build_brings_back_is_named(suite, pytester):
    """The other direction: the base passed the case, this build shows the bug's signature again."""
    suite(version=BASE_BUILD, results="base", fixed=True)
    result = suite("--spmd-compare=base", fixed=False)
    result.assert_outcomes(passed=2, xfailed=1)
    line = (
        "newly failing in this build: mark-sharding-list-spec (test_cases.py::test_list_spec: "
        "base unexpected-pass -> this build reproduced)"
    )
    result.stdout.fnmatch_lines(["*" + lit(line) + "*"])
    comparison = json.loads((only_run(pytester.path / "pr") / "comparison.json").read_text())
    assert comparison["registry"] == [line]


def test_a_case_the_base_failed_is_not_compared_and_says_why(suite, pytester):
    suite(version=BASE_BUILD, results="base", costs={"steps": "three"})  # the base's child sent a bad signature
    result = suite("--spmd-compare=base")
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*not compared: test_cases.py::test_block: the base run's record says failed: *steps is the string 'three'*"]
    )


# --------------------------------------------------------------------------------------------
# A base that cannot judge: refused before any case runs (exit 4), never a pass, never a crash
# --------------------------------------------------------------------------------------------


def refused(result: pytest.RunResult, *texts: str) -> None:
    """Exit 4 before any case ran, with an error holding each of `texts`."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "collected" not in result.stdout.str()  # refused at configure time: nothing was even collected
    error = result.stderr.str()
    for text in texts:
        assert text in error, error


def test_another_device_count_is_refused_naming_both(suite):
    suite("--spmd-devices=8", version=BASE_BUILD, results="base")
    refused(
        suite("--spmd-compare=base"),
        "was taken on backend fake with 8 devices",
    )


def test_a_folder_without_records_is_refused(suite, pytester):
    (pytester.path / "empty").mkdir()
    refused(suite("--spmd-compare=empty"), "empty holds no finished run folder (run-*/run.json)")
    refused(suite("--spmd-compare=absent"), "absent: no such folder")
    suite(version=BASE_BUILD, results="base")
    run = only_run(pytester.path / "base")
    (run / "verdicts-main.jsonl").unlink()  # a finished run whose records are gone
    refused(suite("--spmd-compare=base"), f"base run {run} holds no case records (verdicts-*.jsonl)")


def test_a_run_that_never_finished_is_not_taken_for_the_newest(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    finished = only_run(pytester.path / "base")
    killed = pytester.path / "base" / "run-29991231-235959-p1"  # newest by name, never closed
    killed.mkdir()
    manifest = json.loads((finished / "run.json").read_text())
    (killed / "run.json").write_text(json.dumps({**manifest, "run_id": killed.name, "status": "running"}))
    (pytester.path / "base" / "latest").unlink()
    (pytester.path / "base" / "latest").symlink_to(killed.name)
    result = suite("--spmd-compare=base", costs=signature(all_gather=5))
    result.assert_outcomes(failed=1, passed=1, xfailed=1)  # judged against the finished run
    refused(suite(f"--spmd-compare={killed}"), f"base run {killed} did not finish")


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda r: "{not json\n", "verdicts-main.jsonl:1: not JSON"),
        (lambda r: json.dumps({**r, "shardings": ["w"]}) + "\n", "shardings is a list, not a mapping"),
        (lambda r: json.dumps({**r, "outcome": "green"}) + "\n", "outcome 'green' is not one of"),
        (
            lambda r: json.dumps({**r, "torch_xla": "2.10\x1b[2J"}) + "\n",
            "torch_xla '2.10\\x1b[2J' is not a PEP 440 version",
        ),
        (lambda r: json.dumps({**r, "devices": 8}) + "\n", "backend fake with 4 devices; backend fake with 8 devices"),
        (lambda r: json.dumps({**r, "torch_xla": "2.9.0"}) + "\n", "mixes torch_xla builds (2.10.0+git1111111, 2.9.0)"),
    ],
    ids=["cut", "wrong-type", "unknown-outcome", "escape-codes", "mixed-devices", "mixed-builds"],
)
def test_a_damaged_or_forged_base_record_is_refused(suite, pytester, edit, named):
    suite(version=BASE_BUILD, results="base")
    verdicts = only_run(pytester.path / "base") / "verdicts-main.jsonl"
    lines = verdicts.read_text().splitlines(keepends=True)
    lines[0] = edit(json.loads(lines[0]))
    verdicts.write_text("".join(lines))
    refused(suite("--spmd-compare=base"), named)


def test_a_record_that_contradicts_its_manifest_is_refused(suite, pytester):
    """A base where a case failed, edited to say it passed (and so would vouch for anything)."""
    suite(version=BASE_BUILD, results="base", costs=signature(all_gather=5), shardings={"w": "{replicated}"})
    run = only_run(pytester.path / "base")
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**manifest, "failed_ids": ["test_cases.py::test_block"]}))
    refused(
        suite("--spmd-compare=base"), "pytest reported 'test_cases.py::test_block' failed, but its record says passed"
    )


def test_the_ini_key_is_read(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    pytester.makeini("[pytest]\nspmd_compare = base\n")
    suite(costs=signature(all_gather=5)).assert_outcomes(failed=1, passed=1, xfailed=1)


def test_the_report_shows_the_comparison_and_refuses_a_damaged_one(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    suite("--spmd-compare=base", costs=signature(all_gather=5), fixed=True).assert_outcomes(failed=2, passed=1)
    report = pytester.run(sys.executable, "-m", "harness.report", "pr")
    summary = (only_run(pytester.path / "pr") / "summary.md").read_text()
    assert report.ret == 1, report.stdout.str() + report.stderr.str()  # the run it reports failed
    assert "### ❌ Compared with the base build" in summary
    assert "this build 2.10.0+git2222222: step0: all-gather 3 -&gt; 5 (+64 KiB per device)" in summary  # HTML-escaped
    assert "fixed by this build: mark-sharding-list-spec" in summary
    (only_run(pytester.path / "pr") / "comparison.json").write_text('{"schema": 1, "compared": "all"}')
    damaged = pytester.run(sys.executable, "-m", "harness.report", "pr")
    assert damaged.ret == 1
    assert "comparison.json is unreadable" in (only_run(pytester.path / "pr") / "summary.md").read_text()


@pytest.mark.parametrize("plant", ["link", "fifo", "huge"])
def test_a_base_records_file_that_is_a_link_a_pipe_or_huge_is_refused_before_it_is_read(suite, pytester, plant):
    """A hand-edited base run: its records file replaced by a link (to another run's records), a
    named pipe (reading it would wait forever) or a file too large to be a suite's records (reading
    it would fill the memory) is refused by name, as a usage error, without reading it."""
    import os

    suite(version=BASE_BUILD, results="base")
    verdicts = only_run(pytester.path / "base") / "verdicts-main.jsonl"
    if plant == "link":
        elsewhere = pytester.path / "elsewhere.jsonl"
        verdicts.rename(elsewhere)
        verdicts.symlink_to(elsewhere)
        named = "cannot be read (not a regular file (a link, not followed"
    elif plant == "fifo":
        verdicts.unlink()
        os.mkfifo(verdicts)
        named = "cannot be read (not a regular file (a named pipe"
    else:
        with verdicts.open("a") as fh:
            fh.truncate(257 << 20)  # sparse: costs no disk
        named = "cannot be read (257 MiB, more than any file the harness writes (256 MiB); not read)"
    refused(suite("--spmd-compare=base"), f"{verdicts}: {named}")


def test_many_bytes_moved_within_the_band_are_counted_so_the_differences_stay_in_view():
    """A regression's run against its base moves many bytes a little (47 lines in a run whose step
    graph split): past MAX_NEW_LISTED they are one line, and the comparison file keeps them all."""
    from harness.judges.basecompare import MAX_NEW_LISTED, Comparison

    moved = {f"cases/test_x.py::test_{n}": ["step0: peak 1 KiB -> 1 KiB (+16 B) per device"] for n in range(12)}
    comparison = Comparison(base="base", base_torch_xla="2.9.0", this_torch_xla=["2.9.0"], bytes_listed=moved)
    listed = [line for line in comparison.lines() if line.startswith("bytes moved")]
    assert listed == [
        "bytes moved (listed, not failed: +5% and +1 KiB band): 12 item(s) in 12 case(s), all in comparison.json"
    ]
    assert json.loads(comparison.to_json())["moved"] == moved
    few = dict(list(moved.items())[:MAX_NEW_LISTED])
    listed = Comparison(base="base", base_torch_xla="2.9.0", bytes_listed=few).lines()
    assert sum(line.startswith("bytes moved") for line in listed) == MAX_NEW_LISTED
