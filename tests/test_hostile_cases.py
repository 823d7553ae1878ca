"""Cases that attack the harness's own records, as a hostile pull request would (fake backend,
black-box runs): a case body runs as the same user as pytest, so it can write anything in the
results folder. Whatever it writes, a case that failed is never reported green, a bad value is
that case's failure (never the session's end), and the run goes on.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import report
from harness.errors import HarnessUsageError
from harness.records import runfolder
from tests.conftest import REPO, only_run_folder, run_fake, spmd_report

pytestmark = pytest.mark.selftest


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return run_fake(pytester, "-rA", *args)


# --- a reserved key recorded with the wrong type (#28 item 5) ------------------------------------

RESERVED_KEYS = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_dumps(ctx):
    ctx.record("harness:cost-dumps", 5)

def body_costs(ctx):
    ctx.record("harness:costs", [1])

def body_sharding_not_text(ctx):
    ctx.shardings["w"] = 3  # past record_sharding's check, straight into the verdict

def body_ok(ctx):
    ctx.record("fine", 1)

def test_a_dumps(spmd):
    spmd.run(body_dumps)

def test_b_costs(spmd):
    spmd.run(body_costs)

def test_c_sharding(spmd):
    spmd.run(body_sharding_not_text)

def test_d_later(spmd):
    spmd.run(body_ok)
"""


def test_a_reserved_key_of_the_wrong_type_fails_its_case_naming_the_key_and_later_cases_run(pytester):
    pytester.makepyfile(test_reserved=RESERVED_KEYS)
    result = run(pytester)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(failed=3, passed=1)
    result.stdout.fnmatch_lines(
        [
            "E * protocol failure: the child sent verdict 1, but its 'harness:cost-dumps' record is not as the "
            "harness writes it: the number 5, not a mapping of module names to HLO text (keys that start with "
            "'harness:' are the harness's own*",
            "E * its 'harness:costs' record is not as the harness writes it: a list, not a mapping of training-loop labels*",
            "E * protocol failure: the child sent verdict 1, but its sharding specs hold 'w' as the number 3, not text",
        ],
        consecutive=False,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


# --- a case that deletes or rewrites its run's manifest (#28 item 7) ------------------------------

TAMPERS = """
import json, os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def run_folder():
    (folder,) = (p for p in pathlib.Path("results").glob("run-*") if not p.is_symlink())
    return folder

def body_deletes(ctx, manifest):
    os.unlink(manifest)

def body_rewrites(ctx, manifest):
    data = json.loads(pathlib.Path(manifest).read_text())
    data.update(status="finished", exitstatus=0, counts={"passed": 9})
    pathlib.Path(manifest).write_text(json.dumps(data))

def body_ok(ctx):
    pass

def test_a_tampers(spmd):
    body = body_deletes if os.environ["TAMPER"] == "delete" else body_rewrites
    spmd.run(body, manifest=str((run_folder() / "run.json").absolute()))

def test_b_later(spmd):
    spmd.run(body_ok)
"""


@pytest.mark.parametrize("tamper, what", [("delete", "deleted"), ("rewrite", "changed")])
def test_a_case_that_deletes_or_rewrites_the_manifest_does_not_stop_the_run_and_fails_it(
    pytester, monkeypatch, tamper, what
):
    pytester.makepyfile(test_tampers=TAMPERS)
    monkeypatch.setenv("TAMPER", tamper)
    result = run(pytester)
    result.assert_outcomes(passed=2)  # the later case ran
    assert result.ret == pytest.ExitCode.TESTS_FAILED, "a run whose records were tampered with passed"
    result.stdout.fnmatch_lines([f"*spmd harness: run.json of run-* was {what} while the run's cases ran*"])
    folder = only_run_folder(pytester)
    manifest = runfolder.read_manifest(folder)
    assert manifest.exitstatus == 1 and manifest.counts.get("passed") == 2
    assert manifest.problems and what in manifest.problems[0]
    proc = spmd_report(str(folder), "--pytest-exit-status", "1")
    assert proc.returncode == report.EXIT_RUN_PROBLEM, proc.stdout + proc.stderr
    assert f"RUN PROBLEM: run {folder.name}: run.json of {folder.name} was {what}" in proc.stdout


def test_a_run_folder_without_its_manifest_is_a_failed_report_not_another_run(tmp_path: Path):
    """The manifest gone after the run: the report of that run fails; it never shows an older run."""
    for name, exitstatus in (("run-20000101-000000-p1", 0), ("run-20990101-000000-p2", 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "verdicts-main.jsonl").write_text(
            '{"nodeid": "t.py::t", "family": "t", "outcome": "passed"}\n'
        )
        manifest = {"run_id": name, "pid": 1, "host": "h", "started": "2000-01-01T00:00:00+00:00", "argv": []}
        manifest.update(status="finished", exitstatus=exitstatus, counts={}, failed_ids=[])
        (tmp_path / name / "run.json").write_text(json.dumps(manifest))
    (tmp_path / "latest").symlink_to("run-20990101-000000-p2")
    os.unlink(tmp_path / "run-20990101-000000-p2" / "run.json")
    for target in (tmp_path, tmp_path / "run-20990101-000000-p2"):
        results = report.load_results(target)
        assert results.problems and "has no run.json" in results.problems[0], results.problems
        assert report.main([str(target)]) == report.EXIT_RUN_PROBLEM


# --- a case that points `latest` at a green run it made, under the CI script (#28 item 7) ---------

FORGES_LATEST = """
import json, os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def test_a_forges_a_green_latest(spmd):
    spmd.run(body_ok)
    results = pathlib.Path(os.environ["FORGE_RESULTS"])
    fake = results / "run-29990101-000000-p1"
    fake.mkdir()
    record = {"nodeid": "test_forger.py::test_all_good", "family": "forger", "outcome": "passed"}
    (fake / "verdicts-main.jsonl").write_text(json.dumps(record) + "\\n")
    manifest = {"run_id": fake.name, "pid": 1, "host": "h", "started": "2999-01-01T00:00:00+00:00", "argv": [],
                "status": "finished", "exitstatus": 0, "counts": {"passed": 1}, "failed_ids": []}
    (fake / "run.json").write_text(json.dumps(manifest))
    (results / ".forged").symlink_to(fake.name)
    os.replace(results / ".forged", results / "latest")

def test_b_really_fails(spmd):
    spmd.run(body_ok)
    assert False, "the real failure"
"""

# Stands in for the venv's pytest: runs the real one (the plugin included) on the hostile file with
# the fake backend, with every other argument as the CI script gave it.
REAL_PYTEST_ON = """#!{python}
import os, sys
args = [os.environ["STUB_CASES"] if a == "cases" else a for a in sys.argv[1:]]
args = ["--spmd-backend=fake" if a == "--spmd-backend=cpu" else a for a in args]
os.chdir(os.path.dirname(os.environ["STUB_CASES"]))
os.execv(sys.executable, [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args])
"""


def test_a_case_pointing_latest_at_a_green_run_cannot_make_the_ci_report_green(pytester, tmp_path: Path):
    cases = pytester.makepyfile(test_forger=FORGES_LATEST)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, text in (
        ("pytest", REAL_PYTEST_ON.format(python=sys.executable)),
        ("python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'),
    ):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    results, outputs = tmp_path / "results", tmp_path / "github-output"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "SPMD_", "STUB_", "PYTEST_"))}
    env.update(
        GITHUB_ACTIONS="true",
        GITHUB_OUTPUT=str(outputs),
        GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"),
        STUB_CASES=str(cases),
        FORGE_RESULTS=str(results),
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "ci-spmd.sh"), "--venv", str(venv), "--skip-install"]
        + ["--workers", "1", "--results-dir", str(results)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 1, shown
    assert (results / "latest").resolve().name == "run-29990101-000000-p1", "the forgery did not happen"
    counts = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert counts["failed"] == "1", outputs.read_text()
    assert "1 passed, 0 failed" not in shown
    assert "::error title=SPMD regression%3A test_forger.py%3A%3Atest_b_really_fails::" in proc.stdout, shown


# --- a run-* link planted in the results folder (#28 item 11) -------------------------------------


def test_a_planted_run_folder_link_is_refused_and_not_written_through(tmp_path: Path):
    results, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    results.mkdir()
    elsewhere.mkdir()
    run = runfolder.RunFolder.new(results)
    (results / run.run_id).symlink_to(elsewhere)
    with pytest.raises(HarnessUsageError, match="already exists and is not this run's folder"):
        run.claim()
    assert list(elsewhere.iterdir()) == [], "the harness wrote through a planted link"
    assert not (results / "latest").exists()


def test_a_planted_manifest_link_is_not_written_through(tmp_path: Path):
    """A case replaces run.json by a link to a file of the user's: closing the run replaces the link."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    run = runfolder.RunFolder.new(tmp_path / "results")
    run.claim()
    os.unlink(run.manifest_path)
    run.manifest_path.symlink_to(victim)
    temp = run.path / f".run.json.{os.getpid()}.tmp"
    temp.symlink_to(victim)  # and the name the harness writes its temporary file under
    problems = run.manifest_problems()
    run.finish(0, {"passed": 1}, [], None, problems)
    assert victim.read_text() == "the user's file"
    assert stat.S_ISREG(os.lstat(run.manifest_path).st_mode)
    assert runfolder.read_manifest(run.path).problems == problems and "changed" in problems[0]


def test_a_run_id_is_a_plain_folder_name(tmp_path: Path):
    for bad in ("../run-x", "run-a/b", "latest", "run-", "run-..", "run-x\n"):
        with pytest.raises(HarnessUsageError, match="is not a run id"):
            runfolder.RunFolder.new(tmp_path, bad)
    assert runfolder.RunFolder.new(tmp_path, "run-20261124-ci42").path == tmp_path.absolute() / "run-20261124-ci42"


def test_the_report_replaces_a_planted_summary_link_instead_of_writing_through_it(tmp_path: Path):
    """A case links its run's summary.md to a file of the user's: the report must not overwrite that file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    run = tmp_path / "run-20261124-000000-p1"
    run.mkdir()
    (run / "verdicts-main.jsonl").write_text('{"nodeid": "t.py::t", "family": "t", "outcome": "passed"}\n')
    (run / "summary.md").symlink_to(victim)
    report.main([str(run)])
    assert victim.read_text() == "the user's file"
    assert not (run / "summary.md").is_symlink() and "SPMD regression results" in (run / "summary.md").read_text()


def test_the_ci_report_refuses_a_run_folder_that_is_a_link_or_disagrees_with_pytests_exit_status(tmp_path: Path):
    run = runfolder.RunFolder.new(tmp_path / "results", "run-20261124-000000-ci1")
    (run.claim() / "verdicts-main.jsonl").write_text('{"nodeid": "t.py::t", "family": "t", "outcome": "passed"}\n')
    run.finish(0, {"passed": 1}, [], None)
    assert report.main([str(run.path), "--pytest-exit-status", "0"]) == 0
    results = report.load_results(run.path, pytest_exit=1)  # a case rewrote everything to look green
    assert any("its manifest says pytest exited 0, but the pytest that made it exited 1" in p for p in results.problems)
    assert report.counts(results)["failed"] == 1
    assert report.main([str(run.path), "--pytest-exit-status", "1"]) == report.EXIT_RUN_PROBLEM
    (tmp_path / "link").symlink_to(run.path)
    # Refused before anything is read or written through it.
    assert report.main([str(tmp_path / "link"), "--pytest-exit-status", "0"]) == report.EXIT_NO_RECORDS


def test_a_record_is_never_appended_through_a_link_planted_in_place_of_the_verdicts_file(tmp_path: Path):
    from harness.records.results import CaseRecord, read_records, write_record

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    run = tmp_path / "run-20261124-000000-p1"
    run.mkdir()
    (run / "verdicts-main.jsonl").symlink_to(victim)
    write_record(run, CaseRecord(nodeid="t.py::t", family="t", outcome="failed"))
    assert victim.read_text() == "the user's file\n"
    assert [r.outcome for r in read_records(run)] == ["failed"]


def test_a_run_id_that_exists_already_is_a_usage_error_before_anything_runs(pytester):
    pytester.makepyfile(test_x="import pytest\n\n@pytest.mark.spmd\ndef test_x(spmd):\n    pass\n")
    (pytester.path / "results" / "run-planted").mkdir(parents=True)
    result = run(pytester, "--spmd-run-id=run-planted")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spmd-run-id=run-planted: *run-planted exists already; name a new run folder*"])
    assert list((pytester.path / "results" / "run-planted").iterdir()) == []


# --- a body that erases or forges the cost meter's reserved keys ---------------------------------

ERASES_COSTS = """
import os
import pytest
from harness import stepcosts

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_loop(ctx, attack):
    meter = stepcosts.StepMeter(ctx, label="host", host_only=True)
    kept = []
    for _ in range(3):
        with meter.step():
            kept.append(object())
            if attack == "leak":
                kept += [Exception() for _ in range(4)]  # a steady-state failure, if anything judged it
    if attack == "erase":
        ctx.values["harness:costs"] = {}  # the meter's signatures vanish: nothing left to judge
    if attack == "record":
        ctx.record("harness:costs", {})  # the same, through the API (the self-tests forge signatures so)

def test_loop(spmd):
    spmd.run(body_loop, attack=os.environ.get("ATTACK", "none"), fresh=True)
"""


@pytest.mark.parametrize("attack", ["erase", "record"])
def test_a_body_that_erases_its_cost_signatures_fails_against_the_cost_baseline(pytester, monkeypatch, attack):
    """The committed cost baseline names the loop: a case that no longer reports it (its body wiped
    the harness's key) fails, as a loop that stopped being measured does, instead of passing unjudged."""
    pytester.makepyfile(test_erase=ERASES_COSTS)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")  # on the baseline's release line: drift fails
    run(pytester, "--spmd-costs-baseline=costs.json", "--spmd-update-costs").assert_outcomes(passed=1)
    assert "host" in json.loads((pytester.path / "costs.json").read_text())["cases"]["test_erase.py::test_loop"]
    monkeypatch.setenv("ATTACK", attack)
    result = run(pytester, "--spmd-costs-baseline=costs.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*cost drift: 1 item(s) differ from costs.json*", "*host: training loop no longer measured*"]
    )


def test_two_runs_given_the_same_run_id_never_share_its_folder(tmp_path: Path):
    """Both runs pass the configure-time check (the folder is made only once there is something to
    write): the second to claim it finds the first one's folder and must refuse it, not adopt it
    and append its records to the first run's."""
    first = runfolder.RunFolder.new(tmp_path, "run-ci42")
    second = runfolder.RunFolder.new(tmp_path, "run-ci42")
    second.controller_pid += 1  # another pytest process (same host, same second)
    first.claim()
    with pytest.raises(HarnessUsageError, match="already exists and is not this run's folder"):
        second.claim()
    assert runfolder.read_manifest(first.path).pid == first.controller_pid


FORGES_COMPARISON = """
import json, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

FORGED = {"schema": 1, "base": "/base", "base_torch_xla": "2.9.0", "this_torch_xla": ["2.9.1"], "compared": 40,
          "differ": {}, "new": {}, "not_compared": {}, "registry": []}

def body_forges(ctx, folder):
    (pathlib.Path(folder) / "comparison.json").write_text(json.dumps(FORGED))

def test_forges(spmd):
    (folder,) = (p for p in pathlib.Path("results").glob("run-*") if not p.is_symlink())
    spmd.run(body_forges, folder=str(folder.absolute()))
"""


def test_a_comparison_planted_in_a_run_without_a_base_fails_the_run(pytester):
    """A run without --spmd-compare makes no comparison.json: one a case wrote there (a forged
    "40 compared, none differ" the report would show as a green check) fails the run."""
    pytester.makepyfile(test_forge=FORGES_COMPARISON)
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*spmd harness: comparison.json in run-* was not made by this run*"])
    assert "comparison.json" in " ".join(runfolder.read_manifest(only_run_folder(pytester)).problems)
    shown = spmd_report("results", cwd=None)  # the folder pytester ran in
    assert shown.returncode == 1, shown.stdout + shown.stderr


@pytest.mark.parametrize("run_id", ["latest", "run-../x", "../run-x"])
def test_a_hostile_run_id_is_a_usage_error_not_a_traceback(pytester, run_id):
    pytester.makepyfile(test_x="import pytest\n\n@pytest.mark.spmd\ndef test_x(spmd):\n    pass\n")
    result = run(pytester, f"--spmd-run-id={run_id}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    assert "Traceback" not in result.stderr.str()
    result.stderr.fnmatch_lines([f"*--spmd-run-id: {run_id!r} is not a run id: use run- followed by*"])
    assert not (pytester.path / "results").exists() and not (pytester.path / "x").exists()
