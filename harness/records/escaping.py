"""The one path every text from a results folder takes to where a CI job shows it.

A record, a manifest, a comparison file and a file's name in a run folder can all be written by
the code under test, so harness.report never puts their text anywhere without one of these:

- `markdown_cell`: inside one Markdown line (a table cell, a bullet, a bold line): no HTML (a `<!--`
  would hide the rest of the summary), no line break, no pipe, backtick, star, bracket or
  underscore that restyles or splits the row; bounded in length.
- `markdown_name`: a name inside a code span (a family heading): word characters, `.` and `-` only.
- `command_data` / `command_property`: a GitHub workflow command's message and its `title=`:
  one line, `%` escaped first, `:` and `,` in properties; bounded in length.
- `output_line`: a `name=value` line of $GITHUB_OUTPUT: a plain name and a whole number, nothing else.
- `plain_line`: a line of the job's log (inert: one line, no `##[`).

Each starts with `utf8`: text UTF-8 cannot hold (a lone surrogate from a C++ error message,
decoded with surrogateescape, kept by JSON) is written as its backslash escape instead of
crashing the writer.
"""

from __future__ import annotations

import html
import re

# A cell, a problem line or an annotation longer than this is cut (head and tail kept): one record
# must not be able to fill the summary or the job's log on its own.
CELL_LIMIT = 2000
COMMAND_LIMIT = 4000
TITLE_LIMIT = 200
OUTPUT_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
# Control characters (an ANSI escape, a NUL) and what some readers take for a line break (\x1e,
# \x85, \u2028): written as their backslash escapes in a workflow command.
CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")


def utf8(text: object) -> str:
    """str(text), with every character UTF-8 cannot encode (a lone surrogate) as `\\udxxx`."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def shorten(text: str, limit: int) -> str:
    """Keep the head (the exception line) and the tail (the end of a log) of long text."""
    if len(text) <= limit:
        return text
    half = (limit - 20) // 2
    return f"{text[:half]} … [{len(text) - 2 * half} chars cut] … {text[-half:]}"


def markdown_cell(text: str | None, limit: int | None = None) -> str:
    """Make arbitrary text safe inside one Markdown table cell (or any one Markdown line)."""
    text = shorten(utf8(text or ""), min(limit or CELL_LIMIT, CELL_LIMIT))
    # `<lambda>` or `{devices=[4,1]<=[4]}` would otherwise be read as HTML, `<!--` hide the rest.
    text = html.escape(text, quote=False)
    # A pipe would split the cell; backticks, stars and brackets would restyle the text.
    text = re.sub(r"([\\`*_\[\]|])", r"\\\1", text)
    return "<br>".join(line for line in text.splitlines() if line.strip())


def markdown_name(name: str) -> str:
    """A name inside a code span (a family heading): anything but word characters, `.` and `-`
    (a backtick that would end the span, a newline) becomes `?`."""
    return re.sub(r"[^\w.-]", "?", shorten(utf8(name), TITLE_LIMIT))


def command_data(text: str, limit: int = COMMAND_LIMIT) -> str:
    """A workflow command's message, kept one command on one line."""
    text = CONTROLS.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), shorten(utf8(text), limit))
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace("##[", "#%23[")  # the runner reads `##[command]` wherever it sits in a line


def command_property(text: str) -> str:
    """Properties are `key=value` pairs separated by `,` and ended by `::`, so escape those too."""
    return command_data(text, TITLE_LIMIT).replace(":", "%3A").replace(",", "%2C")


def workflow_command(kind: str, message: str, title: str | None = None) -> str:
    properties = f" title={command_property(title)}" if title else ""
    return f"::{kind}{properties}::{command_data(message)}"


def output_line(name: str, value: int) -> str:
    """`name=value` for $GITHUB_OUTPUT. Only a plain name and a whole number: no value can carry a
    newline, a heredoc delimiter or a second output into the file."""
    if not OUTPUT_NAME.fullmatch(name) or not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"not an output line: {name!r}={value!r}")
    return f"{name}={value}\n"


def plain_line(text: str) -> str:
    """A line of the job's log that cannot command the runner (inert) and can be printed."""
    return inert(utf8(text))


def inert(text: str) -> str:
    """A line of plain output that cannot command the GitHub runner, whatever a record or a file
    name held: one line, and no `##[` (a command wherever it sits in a line; harness.report's own
    workflow commands are escaped by its workflow_command)."""
    return " ".join(text.splitlines()).replace("##[", "#%23[")
