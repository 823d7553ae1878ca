"""What the harness's command-line tools share: plain-word usage errors, exit codes in --help,
--version, and old option spellings kept as hidden aliases.

argparse's own messages ("invalid int value: 'x'", "unrecognized arguments") speak of Python
rather than of what the user typed wrong; each tool's parser is a `PlainParser`, which says the
same in plain words and points at --help. Descriptions are shown as written
(RawDescriptionHelpFormatter), so the usage lines and the exit-code list are not reflowed into
one paragraph.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from harness.records import versions

EXIT_USAGE = 2

# argparse's messages (Python 3.10-3.13) and what they mean in plain words.
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "Path": "a path", "duration": "a duration"}
_REWRITES: tuple[tuple[re.Pattern[str], Any], ...] = (
    (
        re.compile(r"^the following arguments are required: (.*)$"),
        lambda m: f"missing {m[1]}: {'it is' if ',' not in m[1] else 'they are'} required",
    ),
    (re.compile(r"^unrecognized arguments: (.*)$"), lambda m: f"unknown argument(s): {m[1]}"),
    (
        re.compile(r"^argument (\S+): invalid choice: (.*?) \(choose from (.*)\)$"),
        lambda m: f"{m[1]}: {m[2]} is not one of {m[3]}",
    ),
    (
        re.compile(r"^argument (\S+): invalid (\w+) value: (.*)$"),
        lambda m: f"{m[1]}: {m[3]} is not {_TYPE_WORDS.get(m[2], 'a valid ' + m[2])}",
    ),
    (re.compile(r"^argument (\S+): expected one argument$"), lambda m: f"{m[1]} needs a value (write {m[1]} VALUE)"),
    (re.compile(r"^argument (\S+): (.*)$"), lambda m: f"{m[1]}: {m[2]}"),
)


def plain(message: str) -> str:
    """argparse's error message in plain words (unknown messages are passed on as they are)."""
    for pattern, rewrite in _REWRITES:
        match = pattern.match(message)
        if match:
            return rewrite(match)
    return message


class PlainParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are plain words, exit 2, and name --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # an abbreviation would stop working once a longer option is added
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {plain(message)} (see {self.prog} --help)\n")


def prog(module: str, script: str) -> str:
    """The name the user typed: the console script (`spmd-report`) or `python -m harness.report`."""
    return script if Path(sys.argv[0]).name == script else f"python -m {module}"


def version_text(tool: str) -> str:
    """`spmd-report 0.2.0; torch_xla 2.9.0, torch 2.9.0, jax 0.7.1`: the harness and what it tests."""
    return f"{tool} {versions.harness()} (spmd-regression-harness); {versions.describe(versions.stack())}"


def add_version(parser: argparse.ArgumentParser, tool: str) -> None:
    parser.add_argument(
        "--version",
        action="version",
        version=version_text(tool),
        help="print the harness version and the installed torch_xla, torch and jax, then exit",
    )


def add_hidden_alias(parser: argparse.ArgumentParser, old: str, dest: str, **kwargs: Any) -> None:
    """Accept an option's earlier spelling without listing it in --help.

    default=SUPPRESS: argparse fills in defaults action by action, so the alias must not bring a
    default of its own that could stand in for the documented option's.
    """
    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
