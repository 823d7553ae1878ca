"""The GitHub workflows and the scripts they call.

Three layers: the linters a reviewer would run (zizmor offline, GitHub's workflow schema,
yamllint), this project's own rules (pinning, permissions, timeouts, no logic only in YAML, the
reusable workflow's interface torch_xla depends on), and the scripts' behaviour, run the way the
workflows run them but with a stub virtualenv so no torch_xla or cluster is needed.

The linters come with the `test` extra; a missing one fails the test instead of skipping it, so a
broken install cannot turn these checks into silent passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.records.results import CaseRecord
from tests.conftest import REPO

pytestmark = pytest.mark.selftest

WORKFLOWS_DIR = REPO / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS_DIR.glob("*.y*ml"))
EXPECTED_WORKFLOWS = {"harness-ci.yml", "nightly-multislice.yml", "spmd-regression.yml"}
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+)*\s*$")
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")
# The only permissions any job may hold, and the one job step that justifies id-token.
ALLOWED_PERMISSIONS = {"contents": "read", "id-token": "write"}
WIF_AUTH_ACTION = "google-github-actions/auth@"
# What a `run:` line may do: call a repo script, the harness CLI, or a README command.
ALLOWED_RUN_LINE = re.compile(
    r"^(bash (?P<script>scripts/[\w.-]+\.sh|\.ci/run)"
    r"|(\.venv/bin/)?python3? -m harness(\.[\w.]+)?"
    r"|\.venv/bin/pytest)(\s|$)"
)


def tool(name: str) -> str:
    """A linter from the interpreter's own bin dir (the venv running the tests), else PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} is neither next to {sys.executable} nor on PATH; install the test extra: pip install -e '.[test]'"
        )
    return found


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    on = workflow.get("on", workflow.get(True))
    return {on: None} if isinstance(on, str) else dict(on)


def jobs(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from load(path)["jobs"].items()


def steps(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_id, job in jobs(path):
        for step in job.get("steps", []):
            yield job_id, step


def by_name(files: list[Path]) -> list[Any]:
    return [pytest.param(f, id=f.name) for f in files]


# --- the linters ---------------------------------------------------------------------------------


def test_the_expected_workflows_exist():
    # Also keeps the parametrized tests below from passing vacuously over an empty folder.
    assert {f.name for f in WORKFLOW_FILES} == EXPECTED_WORKFLOWS


def test_zizmor_offline_reports_nothing(tmp_path: Path):
    # --offline: no network and no GitHub token. --no-config/--no-ignores: nothing suppressed.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN", "ZIZMOR_CONFIG")
    }
    proc = subprocess.run(
        [
            tool("zizmor"),
            "--offline",
            "--no-config",
            "--no-ignores",
            "--persona",
            "pedantic",
            "--format",
            "json",
            "--cache-dir",
            str(tmp_path),
            str(WORKFLOWS_DIR),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    findings = json.loads(proc.stdout or "null")
    summary = [f"{f['ident']}: {f['desc']}" for f in findings or []]
    assert proc.returncode == 0 and findings == [], summary or proc.stderr


def test_workflows_match_the_github_workflow_schema():
    # One run for all files: most of the cost is the tool starting up. Its output names the file.
    proc = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOW_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamllint_is_clean():
    config = (
        "{extends: default, rules: {line-length: {max: 120}, document-start: disable, truthy: {check-keys: false}}}"
    )
    proc = subprocess.run(
        [tool("yamllint"), "--strict", "-d", config, str(WORKFLOWS_DIR)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- pinning -------------------------------------------------------------------------------------


def uses_lines(path: Path) -> list[tuple[str, str]]:
    """(reference, rest of line) for each `uses:`, read as text because YAML drops comments."""
    return [
        (m.group(1), m.group(2))
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith("#") and (m := USES_LINE.match(line))
    ]


def is_same_repository(ref: str) -> bool:
    return ref.startswith(("$/", "./"))


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_every_action_is_pinned_to_a_commit_with_its_version(path: Path):
    parsed = [s["uses"] for _, s in steps(path) if "uses" in s] + [j["uses"] for _, j in jobs(path) if "uses" in j]
    found = uses_lines(path)
    # A `uses:` the text scan missed (e.g. in flow style) would escape the pin check.
    assert sorted(parsed) == sorted(ref for ref, _ in found)
    for ref, rest in found:
        if is_same_repository(ref):
            continue
        assert SHA_PIN.match(ref), f"{path.name}: {ref} is not pinned to a 40-hex commit"
        assert VERSION_COMMENT.search(rest), f"{path.name}: {ref} lacks a '# vX.Y.Z' comment"


def test_each_action_has_one_pin_across_workflows():
    pins: dict[str, set[str]] = {}
    for path in WORKFLOW_FILES:
        for ref, rest in uses_lines(path):
            if not is_same_repository(ref):
                action, sha = ref.split("@")
                pins.setdefault(action, set()).add(f"{sha} {rest.strip()}")
    assert {a: p for a, p in pins.items() if len(p) > 1} == {}


# --- permissions, triggers, timeouts, secrets ----------------------------------------------------


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_workflow_default_permissions_are_empty(path: Path):
    assert load(path).get("permissions", "missing") == {}


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_every_job_declares_minimal_permissions(path: Path):
    for job_id, job in jobs(path):
        granted = job.get("permissions")
        assert isinstance(granted, dict), f"{path.name}:{job_id} must list its permissions"
        extra = {k: v for k, v in granted.items() if ALLOWED_PERMISSIONS.get(k) != v}
        assert extra == {}, f"{path.name}:{job_id} asks for {extra}"
        if "id-token" in granted:
            assert any(s.get("uses", "").startswith(WIF_AUTH_ACTION) for s in job.get("steps", [])), (
                f"{path.name}:{job_id} has id-token: write without Workload Identity Federation"
            )


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_every_job_with_steps_has_a_timeout(path: Path):
    # A job that calls a reusable workflow cannot take timeout-minutes; the called job has one,
    # and the called workflow is one of the files checked here.
    for job_id, job in jobs(path):
        if "steps" in job:
            assert "timeout-minutes" in job, f"{path.name}:{job_id} has no timeout-minutes"


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_no_trigger_runs_untrusted_code_with_privileges(path: Path):
    assert not {"pull_request_target", "workflow_run"} & set(triggers(load(path)))


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_no_secrets_are_used(path: Path):
    # Google Cloud is reached through OIDC; nothing here needs a stored secret.
    text = path.read_text()
    assert "secrets." not in text and "secrets: inherit" not in text


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_checkout_does_not_persist_credentials(path: Path):
    for job_id, step in steps(path):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}:{job_id}"


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_results_are_uploaded_even_when_the_run_fails(path: Path):
    for job_id, step in steps(path):
        if step.get("uses", "").startswith("actions/upload-artifact@"):
            assert step.get("if") == "always()", f"{path.name}:{job_id}"


def test_the_results_upload_leaves_out_the_latest_links():
    """upload-artifact follows links: `latest` would upload its run a second time."""
    (upload,) = (s for _, s in steps(WORKFLOWS_DIR / "spmd-regression.yml") if s.get("name") == "Upload results")
    paths = upload["with"]["path"].split()
    assert paths[0] == "results/" and {"!results/**/latest", "!results/**/latest/**"} <= set(paths)


# --- no logic only in YAML -----------------------------------------------------------------------


def run_lines(path: Path) -> Iterator[str]:
    for _, step in steps(path):
        for line in step.get("run", "").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                yield line.strip()


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_run_steps_only_call_repo_scripts_or_the_harness_cli(path: Path):
    for line in run_lines(path):
        match = ALLOWED_RUN_LINE.match(line)
        assert match, f"{path.name}: `{line}` is logic that lives only in YAML; put it in a script"
        # Inputs reach scripts through env:, never spliced into the shell text.
        assert "${{" not in line, f"{path.name}: `{line}` expands an expression inside a script"


@pytest.mark.parametrize("path", by_name(WORKFLOW_FILES))
def test_scripts_the_workflows_call_exist(path: Path):
    for line in run_lines(path):
        match = ALLOWED_RUN_LINE.match(line)
        if match and match.group("script"):
            assert (REPO / match.group("script")).is_file(), f"{path.name} calls missing {match.group('script')}"


@pytest.mark.parametrize("script", by_name(sorted((REPO / "scripts").glob("*.sh"))))
def test_scripts_parse(script: Path):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- the interfaces other people depend on -------------------------------------------------------


def test_reusable_workflow_keeps_the_inputs_torch_xla_passes():
    inputs = triggers(load(WORKFLOWS_DIR / "spmd-regression.yml"))["workflow_call"]["inputs"]
    # Renaming one of these breaks torch_xla's build_and_test.yml (see the README snippet).
    assert inputs["wheels-artifact"] == {**inputs["wheels-artifact"], "type": "string", "default": ""}
    assert inputs["python-version"]["type"] == "string"
    assert inputs["devices"] == {**inputs["devices"], "type": "number", "default": 4}
    for name, spec in inputs.items():
        assert spec.get("type") in ("string", "number", "boolean"), name
        assert spec.get("required") or "default" in spec, f"{name} needs a default or required: true"


def test_reusable_workflow_only_runs_the_ci_scripts():
    # Besides the suite's script, one line asks the harness which Python the wheels need; the
    # report job runs its own script alone.
    assert list(run_lines(WORKFLOWS_DIR / "spmd-regression.yml")) == [
        'python3 -m harness.wheeltags "$WHEELS_DIR" >> "$GITHUB_OUTPUT"',
        "bash scripts/ci-spmd.sh",
        "bash scripts/ci-spmd-report.sh",
    ]


def test_harness_ci_runs_the_readme_test_command_on_prs_and_main():
    workflow = load(WORKFLOWS_DIR / "harness-ci.yml")
    assert set(triggers(workflow)) == {"pull_request", "push"}
    assert triggers(workflow)["push"] == {"branches": ["main"]}
    assert "bash .ci/run" in run_lines(WORKFLOWS_DIR / "harness-ci.yml")


def test_nightly_runs_on_schedule_or_by_hand_and_never_overlaps():
    workflow = load(WORKFLOWS_DIR / "nightly-multislice.yml")
    on = triggers(workflow)
    assert on["schedule"] and set(on["workflow_dispatch"]["inputs"]) == {
        "accelerator",
        "topology",
        "slices",
        "image",
        "job_size",
    }
    assert on["workflow_dispatch"]["inputs"]["accelerator"]["options"] == ["v6e", "v4"]
    assert workflow["concurrency"]["cancel-in-progress"] is False


# --- scripts/ci-spmd.sh, run as the reusable workflow runs it ------------------------------------

STUB_PYTEST = """#!{python}
# Stands in for the venv's pytest: records its arguments, writes the records it is given into a
# run folder as the plugin does (none when there are none: no SPMD case ran), exits.
import json, os, pathlib, sys
from harness.records.runfolder import RunFolder
args = sys.argv[1:]
pathlib.Path(os.environ["STUB_ARGV_FILE"]).write_text(json.dumps(args))
results = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-results-dir=")))
records = os.environ.get("STUB_RECORDS", "")
code = int(os.environ.get("STUB_EXIT", "0"))
if records:
    run = RunFolder.new(results, next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--spmd-run-id=")), None))
    (run.claim() / "verdicts-gw0.jsonl").write_text(records)
    failed = [json.loads(line)["nodeid"] for line in records.splitlines() if '"failed"' in line]
    run.finish(code, {{}}, failed, None)
sys.exit(code)
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def stub_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "pytest", STUB_PYTEST.format(python=sys.executable))
    executable(venv / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    return venv


def hermetic_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without anything from a surrounding CI job or earlier run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "SPMD_", "STUB_"))}
    return {**env, "STUB_ARGV_FILE": str(tmp_path / "argv.json"), **extra}


def run_ci_script(venv: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "ci-spmd.sh"), "--venv", str(venv), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def jsonl(*records: CaseRecord) -> str:
    return "".join(r.to_json() + "\n" for r in records)


FAILED_CASE = CaseRecord(
    nodeid="cases/test_scalar_specs.py::test_wrap[off]",
    family="scalar_specs",
    outcome="failed",
    reason="spec lost",
    evidence="'' != '{replicated}'",
)
PASSED_CASE = CaseRecord(nodeid="cases/test_scalar_specs.py::test_wrap[on]", family="scalar_specs", outcome="passed")


@pytest.mark.parametrize(
    "stub_exit, records, expected_exit",
    [
        # Green run: pytest's 0.
        (0, jsonl(PASSED_CASE), 0),
        # A failing case: pytest's 1, not the report's 0.
        (1, jsonl(FAILED_CASE, PASSED_CASE), 1),
        # Nothing collected: pytest's 5 stays a failure.
        (5, "", 5),
        # pytest says 0 but no case ran (e.g. the plugin did not load): the report's 2.
        (0, "", 2),
    ],
)
def test_ci_script_keeps_pytests_exit_code_and_fails_empty_runs(
    stub_venv: Path, tmp_path: Path, stub_exit: int, records: str, expected_exit: int
):
    env = hermetic_env(tmp_path, STUB_EXIT=str(stub_exit), STUB_RECORDS=records)
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == expected_exit, proc.stdout + proc.stderr
    if records:
        assert (tmp_path / "results" / "latest" / "summary.md").is_file()


def test_ci_script_runs_the_spmd_marker_under_xdist_with_junit(stub_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE))
    results = tmp_path / "results"
    proc = run_ci_script(
        stub_venv,
        env,
        "--skip-install",
        "--results-dir",
        str(results),
        "--devices",
        "8",
        "--",
        "--spmd-case-timeout",
        "60",
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())
    # The script names the run folder itself, and reports exactly that one (not `latest`).
    run_ids = [a for a in argv if a.startswith("--spmd-run-id=run-")]
    assert len(run_ids) == 1 and (results / run_ids[0].split("=", 1)[1] / "summary.md").is_file()
    argv.remove(run_ids[0])
    assert argv == [
        "cases",
        "-m",
        "spmd",
        "-n",
        "2",
        "--spmd-backend=cpu",
        "--spmd-devices=8",
        f"--spmd-results-dir={results}",
        f"--junitxml={results / 'junit.xml'}",
        "--spmd-case-timeout",
        "60",
    ]


def test_ci_script_under_github_actions_writes_step_summary_and_annotations(stub_venv: Path, tmp_path: Path):
    step_summary = tmp_path / "step-summary.md"
    env = hermetic_env(
        tmp_path,
        STUB_EXIT="1",
        STUB_RECORDS=jsonl(FAILED_CASE),
        GITHUB_ACTIONS="true",
        GITHUB_STEP_SUMMARY=str(step_summary),
    )
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 1
    assert "::error title=SPMD regression%3A cases/test_scalar_specs.py%3A%3Atest_wrap[off]::spec lost" in proc.stdout
    assert "### `scalar_specs`" in step_summary.read_text()


def test_ci_script_keeps_an_earlier_run_and_never_reports_it_as_this_one(stub_venv: Path, tmp_path: Path):
    results = tmp_path / "results"
    earlier = run_ci_script(
        stub_venv,
        hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE)),
        "--skip-install",
        "--results-dir",
        str(results),
    )
    assert earlier.returncode == 0, earlier.stderr
    (results / "notes.txt").write_text("a user's file")
    before = sorted(str(p.relative_to(results)) for p in results.rglob("*"))
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path), "--skip-install", "--results-dir", str(results))
    assert proc.returncode == 2, "an earlier run's verdicts made an empty run look green"
    assert "wrote no run folder" in proc.stderr
    assert sorted(str(p.relative_to(results)) for p in results.rglob("*")) == before, "a file was deleted or added"


def test_ci_script_wants_exactly_one_torch_xla_wheel(stub_venv: Path, tmp_path: Path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.10.0a0+git1234-cp312-cp312-linux_x86_64.whl").touch()
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path), "--wheels", str(wheels))
    assert proc.returncode == 2
    assert "expected one torch_xla-*.whl" in proc.stderr


STUB_PIP_PYTHON = """#!/bin/sh
# Stands in for the venv's python: `-m pip` is recorded (one JSON line per call), all else runs.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  shift 2
  exec "{python}" -c 'import json, sys; open(sys.argv[1], "a").write(json.dumps(sys.argv[2:]) + "\\n")' "$STUB_PIP_LOG" "$@"
fi
exec "{python}" "$@"
"""
JAX_NIGHTLY_INDEX = "https://us-python.pkg.dev/ml-oss-artifacts-published/jax/simple/"


def test_ci_script_installs_the_wheels_then_nightly_jax_from_jaxs_index_as_upstream_does(
    stub_venv: Path, tmp_path: Path
):
    # pytorch/xla's _test.yml: the wheels, then `pip install --pre 'torch_xla[pallas]' --index-url <JAX's
    # index>`; not the retired jax_nightly_releases.html link page.
    executable(stub_venv / "bin" / "python", STUB_PIP_PYTHON.format(python=sys.executable))
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheels = wheel_folder(
        tmp_path,
        f"torch-2.10.0a0+git1-{tag}-{tag}-linux_x86_64.whl",
        f"torch_xla-2.10.0+git2-{tag}-{tag}-linux_x86_64.whl",
    )
    pip_log = tmp_path / "pip.jsonl"
    env = hermetic_env(tmp_path, STUB_PIP_LOG=str(pip_log), STUB_RECORDS=jsonl(PASSED_CASE))
    proc = run_ci_script(stub_venv, env, "--wheels", str(wheels), "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(line) for line in pip_log.read_text().splitlines()]
    torch_wheel, xla_wheel = (str(w) for w in sorted(wheels.glob("*.whl")))
    assert [call[-2:] for call in calls] == [
        [torch_wheel, xla_wheel],
        [JAX_NIGHTLY_INDEX, f"{xla_wheel}[pallas]"],
        ["-e", "."],
    ]
    jax_call = calls[1]
    assert "--pre" in jax_call and jax_call[jax_call.index("--index-url") + 1] == JAX_NIGHTLY_INDEX
    assert not {"--extra-index-url", "-f", "--find-links"} & {arg for call in calls for arg in call}


def test_ci_script_still_takes_the_old_results_spelling(stub_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE))
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results", str(tmp_path / "old"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "old" / "latest" / "summary.md").is_file()
    help_text = run_ci_script(stub_venv, env, "--help").stdout
    assert "--results-dir DIR" in help_text and "--results " not in help_text


def test_ci_script_judges_by_the_callers_registry_when_given_one(stub_venv: Path, tmp_path: Path):
    registry = tmp_path / "pr" / "known_bugs.toml"
    registry.parent.mkdir()
    registry.write_text("# the PR's copy\n")
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), SPMD_KNOWN_BUGS=str(registry))
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stderr
    assert f"--spmd-known-bugs={registry}" in json.loads((tmp_path / "argv.json").read_text())


def test_ci_script_refuses_a_missing_registry_before_installing(stub_venv: Path, tmp_path: Path):
    executable(stub_venv / "bin" / "python", STUB_PIP_PYTHON.format(python=sys.executable))
    pip_log = tmp_path / "pip.jsonl"
    proc = run_ci_script(
        stub_venv,
        hermetic_env(tmp_path, STUB_PIP_LOG=str(pip_log)),
        "--known-bugs",
        str(tmp_path / "caller" / "missing.toml"),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "missing.toml: no such file" in proc.stderr
    assert not pip_log.exists(), "it installed before refusing"


def test_ci_script_writes_the_counts_to_the_steps_outputs(stub_venv: Path, tmp_path: Path):
    output = tmp_path / "github-output"
    output.write_text("earlier=1\n")
    regressed = CaseRecord(
        nodeid="cases/test_scalar_specs.py::test_wrap[scalar]",
        family="scalar_specs",
        outcome="failed",
        registry_verdict="regressed",
        known_bug="fsdpv2-scalar-param-spec",
    )
    xfailed = CaseRecord(
        nodeid="cases/test_dtensor.py::test_parallelize",
        family="dtensor",
        outcome="xfailed",
        registry_verdict="reproduced",
    )
    env = hermetic_env(
        tmp_path,
        STUB_EXIT="1",
        STUB_RECORDS=jsonl(FAILED_CASE, regressed, xfailed, PASSED_CASE),
        GITHUB_ACTIONS="true",
        GITHUB_OUTPUT=str(output),
    )
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = output.read_text().splitlines()
    assert lines[0] == "earlier=1", "an earlier step's output was overwritten"
    assert dict(line.split("=", 1) for line in lines[1:]) == {
        "cases": "4",
        "failed": "2",
        "regressed": "1",
        "unexpected-passed": "0",
        "xfailed": "1",
        "passed": "1",
        "skipped": "0",
    }


# --- the two jobs of the reusable workflow: the suite (--report-later), then the report ---------

WORKFLOW_RUN_ID = "run-gh123-1"


def run_report_script(venv: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "ci-spmd-report.sh"), "--venv", str(venv), "--skip-install", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def suite_job(
    stub_venv: Path, tmp_path: Path, records: str, stub_exit: int
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """ci-spmd.sh as the suite job runs it; returns its result and the job's files' folder."""
    job = tmp_path / "suite-job"
    job.mkdir()
    for name in ("summary", "output"):
        (job / name).touch()
    env = hermetic_env(
        tmp_path,
        STUB_EXIT=str(stub_exit),
        STUB_RECORDS=records,
        GITHUB_ACTIONS="true",
        GITHUB_STEP_SUMMARY=str(job / "summary"),
        GITHUB_OUTPUT=str(job / "output"),
        SPMD_REPORT_LATER="true",
        SPMD_RUN_ID=WORKFLOW_RUN_ID,
    )
    return run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results")), job


def report_job(
    stub_venv: Path, tmp_path: Path, *args: str, attempt: int = 1, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """ci-spmd-report.sh as the report job runs it on tmp_path/results; returns its result and the job's files' folder."""
    job = tmp_path / f"report-job-{attempt}"
    job.mkdir()
    for name in ("summary", "output"):
        (job / name).touch()
    full_env = hermetic_env(
        tmp_path,
        GITHUB_ACTIONS="true",
        GITHUB_STEP_SUMMARY=str(job / "summary"),
        GITHUB_OUTPUT=str(job / "output"),
        SPMD_RESULTS_DIR=str(tmp_path / "results"),
        SPMD_RUN_ID=WORKFLOW_RUN_ID,
        **env,
    )
    return run_report_script(stub_venv, full_env, *args), job


def sparse_file(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)


def outside_the_stop_commands_window(stdout: str) -> str:
    """The lines the runner would execute: everything but what lies between a stop and its resume."""
    return re.sub(r"::stop-commands::(\w+)\n.*?::\1::\n", "", stdout, flags=re.S)


def test_the_suite_job_hands_on_pytests_exit_status_and_nothing_else(stub_venv: Path, tmp_path: Path):
    proc, job = suite_job(stub_venv, tmp_path, jsonl(FAILED_CASE, PASSED_CASE), stub_exit=1)
    assert proc.returncode == 1, "the suite job still fails with pytest's status"
    assert (job / "output").read_text() == "pytest-exit-status=1\n"
    assert (job / "summary").read_text() == ""
    assert "::error" not in outside_the_stop_commands_window(proc.stdout)
    # Its log still says what failed (inert, inside the window).
    assert "spec lost" in proc.stdout
    assert (tmp_path / "results" / WORKFLOW_RUN_ID / "run.json").is_file()


def test_the_report_job_writes_summary_annotations_and_counts_from_the_results(stub_venv: Path, tmp_path: Path):
    suite, _ = suite_job(stub_venv, tmp_path, jsonl(FAILED_CASE, PASSED_CASE), stub_exit=1)
    assert suite.returncode == 1, suite.stdout + suite.stderr
    proc, job = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="1", SPMD_SUITE_RESULT="failure")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "::error title=SPMD regression%3A cases/test_scalar_specs.py%3A%3Atest_wrap[off]::spec lost" in proc.stdout
    assert "### `scalar_specs`" in (job / "summary").read_text()
    counts = dict(line.split("=", 1) for line in (job / "output").read_text().splitlines())
    assert (counts["failed"], counts["passed"], counts["cases"]) == ("1", "1", "2")


def test_the_report_job_never_passes_a_run_the_suite_job_did_not_pass(stub_venv: Path, tmp_path: Path):
    # Records and manifest say green (pytest exited 0), but the suite job failed afterwards.
    suite, _ = suite_job(stub_venv, tmp_path, jsonl(PASSED_CASE), stub_exit=0)
    assert suite.returncode == 0, suite.stdout + suite.stderr
    proc, _ = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="0", SPMD_SUITE_RESULT="cancelled")
    assert proc.returncode == 1 and "the suite job's result is cancelled: not a pass" in proc.stderr
    # A green manifest held to a failing exit status is not green either.
    proc, job = report_job(stub_venv, tmp_path, attempt=2, SPMD_PYTEST_EXIT_STATUS="1", SPMD_SUITE_RESULT="failure")
    assert proc.returncode == 1
    assert "its manifest says pytest exited 0, but the pytest that made it exited 1" in proc.stdout
    assert "failed=1" in (job / "output").read_text().splitlines()


def test_the_report_job_fails_when_the_suite_gave_no_exit_status(stub_venv: Path, tmp_path: Path):
    proc, job = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="", SPMD_SUITE_RESULT="failure")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = "::error title=SPMD regression::the suite job (result: failure) gave no pytest exit status"
    assert proc.stdout.startswith(line)
    assert "gave no pytest exit status" in (job / "summary").read_text()
    assert (job / "output").read_text() == "", "no counts: the workflow's outputs stay empty"


def test_the_report_job_reports_the_base_build_first_and_counts_the_prs_run_alone(stub_venv: Path, tmp_path: Path):
    base = tmp_path / "base-venv"
    shutil.copytree(stub_venv, base)
    output = tmp_path / "suite-output"
    env = hermetic_env(
        tmp_path,
        STUB_RECORDS=jsonl(PASSED_CASE),
        GITHUB_ACTIONS="true",
        GITHUB_OUTPUT=str(output),
        SPMD_REPORT_LATER="true",
        SPMD_RUN_ID=WORKFLOW_RUN_ID,
    )
    suite = run_ci_script(
        stub_venv, env, "--skip-install", "--base-venv", str(base), "--results-dir", str(tmp_path / "results")
    )
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert output.read_text() == "pytest-exit-status=0\nbase-pytest-exit-status=0\n"
    assert (tmp_path / "results" / "base" / WORKFLOW_RUN_ID / "run.json").is_file()
    proc, job = report_job(
        stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="0", SPMD_BASE_PYTEST_EXIT_STATUS="0", SPMD_SUITE_RESULT="success"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (job / "summary").read_text()
    assert summary.index("SPMD regression results: base build") < summary.index("## SPMD regression results\n")
    names = [line.split("=", 1)[0] for line in (job / "output").read_text().splitlines()]
    assert sorted(names) == sorted(set(names)) and "failed" in names, "the base run's counts were written too"


def test_the_report_job_runs_nothing_from_the_results_artifact(stub_venv: Path, tmp_path: Path):
    """Python files a case left in the results (a harness package, a sitecustomize) are data there."""
    suite, _ = suite_job(stub_venv, tmp_path, jsonl(FAILED_CASE), stub_exit=1)
    assert suite.returncode == 1, suite.stdout + suite.stderr
    marker = tmp_path / "ran"
    forged = f"open({str(marker)!r}, 'w').write(__file__)\n"
    for folder in (tmp_path / "results", tmp_path / "results" / WORKFLOW_RUN_ID):
        (folder / "harness").mkdir()
        for name in ("harness/__init__.py", "harness/report.py", "sitecustomize.py", "usercustomize.py"):
            (folder / name).write_text(forged)
    proc, job = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="1", SPMD_SUITE_RESULT="failure")
    assert not marker.exists(), f"the report job ran {marker.read_text()}"
    assert proc.returncode == 1 and "::error title=SPMD regression%3A" in proc.stdout
    assert "failed=1" in (job / "output").read_text().splitlines()


@pytest.mark.parametrize("value", ["0; rm -rf /", "x", "1000"])
def test_the_report_job_refuses_an_exit_status_that_is_no_number(stub_venv: Path, tmp_path: Path, value: str):
    proc, _ = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS=value)
    assert proc.returncode == 2 and "--pytest-exit-status must be a number" in proc.stderr


@pytest.mark.parametrize(
    "plant, message",
    [
        (lambda p: p.symlink_to(p.parent / "elsewhere", target_is_directory=True), "is a link (to "),
        (lambda p: os.mkfifo(p), "is a named pipe, not a results folder"),
        (lambda p: sparse_file(p, 3 * 2**30), "is a file of 3221225472 bytes, not a results folder"),
    ],
    ids=["link", "pipe", "huge-file"],
)
def test_the_report_job_refuses_a_run_folder_that_is_no_folder(stub_venv: Path, tmp_path: Path, plant, message):
    run = tmp_path / "results" / WORKFLOW_RUN_ID
    run.parent.mkdir()
    (tmp_path / "results" / "elsewhere").mkdir()
    plant(run)
    proc, job = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {run} {message}" in proc.stderr
    assert list((tmp_path / "results" / "elsewhere").iterdir()) == [], "written through the link"


def test_the_report_job_refuses_a_huge_records_file_and_fails(stub_venv: Path, tmp_path: Path):
    suite, _ = suite_job(stub_venv, tmp_path, jsonl(PASSED_CASE), stub_exit=0)
    assert suite.returncode == 0, suite.stdout + suite.stderr
    # One line of 3 GiB: read whole, it would take the report job's memory.
    sparse_file(tmp_path / "results" / WORKFLOW_RUN_ID / "verdicts-gw1.jsonl", 3 * 2**30)
    started = time.monotonic()
    proc, job = report_job(stub_venv, tmp_path, SPMD_PYTEST_EXIT_STATUS="0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verdicts-gw1.jsonl (3072 MiB, more than any file the harness writes (256 MiB); not read)" in proc.stderr
    assert "the run's records are incomplete, so it is not a pass" in proc.stdout
    assert "failed=1" in (job / "output").read_text().splitlines()
    assert time.monotonic() - started < 30


# --- case children as a user of their own (--case-user, --spmd-case-user) ------------------------

STUB_ID = """#!/bin/sh
# Stands in for id: `id -u` and `id -g` say STUB_UID; any user name is unknown.
if [ "$#" -eq 1 ] && [ "$1" = "-u" ] || [ "$1" = "-g" ]; then echo "$STUB_UID"; exit 0; fi
exit 1
"""
STUB_USERADD = """#!{python}
import json, os, sys
open(os.environ["STUB_USERADD_ARGV"], "w").write(json.dumps(sys.argv[1:]))
"""


def stub_bin(tmp_path: Path, uid: int) -> dict[str, str]:
    """id says uid; useradd records its arguments. The environment entries that put them first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "id", STUB_ID)
    executable(bin_dir / "useradd", STUB_USERADD.format(python=sys.executable))
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_UID": str(uid),
        "STUB_USERADD_ARGV": str(tmp_path / "useradd.json"),
    }


def pytest_argv(tmp_path: Path) -> list[str]:
    return json.loads((tmp_path / "argv.json").read_text())


def test_ci_script_passes_a_named_case_user_to_pytest(stub_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), SPMD_CASE_USER="nobody")
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--spmd-case-user=nobody" in pytest_argv(tmp_path)


def test_ci_script_as_root_runs_the_cases_as_a_user_it_creates(stub_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), **stub_bin(tmp_path, uid=0))
    proc = run_ci_script(
        stub_venv, env, "--skip-install", "--case-user", "auto", "--results-dir", str(tmp_path / "results")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--spmd-case-user=spmd-case" in pytest_argv(tmp_path)
    useradd = json.loads((tmp_path / "useradd.json").read_text())
    assert useradd[0] == "--system" and useradd[-1] == "spmd-case" and "/usr/sbin/nologin" in useradd


def test_ci_script_not_root_runs_the_cases_unisolated_and_says_so(stub_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), **stub_bin(tmp_path, uid=1001))
    proc = run_ci_script(
        stub_venv, env, "--skip-install", "--case-user", "auto", "--results-dir", str(tmp_path / "results")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [a for a in pytest_argv(tmp_path) if a.startswith("--spmd-case-user")]
    assert "ci-spmd: not root, so the cases run as this script's user (unisolated" in proc.stderr
    assert not (tmp_path / "useradd.json").exists()


@pytest.mark.parametrize("case_user, docker_user", [("auto", "0:0"), ("", None)], ids=["isolated", "unisolated"])
def test_ci_script_starts_the_image_as_root_only_for_a_case_user(
    stub_venv: Path, tmp_path: Path, case_user: str, docker_user: str | None
):
    bin_dir = tmp_path / "docker-bin"
    bin_dir.mkdir()
    executable(bin_dir / "docker", STUB_DOCKER.format(python=sys.executable))
    env = hermetic_env(
        tmp_path,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        STUB_DOCKER_ARGV=str(tmp_path / "docker.json"),
        SPMD_IMAGE=DEV_IMAGE,
        SPMD_CASE_USER=case_user,
    )
    proc = run_ci_script(stub_venv, env, "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads((tmp_path / "docker.json").read_text())
    options, inner = argv[: argv.index(DEV_IMAGE)], argv[argv.index(DEV_IMAGE) + 1 :]
    caller = f"{os.getuid()}:{os.getgid()}"
    assert options[options.index("--user") + 1] == (docker_user or caller)
    if case_user:
        assert inner[inner.index("--case-user") + 1] == "auto"
        assert f"SPMD_HOST_OWNER={caller}" in options, "the run's files are not given back to the caller"
    else:
        assert "--case-user" not in inner and not [o for o in options if "SPMD_HOST_OWNER" in o]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files to another uid")
def test_ci_script_in_an_image_started_as_root_gives_the_runs_files_back_to_the_caller(stub_venv: Path, tmp_path: Path):
    results = tmp_path / "results"
    env = hermetic_env(tmp_path, STUB_RECORDS=jsonl(PASSED_CASE), SPMD_HOST_OWNER="12345:23456")
    proc = run_ci_script(stub_venv, env, "--skip-install", "--results-dir", str(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [results, *results.rglob("*")]}
    assert owners == {(12345, 23456)}
    assert REPO.stat().st_uid != 12345, "the checkout is not the run's to give away"


def test_the_workflow_runs_the_cases_as_a_user_of_their_own_by_default():
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    inputs = triggers(workflow)["workflow_call"]["inputs"]
    assert inputs["case-user"] == {**inputs["case-user"], "type": "string", "default": "auto"}
    run = next(s for s in workflow["jobs"]["spmd"]["steps"] if s.get("name") == "Run the SPMD cases")
    assert run["env"]["SPMD_CASE_USER"] == "${{ inputs.case-user }}"


# --- scripts/nightly-multislice.sh, with a stub launcher -----------------------------------------

STUB_LAUNCHER_PYTHON = """#!{python}
# Stands in for the venv's python: pip succeeds, `-m harness.gke` records its arguments,
# writes a summary into --out and exits with STUB_EXIT.
import json, os, pathlib, sys
args = sys.argv[1:]
if args[:2] == ["-m", "harness.gke"]:
    pathlib.Path(os.environ["STUB_ARGV_FILE"]).write_text(json.dumps(args[2:]))
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("## multi-slice summary\\n")
    sys.exit(int(os.environ.get("STUB_EXIT", "0")))
"""


@pytest.fixture
def stub_launcher_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "launcher-venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "python", STUB_LAUNCHER_PYTHON.format(python=sys.executable))
    return venv


def run_nightly_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "nightly-multislice.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_nightly_script_defaults_to_two_v6e_slices(stub_launcher_venv: Path, tmp_path: Path):
    env = hermetic_env(tmp_path, VENV=str(stub_launcher_venv), IMAGE="img@sha256:abc", OUT=str(tmp_path / "out"))
    proc = run_nightly_script(env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == [
        "run",
        "--accelerator",
        "v6e",
        "--topology",
        "4x4",
        "--slices",
        "2",
        "--image",
        "img@sha256:abc",
        "--out",
        str(tmp_path / "out"),
        "--timeout",
        "7200",
        "--job-size",
        "small",
    ]


def test_nightly_script_passes_the_job_size_and_refuses_an_unknown_one_first(stub_launcher_venv: Path, tmp_path: Path):
    env = hermetic_env(
        tmp_path, VENV=str(stub_launcher_venv), IMAGE="img", OUT=str(tmp_path / "out"), JOB_SIZE="medium"
    )
    assert run_nightly_script(env).returncode == 0
    args = json.loads((tmp_path / "argv.json").read_text())
    assert args[args.index("--job-size") + 1] == "medium"
    (tmp_path / "argv.json").unlink()
    for size in ("huge; rm -rf /", "small "):
        proc = run_nightly_script({**env, "JOB_SIZE": size})
        assert proc.returncode == 2 and "JOB_SIZE must be tiny, small or medium" in proc.stderr
        assert not (tmp_path / "argv.json").exists()  # refused before the launcher (and an image build)
    # the sizes the script knows are the harness's
    from harness.config.options import JOB_SIZES

    assert f"^({'|'.join(JOB_SIZES)})$" in (REPO / "scripts" / "nightly-multislice.sh").read_text()


def test_nightly_script_fails_when_a_host_failed_and_still_publishes_the_summary(
    stub_launcher_venv: Path, tmp_path: Path
):
    step_summary = tmp_path / "step-summary.md"
    env = hermetic_env(
        tmp_path,
        VENV=str(stub_launcher_venv),
        IMAGE="img",
        ACCELERATOR="v4",
        STUB_EXIT="1",
        OUT=str(tmp_path / "out"),
        GITHUB_STEP_SUMMARY=str(step_summary),
    )
    proc = run_nightly_script(env)
    assert proc.returncode == 1
    assert "--topology" in (args := json.loads((tmp_path / "argv.json").read_text()))
    assert args[args.index("--topology") + 1] == "2x2x2"
    assert step_summary.read_text() == "## multi-slice summary\n"


def test_nightly_script_needs_an_image_or_a_repository_to_build_one(stub_launcher_venv: Path, tmp_path: Path):
    proc = run_nightly_script(hermetic_env(tmp_path, VENV=str(stub_launcher_venv)))
    assert proc.returncode == 2
    assert "WORKER_IMAGE_REPOSITORY" in proc.stderr


# --- the Python of the wheels (pytorch/xla builds cp312) -----------------------------------------


def wheel_folder(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return folder


@pytest.mark.parametrize(
    "names, version",
    [
        (
            (
                "torch-2.10.0a0+git1234-cp312-cp312-linux_x86_64.whl",
                "torch_xla-2.10.0+gitabc-cp312-cp312-linux_x86_64.whl",
            ),
            "3.12",
        ),
        (("torch_xla-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl", "some_pure-1.0-py3-none-any.whl"), "3.11"),
    ],
)
def test_the_python_of_the_wheels_is_read_from_their_tags(tmp_path: Path, names, version):
    from harness.wheeltags import python_of_wheels

    assert python_of_wheels(wheel_folder(tmp_path, *names)) == version


def test_mixed_or_missing_python_tags_are_refused(tmp_path: Path):
    from harness.errors import HarnessUsageError
    from harness.wheeltags import python_of_wheels

    mixed = wheel_folder(
        tmp_path, "torch-2.9.0-cp311-cp311-linux_x86_64.whl", "torch_xla-2.9.0-cp312-cp312-linux_x86_64.whl"
    )
    with pytest.raises(HarnessUsageError, match="different Pythons"):
        python_of_wheels(mixed)
    with pytest.raises(HarnessUsageError, match="no CPython-specific wheel"):
        python_of_wheels(tmp_path)


def test_ci_script_refuses_wheels_for_another_python_before_installing(stub_venv: Path, tmp_path: Path):
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    tag = "cp" + other.replace(".", "")
    wheels = wheel_folder(
        tmp_path,
        f"torch-2.10.0a0+git1-{tag}-{tag}-linux_x86_64.whl",
        f"torch_xla-2.10.0+git2-{tag}-{tag}-linux_x86_64.whl",
    )
    started = time.monotonic()
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path), "--wheels", str(wheels))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        f"are for Python {other}" in proc.stderr
        and f"this job's Python is {sys.version_info[0]}.{sys.version_info[1]}" in proc.stderr
    )
    assert time.monotonic() - started < 30


def test_the_workflow_sets_up_the_python_the_wheels_need():
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    inputs = triggers(workflow)["workflow_call"]["inputs"]
    assert inputs["python-version"]["default"] == "", "an empty default follows the wheels' cpXY tag"
    steps = workflow["jobs"]["spmd"]["steps"]
    names = [s.get("name", "") for s in steps]
    assert names.index("Download the torch_xla wheels") < names.index("Set up Python")
    setup = steps[names.index("Set up Python")]
    assert "steps.wheel-python.outputs.version" in setup["with"]["python-version"]


def test_ci_script_refuses_a_requested_python_it_does_not_have_before_installing(stub_venv: Path, tmp_path: Path):
    # In a container job the image's Python is used whatever python-version says: refuse, naming both.
    executable(stub_venv / "bin" / "python", STUB_PIP_PYTHON.format(python=sys.executable))
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.12" if have != "3.12" else "3.11"
    pip_log = tmp_path / "pip.jsonl"
    proc = run_ci_script(stub_venv, hermetic_env(tmp_path, SPMD_PYTHON_VERSION=other, STUB_PIP_LOG=str(pip_log)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"python-version is {other}, but this job's Python is {have}" in proc.stderr
    assert not pip_log.exists(), "it installed before refusing"


DEV_IMAGE = "us-central1-docker.pkg.dev/tpu-pytorch-releases/docker/development:3.12_tpuvm"
STUB_DOCKER = """#!{python}
# Stands in for docker: records its arguments and exits with STUB_DOCKER_EXIT.
import json, os, sys
open(os.environ["STUB_DOCKER_ARGV"], "w").write(json.dumps(sys.argv[1:]))
sys.exit(int(os.environ.get("STUB_DOCKER_EXIT", "0")))
"""


def test_ci_script_with_an_image_reruns_itself_inside_it_with_the_same_paths(stub_venv: Path, tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "docker", STUB_DOCKER.format(python=sys.executable))
    wheels, results, summary = tmp_path / "wheels", tmp_path / "results", tmp_path / "step-summary.md"
    output, registry = tmp_path / "github-output", tmp_path / "pr-known-bugs.toml"
    wheels.mkdir()
    summary.touch()
    output.touch()
    registry.write_text("")
    env = hermetic_env(
        tmp_path,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        STUB_DOCKER_ARGV=str(tmp_path / "docker.json"),
        STUB_DOCKER_EXIT="3",
        SPMD_IMAGE=DEV_IMAGE,
        GITHUB_ACTIONS="true",
        GITHUB_STEP_SUMMARY=str(summary),
        GITHUB_OUTPUT=str(output),
        SPMD_KNOWN_BUGS=str(registry),
    )
    proc = run_ci_script(stub_venv, env, "--wheels", str(wheels), "--results-dir", str(results), "--", "-k", "vit")
    assert proc.returncode == 3, "the container's exit status is the script's"
    argv = json.loads((tmp_path / "docker.json").read_text())
    assert argv[:4] == ["run", "--rm", "--shm-size", "16g"]
    image_at = argv.index(DEV_IMAGE)
    options, inner = argv[:image_at], argv[image_at + 1 :]
    for mount in (
        f"{REPO}:{REPO}",
        f"{wheels}:{wheels}:ro",
        f"{results}:{results}",
        f"{summary}:{summary}",
        f"{stub_venv}:{stub_venv}",
    ):
        assert mount in options, f"{mount} not mounted: {options}"
    assert {"GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "HOME=/tmp"} <= set(options)
    assert options[options.index("-w") + 1] == str(REPO)
    assert {"GITHUB_OUTPUT", f"{output}:{output}", f"{registry}:{registry}:ro"} <= set(options)
    assert inner[:2] == ["bash", "scripts/ci-spmd.sh"] and "--image" not in inner
    assert inner[inner.index("--known-bugs") + 1] == str(registry)
    assert inner[inner.index("--wheels") + 1] == str(wheels) and inner[inner.index("--venv") + 1] == str(stub_venv)
    assert inner[-3:] == ["--", "-k", "vit"]


def test_the_job_runs_in_pytorch_xlas_dev_image_unless_told_otherwise():
    """Where pytorch/xla tests its wheels (mkl, libgomp1, Python 3.12); an empty input means the runner."""
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    inputs = triggers(workflow)["workflow_call"]["inputs"]
    assert inputs["container"]["default"] == DEV_IMAGE and inputs["container"]["type"] == "string"
    steps = {s.get("name"): s for s in workflow["jobs"]["spmd"]["steps"]}
    # The script starts the image (docker run); setup-python and the wheel-tag lookup are for the bare
    # runner, and in the image the script checks the image's Python against the wheels.
    run = steps["Run the SPMD cases"]["env"]
    assert run["SPMD_IMAGE"] == "${{ inputs.container }}"
    assert run["SPMD_PYTHON_VERSION"] == "${{ inputs.python-version }}"
    assert "inputs.container == ''" in steps["Set up Python"]["if"]
    assert "inputs.container == ''" in steps["Python of the wheels"]["if"]


def test_the_callers_registry_reaches_the_script_from_the_callers_own_checkout():
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    inputs = triggers(workflow)["workflow_call"]["inputs"]
    assert inputs["known-bugs"] == {**inputs["known-bugs"], "type": "string", "default": ""}
    steps = {s.get("name"): s for s in workflow["jobs"]["spmd"]["steps"]}
    checkout = steps["Check out the caller's known-bug registry"]
    # No `repository:` and no `ref:`: in a called workflow those default to the caller's (the PR's) tree.
    assert checkout["if"] == "inputs.known-bugs != ''"
    assert not {"repository", "ref"} & set(checkout["with"])
    assert checkout["with"]["path"] == "caller" and checkout["with"]["sparse-checkout"] == "${{ inputs.known-bugs }}"
    assert "format('caller/{0}', inputs.known-bugs)" in steps["Run the SPMD cases"]["env"]["SPMD_KNOWN_BUGS"]


def test_the_workflows_outputs_are_the_counts_the_report_job_writes():
    from harness.report import Results, counts

    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    outputs = triggers(workflow)["workflow_call"]["outputs"]
    job = workflow["jobs"]["report"]
    report = next(s for s in job["steps"] if s.get("name") == "Report the results")
    written = set(counts(Results(records=[])))
    for name, spec in outputs.items():
        assert spec["value"] == f"${{{{ jobs.report.outputs.{name} }}}}", name
        if name == "results-artifact":
            assert job["outputs"][name] == "${{ inputs.results-artifact }}"
        else:
            assert job["outputs"][name] == f"${{{{ steps.{report['id']}.outputs.{name} }}}}", name
            assert name in written, f"harness.report does not write {name}"
    assert {"failed", "regressed", "xfailed", "results-artifact"} <= set(outputs)


# --- the report job: summary, annotations and outputs from a job that runs no code under test ----

HARNESS_CHECKOUT = {
    "repository": "${{ inputs.harness-repository || github.repository }}",
    "ref": "${{ inputs.harness-ref }}",
    "persist-credentials": False,
}
# The run folder's name, from the calling run's own context: no job's output decides what is read.
TRUSTED_RUN_ID = "run-gh${{ github.run_id }}-${{ github.run_attempt }}"


def test_the_suite_job_writes_no_summary_annotations_or_counts():
    """The job that runs the PR's build hands on pytest's exit status alone; the rest is the report job's."""
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    suite = workflow["jobs"]["spmd"]
    assert set(suite["outputs"]) == {"pytest-exit-status", "base-pytest-exit-status"}
    for name, spec in triggers(workflow)["workflow_call"]["outputs"].items():
        assert "jobs.spmd." not in spec["value"], f"the workflow's output {name} comes from the suite job"
    run = next(s for s in suite["steps"] if s.get("name") == "Run the SPMD cases")
    assert run["env"]["SPMD_REPORT_LATER"] == "true"
    assert run["env"]["SPMD_RUN_ID"] == TRUSTED_RUN_ID
    upload = next(s for s in suite["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["name"] == "${{ inputs.results-artifact }}" and upload["if"] == "always()"


def test_the_report_job_runs_no_code_under_test():
    """Fresh runner, no container, no wheels, nothing of the PR's tree: the harness's checkout and
    the results artifact, reported by the harness's own script."""
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    job = workflow["jobs"]["report"]
    assert job["needs"] == "spmd" and job["if"] == "always()"
    assert "container" not in job and "services" not in job
    uses = [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/download-artifact"]
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["name"] == "${{ inputs.results-artifact }}", "only the results are downloaded"
    # Outside the workspace, where the checkout is: nothing in the artifact can shadow a harness file.
    assert download["with"]["path"].startswith("${{ runner.temp }}/")
    text = yaml.safe_dump({key: value for key, value in job.items() if key != "name"})  # the name may say which build
    for untrusted in ("wheels-artifact", "known-bugs", "caller", "inputs.container"):
        assert untrusted not in text, f"the report job reaches {untrusted}"
    report = next(s for s in job["steps"] if s.get("name") == "Report the results")
    assert report["run"] == "bash scripts/ci-spmd-report.sh" and report["if"] == "always()"
    assert report["env"]["SPMD_RESULTS_DIR"] == download["with"]["path"]


def test_the_report_jobs_checkout_is_the_harness_pinned_ref_not_the_prs_head():
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    for job_id in ("spmd", "report"):
        checkouts = [s for s in workflow["jobs"][job_id]["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        harness = [s for s in checkouts if s.get("name") == "Check out the harness"]
        assert len(harness) == 1 and harness[0]["with"] == HARNESS_CHECKOUT, job_id
    report_checkouts = [
        s for s in workflow["jobs"]["report"]["steps"] if s.get("uses", "").startswith("actions/checkout@")
    ]
    # A checkout without repository and ref is the caller's event ref: the PR's head.
    assert len(report_checkouts) == 1


def test_both_jobs_name_the_run_folder_from_the_runs_own_context():
    workflow = load(WORKFLOWS_DIR / "spmd-regression.yml")
    report = next(s for s in workflow["jobs"]["report"]["steps"] if s.get("name") == "Report the results")
    assert report["env"]["SPMD_RUN_ID"] == TRUSTED_RUN_ID
    assert report["env"]["SPMD_PYTEST_EXIT_STATUS"] == "${{ needs.spmd.outputs.pytest-exit-status }}"
    assert report["env"]["SPMD_BASE_PYTEST_EXIT_STATUS"] == "${{ needs.spmd.outputs.base-pytest-exit-status }}"
    assert report["env"]["SPMD_SUITE_RESULT"] == "${{ needs.spmd.result }}"


def calling_snippets() -> dict[str, dict[str, Any]]:
    """The `with:` of the calling job in the workflow's header and in README, parsed as YAML."""
    header = "\n".join(
        line[2:] for line in (WORKFLOWS_DIR / "spmd-regression.yml").read_text().splitlines() if line.startswith("#   ")
    )
    readme = (REPO / "README.md").read_text()
    start = readme.index("  spmd-regression:\n", readme.index("## On every torch_xla PR"))
    snippets = {"workflow header": header, "README": readme[start:].split("```")[0]}
    return {where: yaml.safe_load(text)["spmd-regression"]["with"] for where, text in snippets.items()}


def test_the_calling_snippets_agree_with_the_workflows_inputs():
    """Copied as they are, the snippets must work: only inputs the workflow has, and the two agree."""
    inputs = triggers(load(WORKFLOWS_DIR / "spmd-regression.yml"))["workflow_call"]["inputs"]
    snippets = calling_snippets()
    for where, given in snippets.items():
        assert set(given) <= set(inputs), f"{where} names inputs the workflow lacks: {set(given) - set(inputs)}"
        assert given["wheels-artifact"] == "torch-xla-wheels", where
        # Empty: the Python follows the wheels' cpXY tag (on the runner) or is the image's (in the container).
        assert given.get("python-version", inputs["python-version"]["default"]) == "", where
        # Without the container input, the default is what pytorch/xla tests its wheels in.
        assert given.get("container", inputs["container"]["default"]) == DEV_IMAGE, where
    header, readme = snippets.values()
    shared = set(header) & set(readme)
    assert {k: header[k] for k in shared} == {k: readme[k] for k in shared}


# --- the image build context (the nightly builds from the repository root) ----------------------


# What google-github-actions/auth writes into the workspace, and what else must stay on the runner.
KEPT_OUT_OF_THE_IMAGE = [
    "gha-creds-0123abcd.json",
    "harness/gha-creds-x.json",
    ".venv/bin/python",
    ".venv-image/bin/python",
    "results/verdicts-main.jsonl",
    "harness/__pycache__/plugin.cpython-311.pyc",
    ".git/config",
]


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_credentials(tmp_path: Path):
    """The repository's files plus what a CI job leaves in the workspace, filtered by .dockerignore the
    way the Docker client does (docker-py's matcher): credentials never reach the build."""
    from docker.utils.build import exclude_paths  # the test extra; missing fails, never skips

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert tracked, "not a git checkout?"
    for relative in tracked + KEPT_OUT_OF_THE_IMAGE:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).touch()
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = exclude_paths(str(tmp_path), patterns, dockerfile="k8s/image/Dockerfile")
    assert not [p for p in context if "gha-creds" in p], "a credential file would be sent to the image build"
    for kept_out in KEPT_OUT_OF_THE_IMAGE:
        assert kept_out not in context, f"{kept_out} would be sent to the image build"
    dockerfile = (REPO / "k8s" / "image" / "Dockerfile").read_text()
    copied = [src for line in dockerfile.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]]
    assert copied, "the Dockerfile copies nothing?"
    for source in copied:
        assert source.rstrip("/") in context, f"{source} is COPY'd but left out of the build context"
    assert "gha-creds-*.json" in (REPO / ".gitignore").read_text().split()


@pytest.mark.parametrize(
    "name",
    [
        "torch_xla-2.9.0-cp312-linux_x86_64.whl",  # a tag missing
        "torch_xla-not.a.version-cp312-cp312-linux_x86_64.whl",  # the version is no PEP 440 version
        "torch_xla.whl",
    ],
)
def test_a_file_that_is_no_wheel_name_is_refused_by_name(tmp_path: Path, name: str):
    from harness.errors import HarnessUsageError
    from harness.wheeltags import python_of_wheels

    folder = wheel_folder(tmp_path, name)
    with pytest.raises(HarnessUsageError, match="is not a wheel filename"):
        python_of_wheels(folder)


def test_compressed_python_tags_are_read_as_a_set(tmp_path: Path):
    from harness.wheeltags import python_of_wheels

    folder = wheel_folder(
        tmp_path, "torch_xla-2.9.0-cp311.cp312-cp311.cp312-linux_x86_64.whl", "torch-2.9.0-cp312-cp312-linux_x86_64.whl"
    )
    assert python_of_wheels(folder) == "3.12"


def test_the_wheel_tags_are_read_without_packaging_as_on_the_bare_runner(tmp_path: Path):
    # The runner's system Python has pip but maybe not packaging: pip's vendored copy stands in.
    folder = wheel_folder(tmp_path, "torch_xla-2.9.0-cp312-cp312-linux_x86_64.whl")
    code = (
        "import sys; sys.modules['packaging'] = sys.modules['packaging.utils'] = None; "
        "from harness.wheeltags import main; sys.exit(main([sys.argv[1]]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, cwd=REPO)
    assert (proc.returncode, proc.stdout) == (0, "version=3.12\n"), proc.stderr
