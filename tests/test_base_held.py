"""A base run is held to what pytest wrote in it, like a run that is reported (#51 item 3).

scripts/ci-spmd.sh runs this checkout's cases on the base build first, reports that run without
failing the job on it (its failures are the base build's), then compares the PR's run with it. A
case of the base run that rewrites an earlier case's record there (its figures made to match
what the PR's build does) would make the comparison agree with the PR: the base is refused, and so
is one whose own end named what a case did to it (its manifest's problems)."""

from __future__ import annotations

import pytest

from tests.conftest import only_run_folder, run_fake

pytestmark = pytest.mark.selftest

REWRITES_THE_BASE = """
import json, os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_ok(ctx):
    pass

def body_rewrites(ctx, results, rewrite):
    if rewrite == "build":  # a build.json of its making: the run's end names it in its manifest
        for run in pathlib.Path(results).glob("run-*"):
            (run / "build.json").write_text(json.dumps({"id": "forged", "torch_xla": "2.9.0"}))
    if rewrite != "1":
        return
    for path in pathlib.Path(results).glob("run-*/verdicts-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            if record.get("nodeid", "").endswith("test_a"):
                record["reason"] = "edited by a later case"
        path.write_text("".join(json.dumps(record) + "\\n" for record in records))

def test_a(spmd):
    spmd.run(body_ok)

def test_b(spmd):
    # read here, in pytest's process: a case body's child does not inherit the environment
    spmd.run(body_rewrites, results=str(pathlib.Path("base").absolute()), rewrite=os.environ.get("REWRITE"))
"""


@pytest.mark.parametrize("rewrite", ["0", "1", "build"], ids=["as-written", "rewritten", "build-planted"])
def test_a_base_run_whose_records_a_case_rewrote_is_refused(pytester, monkeypatch, rewrite):
    pytester.makepyfile(test_base=REWRITES_THE_BASE)
    monkeypatch.setenv("REWRITE", rewrite)
    monkeypatch.setenv("HARNESS_FAKE_BUILD", "base-build")  # so the run writes its build.json
    base = run_fake(pytester, "--spmd-results-dir=base")
    assert base.ret == (1 if rewrite == "build" else 0), base.stdout.str()
    monkeypatch.setenv("REWRITE", "0")
    compared = run_fake(pytester, "--spmd-results-dir=results", f"--spmd-compare={only_run_folder(pytester, 'base')}")
    said = compared.stdout.str() + compared.stderr.str()
    if rewrite == "0":
        assert compared.ret == 0, said
        return
    assert compared.ret != 0, said
    named = {"1": "test_base.py::test_a was rewritten after its case ended", "build": "build.json in run-"}
    assert named[rewrite] in said, said
