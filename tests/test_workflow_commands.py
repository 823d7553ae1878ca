"""Output of the code under test must not command the GitHub runner.

The runner reads every line a step prints, stdout and stderr alike, and executes what looks like a
workflow command. A case whose exception message holds `##[stop-commands]X` would silence every
`::error` the harness prints after it; a bare `::error::` line would add a fake annotation. The
scripts are run for real (bash, a stub pytest or launcher printing such lines, the real
harness.report), and their output goes through `Runner`, a model of the runner's rules:

  - `::NAME[ PROPERTIES]::DATA` is a command when the line starts with it (leading blanks
    ignored); `##[NAME[ PROPERTIES]]DATA` is one wherever it sits in the line;
  - NAME must be a known command, compared without regard to case;
  - `stop-commands` with DATA=TOKEN stops all processing until a command named TOKEN appears.

The runner reads stdout and stderr on separate pipes, so nothing orders lines of one against the
other: every check feeds the model both ways round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records.results import CaseRecord
from tests.conftest import REPO, spmd_report

pytestmark = pytest.mark.selftest

KNOWN_COMMANDS = {
    "error",
    "warning",
    "notice",
    "debug",
    "group",
    "endgroup",
    "add-mask",
    "add-matcher",
    "remove-matcher",
    "echo",
    "save-state",
    "set-output",
    "set-env",
    "add-path",
    "stop-commands",
}
INJECTED = [
    "::error title=injected::from pytest stdout",
    "E   RuntimeError: tensor spec ##[stop-commands]evil-token (from a case's exception message)",
    "::error title=injected::after the stop-commands injection",
]
INJECTED_STDERR = ["::error title=injected::from pytest stderr", "  ::stop-commands::evil-token-2"]


@dataclasses.dataclass
class Command:
    name: str
    properties: str
    data: str


@dataclasses.dataclass
class Runner:
    executed: list[Command] = dataclasses.field(default_factory=list)
    stop_token: str | None = None

    def feed(self, text: str) -> Runner:
        for line in text.splitlines():
            self._line(line)
        return self

    def _line(self, line: str) -> None:
        command = self._parse(line)
        if command is None:
            return
        if self.stop_token is not None:
            if command.name.lower() == self.stop_token.lower():
                self.stop_token = None
            return
        if command.name.lower() == "stop-commands":
            self.stop_token = command.data
        else:
            self.executed.append(command)

    def _known(self, name: str) -> bool:
        return name.lower() in KNOWN_COMMANDS or (
            self.stop_token is not None and name.lower() == self.stop_token.lower()
        )

    def _parse(self, line: str) -> Command | None:
        stripped = line.lstrip()
        if stripped.startswith("::") and (end := stripped.find("::", 2)) >= 0:
            name, _, properties = stripped[2:end].partition(" ")
            if self._known(name):
                return Command(name, properties, stripped[end + 2 :])
        if (start := line.find("##[")) >= 0 and (close := line.find("]", start)) >= 0:
            name, _, properties = line[start + 3 : close].partition(" ")
            if self._known(name):
                return Command(name, properties, line[close + 1 :])
        return None


def test_the_model_follows_the_runners_rules():
    # The gap these tests close, shown on the model: an injected stop silences a later ::error.
    runner = Runner().feed("x ##[stop-commands]t1\n::error::lost\n::T1::\n  ::error title=a%3Ab::kept\n")
    assert [(c.name, c.properties, c.data) for c in runner.executed] == [("error", "title=a%3Ab", "kept")]
    assert Runner().feed("::not-a-command::x\n::stop-commands::t\n").stop_token == "t"


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def both_orders(proc: subprocess.CompletedProcess[str]) -> list[Runner]:
    return [Runner().feed(proc.stdout + proc.stderr), Runner().feed(proc.stderr + proc.stdout)]


def hermetic_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "SPMD_", "STUB_"))}
    return {**env, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md"), **extra}


# --- scripts/ci-spmd.sh ---------------------------------------------------------------------------

STUB_PYTEST = """#!{python}
# Stands in for the venv's pytest: prints what a hostile case could print, writes one failed case
# into a run folder as the plugin does.
import json, os, pathlib, sys
from harness.records.runfolder import RunFolder
results = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--spmd-results-dir=")))
print({stdout!r}, flush=True)
print({stderr!r}, file=sys.stderr, flush=True)
run = RunFolder.new(results, next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--spmd-run-id=")), None))
(run.claim() / "verdicts-gw0.jsonl").write_text(os.environ["STUB_RECORDS"])
run.finish(1, {{}}, [json.loads(line)["nodeid"] for line in os.environ["STUB_RECORDS"].splitlines()], None)
sys.exit(1)
"""
FAILED_CASE = CaseRecord(
    nodeid="cases/test_scalar_specs.py::test_wrap[off]",
    family="scalar_specs",
    outcome="failed",
    reason="spec lost",
    evidence="'' != '{replicated}'",
)
HARNESS_ERROR = ("error", "title=SPMD regression%3A cases/test_scalar_specs.py%3A%3Atest_wrap[off]", "spec lost")


def run_ci_script(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    executable(
        venv / "bin" / "pytest",
        STUB_PYTEST.format(python=sys.executable, stdout="\n".join(INJECTED), stderr="\n".join(INJECTED_STDERR)),
    )
    executable(venv / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    env = hermetic_env(tmp_path, STUB_RECORDS=FAILED_CASE.to_json() + "\n")
    return subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "ci-spmd.sh"),
            "--venv",
            str(venv),
            "--skip-install",
            "--results",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_ci_script_output_of_pytest_cannot_command_the_runner(tmp_path: Path):
    proc = run_ci_script(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "from pytest stdout" in proc.stdout + proc.stderr, "the stub's lines must still be in the log"
    for runner in both_orders(proc):
        # The annotation's first line (%0A is an escaped newline; the evidence follows it).
        executed = [(c.name, c.properties, c.data.split("%0A")[0]) for c in runner.executed]
        assert executed == [HARNESS_ERROR], "\n".join(map(str, executed))
        assert runner.stop_token is None, "commands are still stopped after the script"


def test_ci_script_stop_token_is_fresh_and_long(tmp_path: Path):
    tokens = []
    for attempt in ("a", "b"):
        proc = run_ci_script(tmp_path / attempt)
        tokens += re.findall(r"^::stop-commands::(\S+)$", proc.stdout, flags=re.M)
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    assert all(re.fullmatch(r"[0-9a-f]{32,}", token) for token in tokens), tokens


# --- scripts/nightly-multislice.sh ----------------------------------------------------------------

STUB_LAUNCHER = """#!{python}
# Stands in for the venv's python: pip succeeds; `-m harness.gke` prints pod-supplied text and fails.
import pathlib, sys
args = sys.argv[1:]
if args[:2] == ["-m", "harness.gke"]:
    print({stdout!r}, flush=True)
    print({stderr!r}, file=sys.stderr, flush=True)
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("## multi-slice summary\\n")
    sys.exit(1)
"""


def test_nightly_script_launcher_output_cannot_command_the_runner(tmp_path: Path):
    venv = tmp_path / "launcher-venv"
    (venv / "bin").mkdir(parents=True)
    executable(
        venv / "bin" / "python",
        STUB_LAUNCHER.format(python=sys.executable, stdout="\n".join(INJECTED), stderr="\n".join(INJECTED_STDERR)),
    )
    env = hermetic_env(tmp_path, VENV=str(venv), IMAGE="img:1", OUT=str(tmp_path / "out"))
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "nightly-multislice.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "from pytest stdout" in proc.stdout + proc.stderr
    for runner in both_orders(proc):
        assert runner.executed == [] and runner.stop_token is None, runner


# --- harness.report on a results folder the code under test wrote into ---------------------------


def test_report_output_cannot_be_turned_into_commands_by_what_a_case_wrote(tmp_path: Path):
    """A body can write any file in its run folder: a verdicts file whose *name* holds a stop, a
    record whose outcome or reason does. The report's own lines (warnings, totals) stay inert, and
    its ::error for the real failure is executed."""
    run = tmp_path / "run-20261124-000000-p1"
    run.mkdir()
    hostile = CaseRecord(
        nodeid="cases/test_x.py::test_hostile",
        family="x",
        outcome="odd ##[stop-commands]evil-outcome",
        reason="why\n::error title=injected::from a record's reason ##[stop-commands]evil-reason",
    )
    (run / "verdicts-gw0.jsonl").write_text(FAILED_CASE.to_json() + "\n" + hostile.to_json() + "\n")
    (run / "verdicts-x##[stop-commands]evil-name.jsonl").write_text("not a record\n")
    proc = spmd_report(str(run), "--annotate", env=hermetic_env(tmp_path))
    for runner in both_orders(proc):
        assert runner.stop_token is None, proc.stdout + proc.stderr
        executed = [(c.name, c.properties, c.data.split("%0A")[0]) for c in runner.executed]
        assert HARNESS_ERROR in executed, proc.stdout + proc.stderr
        assert not [c for c in runner.executed if "injected" in c.properties], executed


FORGES_STEP_FILES = """#!{python}
# Stands in for the venv's pytest whose case writes the step's files, found without the GITHUB_*
# variables (the script unsets them; a body could list the runner's file-commands folder).
import json, os, pathlib, sys
from harness.records.runfolder import RunFolder
args = sys.argv[1:]
results = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--spmd-results-dir=")))
seen = [name for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_STEP_SUMMARY") if name in os.environ]
paths = json.loads(os.environ["STUB_STEP_FILES"])
with open(paths["GITHUB_OUTPUT"], "a") as fh:  # failed=0 now, and the report's own lines swallowed
    fh.write("failed=0\\nswallowed<<skipped=0\\n")
with open(paths["GITHUB_ENV"], "a") as fh:
    fh.write("LD_PRELOAD=/tmp/evil.so\\n")
os.unlink(paths["GITHUB_STEP_SUMMARY"])
os.symlink(os.environ["STUB_VICTIM"], paths["GITHUB_STEP_SUMMARY"])
run = RunFolder.new(results, *[a.split("=", 1)[1] for a in args if a.startswith("--spmd-run-id=")])
(run.claim() / "verdicts-gw0.jsonl").write_text(os.environ["STUB_RECORDS"])
run.finish(1, {{"failed": 1}}, [json.loads(os.environ["STUB_RECORDS"])["nodeid"]], None)
print("variables seen:", seen, flush=True)
sys.exit(1)
"""


def test_ci_script_keeps_the_step_files_as_they_were_whatever_the_run_wrote(tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "pytest", FORGES_STEP_FILES.format(python=sys.executable))
    executable(venv / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    files = {name: tmp_path / name.lower() for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_STEP_SUMMARY")}
    for name, path in files.items():
        path.write_text(f"# {name} before the step\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    env = hermetic_env(
        tmp_path,
        **{name: str(path) for name, path in files.items()},
        STUB_STEP_FILES=json.dumps({name: str(path) for name, path in files.items()}),
        STUB_VICTIM=str(victim),
        STUB_RECORDS=FAILED_CASE.to_json(),
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "ci-spmd.sh"), "--venv", str(venv), "--skip-install"]
        + ["--results-dir", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "variables seen: []" in proc.stdout
    output = files["GITHUB_OUTPUT"].read_text()
    assert output.startswith("# GITHUB_OUTPUT before the step\ncases=1\nfailed=1\n"), output
    assert "swallowed" not in output and "failed=0" not in output.splitlines()
    assert files["GITHUB_ENV"].read_text() == "# GITHUB_ENV before the step\n"
    assert victim.read_text() == "the user's file"
    assert not files["GITHUB_STEP_SUMMARY"].is_symlink()
    assert files["GITHUB_STEP_SUMMARY"].read_text().startswith("# GITHUB_STEP_SUMMARY before the step\n## SPMD")
