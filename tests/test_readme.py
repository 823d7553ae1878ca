"""README.md opens with the two commands users copy; .ci/run must run the same test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.selftest

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md must open with a ```bash block holding the two commands"
    assert text.index("```bash") < text.index("\n## ") if "\n## " in text else True, "the commands come first"
    return [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert commands[0].endswith("pytest -m spmd"), "the first command runs the main job"
    assert "--test" in commands[1], "the second command sets up the test tools and runs everything"


def test_ci_runs_the_readme_whole_suite_command():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_commands()[1] in ci, ".ci/run must call README's whole-suite command verbatim"
