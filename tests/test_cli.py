"""The command-line tools, as a user meets them: the installed names, --version, --help with the
exit codes, usage errors in plain words, and the old option spellings that still work."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from tests.conftest import REPO

pytestmark = pytest.mark.selftest

# console script -> the module `python -m` runs
TOOLS = {
    "spmd-report": "harness.report",
    "spmd-matrix": "harness.matrix",
    "spmd-gke": "harness.gke",
    "spmd-replay": "harness.replay",
}


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_each_tool_is_installed_under_its_name():
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(TOOLS)
    for script, target in scripts.items():
        module_name, function = target.split(":")
        assert module_name.removesuffix(".__main__") == TOOLS[script]
        assert callable(getattr(importlib.import_module(module_name), function))


@pytest.mark.parametrize("script, module", TOOLS.items())
def test_version_names_the_harness_and_what_it_tests(script: str, module: str):
    proc = run_module(module, "--version")
    assert proc.returncode == 0, proc.stderr
    harness_version = importlib.metadata.version("spmd-regression-harness")
    assert proc.stdout.startswith(f"{script} {harness_version} (spmd-regression-harness); ")
    torch_xla = _installed("torch_xla")
    assert (f"torch_xla {torch_xla}" if torch_xla else "no torch_xla installed") in proc.stdout


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize(
    "args",
    [
        ["harness.report"],
        ["harness.matrix"],
        ["harness.matrix", "compare"],
        ["harness.gke"],
        ["harness.gke", "run"],
        ["harness.gke", "worker"],
        ["harness.replay"],
    ],
    ids=" ".join,
)
def test_help_lists_the_exit_codes_as_written(args: list[str]):
    proc = run_module(*args, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Exit codes:" in proc.stdout
    # Shown as written, not reflowed into one paragraph: the code list starts a line of its own.
    assert "\nExit codes: 0 " in proc.stdout


def test_the_matrix_help_shows_compare():
    out = run_module("harness.matrix", "--help").stdout
    assert "python -m harness.matrix compare --good DIR --bad DIR" in out and "compare --help" in out


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["harness.gke", "run", "--accelerator", "v4", "--topology", "2x2x2", "--slices", "two"],
            "--slices: 'two' is not a whole number (see python -m harness.gke run --help)",
        ),
        (["harness.gke", "launch"], "COMMAND: 'launch' is not one of 'run', 'worker'"),
        (["harness.gke", "run", "--topology", "2x2x2"], "missing --accelerator: it is required"),
        (
            ["harness.report", "results", "--anotate"],
            "unknown argument(s): --anotate (see python -m harness.report --help)",
        ),
        (["harness.matrix", "compare", "--good"], "--good needs a value"),
        (["harness.replay", "--case"], "--case needs a value"),
    ],
)
def test_usage_errors_are_plain_words_and_exit_2(args: list[str], said: str):
    proc = run_module(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr
    assert "invalid" not in proc.stderr and "unrecognized" not in proc.stderr


@pytest.mark.parametrize(
    "message, plain",
    [
        ("argument --slices: invalid int value: 'x'", "--slices: 'x' is not a whole number"),
        (
            "argument --backend: invalid choice: 'gpu' (choose from 'tpu', 'cpu')",
            "--backend: 'gpu' is not one of 'tpu', 'cpu'",
        ),
        ("the following arguments are required: --good, --bad", "missing --good, --bad: they are required"),
        ("argument --good: expected one argument", "--good needs a value (write --good VALUE)"),
        ("something argparse may say one day", "something argparse may say one day"),
    ],
)
def test_argparse_messages_in_plain_words(message: str, plain: str):
    assert cli.plain(message) == plain


def test_the_matrix_takes_results_dir_and_still_its_old_out(tmp_path: Path):
    from harness.matrix.__main__ import compare_parser, run_parser

    for parser in (run_parser(), compare_parser()):
        extra = ["--good", "g", "--bad", "b"] if "compare" in parser.prog else []
        assert parser.parse_args([*extra, "--results-dir", "new"]).out == Path("new")
        assert parser.parse_args([*extra, "--out", "old"]).out == Path("old")
        assert parser.parse_args(extra).out == Path("matrix-out")
        assert "--out" not in parser.format_help()


def test_the_gke_launcher_takes_results_dir_and_still_its_old_out():
    from harness.gke.__main__ import build_parser

    base = ["run", "--accelerator", "v4", "--topology", "2x2x2"]
    assert build_parser().parse_args([*base, "--results-dir", "new"]).out == Path("new")
    assert build_parser().parse_args([*base, "--out", "old"]).out == Path("old")
    assert build_parser().parse_args(base).out is None
    assert "--out" not in run_module("harness.gke", "run", "--help").stdout


def test_replay_takes_pytests_spelling_of_the_results_folder(tmp_path: Path):
    proc = run_module("harness.replay", f"--spmd-results-dir={tmp_path}")
    assert proc.returncode == 2 and f"no journalled requests in {tmp_path}" in proc.stderr


def test_the_matrix_table_names_no_local_folder():
    from harness.matrix.__main__ import shown_arguments

    argv = [
        "--releases",
        "2.8.0,2.9.0",
        "--env",
        "2.9.0=/home/me/.venv",
        "--out",
        "/tmp/mx",
        "--cache=/scratch",
        "--table",
        "docs/release-matrix.md",
        "--",
        "--results-dir",
        "kept",
    ]
    assert shown_arguments(argv) == [
        "--releases",
        "2.8.0,2.9.0",
        "--env",
        "2.9.0=VENV",
        "--table",
        "docs/release-matrix.md",
        "--",
        "--results-dir",
        "kept",
    ]


def test_the_tools_default_output_folders_are_ignored_by_git():
    from harness.gke.__main__ import DEFAULT_RESULTS_DIR as GKE
    from harness.matrix.__main__ import DEFAULT_RESULTS_DIR as MATRIX

    ignored = (REPO / ".gitignore").read_text().split()
    assert f"/{GKE}/" in ignored and f"/{MATRIX}/" in ignored


def test_the_release_is_described_licensed_and_classified():
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    version = project["version"]
    assert f"## {version}" in (REPO / "CHANGELOG.md").read_text(), "the changelog lacks this version"
    assert "Framework :: Pytest" in project["classifiers"]
    assert project["license"] == "Apache-2.0" and (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    # The same OWNER placeholder as README's workflow snippet, so one search-and-replace fixes both.
    for url in project["urls"].values():
        assert url.startswith("https://github.com/OWNER/spmd-regression-harness"), url


@pytest.mark.parametrize("text, seconds", [("60", 60.0), ("0.5", 0.5), ("90s", 90.0), ("90m", 5400.0), ("3h", 10800.0)])
def test_every_timeout_reads_seconds_or_a_unit(text, seconds):
    """pytest's --spmd-case-timeout, the matrix's --suite-timeout and the GKE launcher's --timeout
    share one parser, so a duration written for one tool means the same in the others."""
    from harness.config import argtypes
    from harness.gke.__main__ import duration

    assert argtypes.positive_seconds(text) == duration(text) == seconds


@pytest.mark.parametrize("text", ["nan", "inf", "0", "-5m", "5x", "m"])
def test_no_timeout_accepts_a_duration_that_never_or_always_fires(text):
    from harness.config import argtypes
    from harness.errors import NotAPositiveNumber

    with pytest.raises(NotAPositiveNumber, match="is not a positive, finite number of seconds"):
        argtypes.positive_seconds(text)


def test_the_matrix_calls_xdist_workers_workers_as_ci_spmd_does():
    from harness.matrix.__main__ import compare_parser, run_parser

    assert run_parser().parse_args(["--releases", "2.9.0", "--workers", "2"]).jobs_per_env == 2
    assert compare_parser().parse_args(["--good", "a", "--bad", "b", "--workers", "2"]).jobs_per_env == 2


def _run_with_requests(base: Path, run_id: str, cases: list[str]) -> Path:
    run = base / run_id
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": run_id}))
    lines = [json.dumps({"request": {"case": case}, "spec": {}, "fresh": False}) for case in cases]
    (run / "requests-main.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_replay_of_a_case_the_newest_run_lacks_names_that_run_and_the_one_that_has_it(tmp_path: Path):
    older = _run_with_requests(tmp_path, "run-20261124-000001-p1", ["cases/test_a.py::test_wanted"])
    newest = _run_with_requests(tmp_path, "run-20261124-000002-p2", ["cases/test_b.py::test_other"])
    (tmp_path / "latest").symlink_to(newest.name)
    proc = run_module("harness.replay", "--results-dir", str(tmp_path), "--case", "test_wanted", "--print-commands")
    assert proc.returncode == 2
    assert f"run {newest} has no case matching 'test_wanted' (it ran cases/test_b.py::test_other)" in proc.stderr
    assert f"it is in {older}: pick one with --results-dir RUN" in proc.stderr
    assert "run pytest with" not in proc.stderr  # the old hint: the run exists, it lacks the case


def test_every_option_of_spmd_gke_run_says_what_it_does():
    text = run_module("harness.gke", "run", "--help").stdout
    assert "--namespace NS Kubernetes namespace the JobSet runs in" in " ".join(text.split())


def test_the_matrix_help_speaks_of_no_particular_machine():
    text = " ".join(run_module("harness.matrix", "--help").stdout.split())
    assert "pytest-xdist workers inside each suite run" in text and "machines here" not in text


def test_every_noqa_names_a_rule_ruff_checks():
    """A `# noqa: CODE` for a rule family ruff does not select claims a check that never runs."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    selected = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["select"]
    offenders = []
    for path in sorted(REPO.glob("**/*.py")):
        if ".venv" in path.parts or path.relative_to(REPO).parts[0] not in ("harness", "cases", "tests", "scripts"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for codes in re.findall(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)", line):
                offenders += [
                    f"{path.relative_to(REPO)}:{number} {code.strip()}"
                    for code in codes.split(",")
                    if not any(code.strip().startswith(family) for family in selected)
                ]
    assert offenders == []
