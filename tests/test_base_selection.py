"""Which run --spmd-compare holds this one to (harness.judges.basecompare.find_run), through real
pytest runs on the fake backend (the fixtures of tests/test_basecompare.py): the base run is
chosen by what it is, never the PR's own earlier comparison run, and one version label on both
sides is a warning."""

from __future__ import annotations

import datetime
import json
import shutil
import sys

import pytest

from tests import test_basecompare
from tests.test_basecompare import BASE_BUILD, PR_BUILD, TILED, only_run, refused
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

suite = test_basecompare.suite  # the fixture: a case file run as the base build, then as the PR's


def test_a_comparison_run_in_the_same_folder_is_never_taken_for_the_base(suite, pytester):
    """One results folder for the base run and the PR's runs: rerunning the PR compares with the
    base build again, not with its own previous comparison run (which would agree with anything)."""
    suite(version=BASE_BUILD, results="shared")
    first = suite("--spmd-compare=shared", results="shared", costs=signature(all_gather=5))
    first.assert_outcomes(failed=1, passed=1, xfailed=1)
    again = suite("--spmd-compare=shared", results="shared", costs=signature(all_gather=5))
    again.assert_outcomes(failed=1, passed=1, xfailed=1)
    again.stdout.fnmatch_lines(["*compared with base run*(torch_xla 2.10.0+git1111111, 3 case records)*"])


def test_the_same_version_label_on_both_sides_is_a_warning_in_the_header_and_the_summary(suite, pytester):
    suite(version=PR_BUILD, results="base")
    result = suite("--spmd-compare=base", version=PR_BUILD)
    result.assert_outcomes(passed=2, xfailed=1)
    warning = "WARNING: the base run and this build are both torch_xla 2.10.0+git2222222*"
    result.stdout.fnmatch_lines(["*compared with base run*", warning, "*compared with the base run*", warning])
    assert pytester.run(sys.executable, "-m", "harness.report", "pr").ret == 0
    summary = (only_run(pytester.path / "pr") / "summary.md").read_text()
    assert "WARNING: the base run and this build are both torch\\_xla 2.10.0+git2222222" in summary


def test_an_older_run_of_this_device_count_is_chosen_over_a_newer_one_of_another(suite, pytester):
    suite(version=BASE_BUILD, results="base")
    matching = only_run(pytester.path / "base")
    suite("--spmd-devices=8", version=BASE_BUILD, results="base")  # newer, another device count
    result = suite("--spmd-compare=base", costs=signature(all_gather=5))
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    result.stdout.fnmatch_lines([f"*compared with base run {matching} (*"])


def test_no_fitting_base_run_is_refused_naming_each_candidate(suite, pytester):
    suite(version=BASE_BUILD, results="shared", shardings={"w": TILED})
    base = only_run(pytester.path / "shared")
    suite("--spmd-compare=shared", results="shared")
    compared = next(p for p in (pytester.path / "shared").glob("run-*") if p != base)
    shutil.rmtree(base)
    result = suite("--spmd-compare=shared", results="pr")
    refused(
        result,
        f"--spmd-compare={pytester.path / 'shared'} holds no finished run folder",
        f"{compared.name} is itself a comparison",
    )
    refused(suite(f"--spmd-compare={compared}"), f"base run {compared} is itself a comparison")


# --- which of several runs is the base: what the folders hold, never their names (#51 item 5) ----


def set_finish(run, **shift) -> None:
    """Move the run's manifest times by `shift` (datetime.timedelta's keywords), as a run made then."""
    manifest = json.loads((run / "run.json").read_text())
    for key in ("started", "finished"):
        when = datetime.datetime.fromisoformat(manifest[key]) + datetime.timedelta(**shift)
        manifest[key] = when.isoformat(timespec="seconds")
    (run / "run.json").write_text(json.dumps(manifest))


def test_the_run_that_finished_last_is_the_base_whatever_the_folders_are_named(suite, pytester):
    """A wrapper names its runs as it likes (--spmd-run-id): an older base run whose name sorts
    last is not taken over the newer one, and the header says which was taken, and why."""
    suite("--spmd-run-id=run-zzz-older", version="2.10.0+git0000000", results="base", shardings={"w": TILED})
    set_finish(pytester.path / "base" / "run-zzz-older", days=-1)
    suite("--spmd-run-id=run-aaa-newer", version=BASE_BUILD, results="base")
    result = suite("--spmd-compare=base")
    result.assert_outcomes(passed=2, xfailed=1)  # the newer base agrees with this build; the older one does not
    result.stdout.fnmatch_lines(
        [
            f"*compared with base run {pytester.path / 'base' / 'run-aaa-newer'} (torch_xla {BASE_BUILD}, *",
            "*chosen as the last to finish of 2 fitting run(s), by their manifests: run-aaa-newer (finished *"
            f"torch_xla {BASE_BUILD}); not run-zzz-older (finished *, torch_xla 2.10.0+git0000000). "
            "WARNING: the fitting runs hold 2 builds*",
        ]
    )


def test_a_planted_run_that_says_it_finished_in_the_future_is_not_the_base(suite, pytester):
    """A run folder planted to sort newest, and to finish last, holding the shardings of a build
    that would pass anything: refused by its finish time, named, and the real base run is taken."""
    suite(version=BASE_BUILD, results="base", shardings={"w": TILED})
    real = only_run(pytester.path / "base")
    planted = real.with_name("run-99999999-999999-p1")
    shutil.copytree(real, planted)
    verdicts = next(planted.glob("verdicts-*.jsonl"))
    verdicts.write_text(verdicts.read_text().replace('"w"', '"blocks.0:output"'))
    manifest = json.loads((planted / "run.json").read_text())
    manifest.update(run_id=planted.name, started="2999-01-01T00:00:00+00:00", finished="2999-01-01T00:00:01+00:00")
    (planted / "run.json").write_text(json.dumps(manifest))
    result = suite("--spmd-compare=base")
    result.assert_outcomes(failed=1, passed=1, xfailed=1)  # held to the real base, whose shardings differ
    result.stdout.fnmatch_lines(
        [
            f"*compared with base run {real} (*",
            "*chosen as the last to finish of 1 fitting*passed over: run-99999999-999999-p1 says it finished at 2999-*, in the future*",
        ]
    )
