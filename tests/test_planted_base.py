"""A run folder a case of the base run planted beside it, its manifest saying it finished later
than the base run did (inside the hour of clock skew the choice allows for), its records holding
the figures the PR's build will have: `--spmd-compare=FOLDER` must still take the run pytest
finished last, not the one whose manifest says so (harness.records.runfolder.newest_finished_first)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_fake
from tests.test_costs import signature

pytestmark = pytest.mark.selftest

CASES = """
import datetime, json, os, pathlib, shutil
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_trains(ctx, signature):
    ctx.record("harness:costs", {"train": signature})

def body_plants(ctx, results, forged):
    if forged is None:
        return
    (own,) = [p for p in pathlib.Path(results).glob("run-*") if not p.is_symlink()]
    planted = own.parent / "run-00000000-000000-planted"
    planted.mkdir()
    records = [json.loads(line) for line in next(own.glob("verdicts-*.jsonl")).read_text().splitlines()]
    for record in records:
        record["costs"] = {"train": json.loads(forged)}
    (planted / "verdicts-main.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in records))
    manifest = json.loads((own / "run.json").read_text())
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=50)
    manifest.update(run_id=planted.name, status="finished", finished=later.isoformat(timespec="seconds"),
                    exitstatus=0, record_digests={}, failed_ids=[], problems=[])
    (planted / "run.json").write_text(json.dumps(manifest))

def test_a_trains(spmd):
    spmd.run(body_trains, signature=json.loads(os.environ["CASE_SIGNATURE"]))

def test_z_plants(spmd):
    spmd.run(body_plants, results=str(pathlib.Path("base").absolute()), forged=os.environ.get("FORGED"))
"""


def test_a_planted_run_that_says_it_finished_later_is_not_the_base(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    regressed = signature(all_gather=5)
    monkeypatch.setenv("CASE_SIGNATURE", json.dumps(signature()))
    monkeypatch.setenv("FORGED", json.dumps(regressed))
    assert run_fake(pytester, "--spmd-results-dir=base").ret == 0
    assert (pytester.path / "base" / "run-00000000-000000-planted" / "run.json").exists(), "nothing was planted"
    monkeypatch.delenv("FORGED")
    monkeypatch.setenv("CASE_SIGNATURE", json.dumps(regressed))
    compared = run_fake(pytester, "--spmd-results-dir=pr", "--spmd-compare=base")
    said = compared.stdout.str()
    header = said.split("compared with base run", 1)[1].split("\n")[0]
    assert "000000-planted" not in header, header
    assert compared.ret == 1, said
    compared.stdout.fnmatch_lines(["*all-gather 3 -> 5*"])
