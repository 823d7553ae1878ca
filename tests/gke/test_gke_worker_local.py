"""The worker entrypoint and --local, end to end, with gke_fake_suite.py standing in for pytest -m spmd."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from harness.gke import accelerators, manifest
from harness.gke import report_channel as rc
from harness.gke.__main__ import main
from harness.gke.local import LocalConfig, host_env, run_local, worker_container
from harness.gke.worker import WorkerOptions, run_worker

pytestmark = pytest.mark.selftest

FAKE_SUITE = f"{sys.executable} {Path(__file__).with_name('gke_fake_suite.py')}"
V4 = accelerators.lookup("v4", "2x2x2")
POD_ENV = {
    **os.environ,
    "MEGASCALE_SLICE_ID": "1",
    "MEGASCALE_NUM_SLICES": "2",
    "HARNESS_HOST_ID": "1",
    "HARNESS_POD_NAME": "p-1-1",
}


def work(tmp_path: Path, *extra: str, env: dict[str, str] = POD_ENV, timeout_s: float = 30) -> tuple[int, str, dict]:
    out = io.StringIO()
    opts = WorkerOptions(
        results_dir=tmp_path / "results",
        backend="fake",
        suite_command=FAKE_SUITE,
        suite_timeout_s=timeout_s,
        extra_args=extra,
    )
    code = run_worker(opts, env, out)
    log = out.getvalue()
    return code, log, rc.decode(log)


def test_worker_reports_tagged_records(tmp_path: Path) -> None:
    code, log, report = work(tmp_path)
    assert code == 0 and report["error"] is None, log
    assert "fake suite on 1:1, backend fake" in log  # the suite's output is in the pod log
    assert [(r["slice_id"], r["host_id"], r["outcome"]) for r in report["records"]] == [
        (1, 1, "passed"),
        (1, 1, "xfailed"),
    ]
    assert report["records"][0]["shardings"]["fc.weight"] == "{devices=[4,1]0,1,2,3}"
    assert report["suite_command"][-3:] == [
        "--spmd-backend=fake",
        f"--spmd-results-dir={tmp_path / 'results'}",
        f"--junitxml={tmp_path / 'results' / 'junit.xml'}",
    ]
    assert json.loads((tmp_path / "results" / "report.json").read_text())["pod"] == "p-1-1"
    assert (tmp_path / "results" / "junit.xml").exists()


def test_worker_reports_even_when_the_suite_aborts(tmp_path: Path) -> None:
    code, _, report = work(tmp_path, "--crash-on", "1:1")
    assert code == 1
    assert report["signal"] == "SIGABRT" and "SIGABRT" in report["error"]
    assert [r["outcome"] for r in report["records"]] == ["passed"]  # what it judged before dying
    assert "about to crash" in report["log_tail"]


def test_worker_kills_a_hung_suite_and_reports(tmp_path: Path) -> None:
    code, _, report = work(tmp_path, "--hang-on", "1:1", timeout_s=1)
    assert code == 1 and report["timed_out"] is True and "suite timeout" in report["error"]


@pytest.mark.parametrize(
    "extra, env, error",
    [
        # pytest's "internal error" exit code: a crash of the harness, not a verdict
        (("--exit", "3"), POD_ENV, "exited 3"),
        # a broken env wiring still yields a block that says so
        ((), {**POD_ENV, "MEGASCALE_SLICE_ID": "zero"}, "MEGASCALE_SLICE_ID='zero' is not an integer"),
    ],
)
def test_worker_errors_travel_in_the_block(tmp_path: Path, extra, env, error) -> None:
    code, _, report = work(tmp_path, *extra, env=env)
    assert code == 1 and error in report["error"]


def test_worker_cannot_start_suite(tmp_path: Path) -> None:
    out = io.StringIO()
    opts = WorkerOptions(results_dir=tmp_path, suite_command="/nonexistent/pytest")
    assert run_worker(opts, POD_ENV, out) == 1
    assert "could not start the suite" in rc.decode(out.getvalue())["error"]


def test_local_env_is_what_the_pod_gets() -> None:
    cfg = LocalConfig(accel=V4, slices=2, out_dir=Path("unused"))
    container = manifest.worker_container(manifest.find(manifest.render(V4, 2, "img", name=cfg.name), "JobSet"))
    env = host_env(cfg, container, 1, 0)
    assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == "1"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "localhost"
    assert env["HARNESS_HOST_ID"] == env["TPU_WORKER_ID"] == "0"
    assert env["HARNESS_POD_NAME"] == "spmd-local-slice-1-0"


def test_local_hosts_get_the_job_size_the_pods_get() -> None:
    """--local --job-size: each host's suite reads SPMD_JOB_SIZE from the env the pod would get."""
    cfg = LocalConfig(accel=V4, slices=2, out_dir=Path("unused"), job_size="small")
    assert host_env(cfg, worker_container(cfg), 0, 0)["SPMD_JOB_SIZE"] == "small"
    plain = LocalConfig(accel=V4, slices=2, out_dir=Path("unused"))
    assert "SPMD_JOB_SIZE" not in host_env(plain, worker_container(plain), 0, 0)


def test_local_runs_two_slices_and_agrees(tmp_path: Path) -> None:
    out = io.StringIO()
    cfg = LocalConfig(accel=V4, slices=2, out_dir=tmp_path, parallel=2, backend="fake", suite_command=FAKE_SUITE)
    result = run_local(cfg, out)
    assert result.ok, result.failures
    assert [(r.slice_id, r.host_id, len(r.records)) for r in result.hosts] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
    ]
    assert (tmp_path / "slice1-host1.log").exists() and (tmp_path / "junit.xml").exists()


def test_local_cli_reports_cross_slice_disagreement_and_crash(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(
        [
            "run",
            "--local",
            "--accelerator",
            "v4",
            "--topology",
            "2x2x2",
            "--parallel",
            "2",
            "--out",
            str(tmp_path),
            "--suite-command",
            FAKE_SUITE,
            "--",
            "--disagree-on-slice",
            "1",
            "--crash-on",
            "0:1",
        ],
        out=out,
    )
    text = out.getvalue()
    assert code == 1, text
    assert "VERDICT: FAILED" in text
    failures = json.loads((tmp_path / "results.json").read_text())["failures"]
    assert any("slice0.host1" in f and "SIGABRT" in f for f in failures)
    assert any("'fc.weight'" in f and "slice1.host0, slice1.host1 saw '{replicated}'" in f for f in failures)


@pytest.mark.parametrize(
    "uri, status",
    [
        # the default: no second channel, and the report says so
        (None, "not configured"),
        # a typo'd scheme is reported, not silently ignored
        ("s3://bucket/x", "not uploaded: 's3://bucket/x' is not a gs:// URI"),
    ],
)
def test_bucket_hook_reports_what_it_did(uri, status) -> None:
    from harness.gke import bucket

    assert bucket.publish(uri, "slice0-host0.json", b"{}") == status


def test_bucket_status_travels_in_the_report(tmp_path: Path) -> None:
    _, _, report = work(tmp_path)
    assert report["bucket"] == "not configured"
