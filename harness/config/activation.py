"""Whether a pytest run is the harness's business at all.

The plugin is a `pytest11` entry point: it is loaded by every pytest run of the venv it is
installed in, a foreign project's too. It stays inert (no process, no file, no line, no handler)
until the run selects an item marked `spmd`. Two moments decide:

- early, from the command line alone (`pytest_load_initial_conftests`): `-m` selects items marked
  spmd (the run asks for SPMD cases by name), or a path (or the ini's testpaths, or `.`) reaches a
  `cases/` folder of the rootdir whose test files mark SPMD cases. Then the fork servers start at once and torch_xla's import overlaps
  collection (docs/architecture.md, "The fork server"). A rootdir without such a folder (a foreign
  project) is never guessed at: `.` is the parent of a `cases/` that does not exist too.
- late, from what was collected: the first collected item marked spmd (when nothing can deselect
  it) or the selection at the end of collection.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest

CASES_DIR = "cases"
SPMD_MARKER = "spmd"
# How the plugin registers it (harness.plugin.MARKERS): any other declaration is the project's own.
SPMD_MARKER_LINE = "spmd: an SPMD regression case that runs torch_xla in a child process; the markers below are read on spmd items only"
# What an SPMD case file says to be one (a module's pytestmark or a decorator): read as text, cheap.
SPMD_MARK_TEXT = "mark.spmd"
# Options that let pytest (or a plugin) drop collected items before they run.
DESELECTING_OPTIONS = ("keyword", "markexpr", "deselect", "lf", "failedfirst", "last_failed_no_failures", "spmd_bug")


def is_spmd(item: pytest.Item) -> bool:
    return item.get_closest_marker(SPMD_MARKER) is not None and not project_owns_spmd_marker(item.config)


def project_owns_spmd_marker(config: pytest.Config) -> bool:
    """The project declares a `spmd` marker in its own ini: the name is its own (the harness's
    projects do not declare it, the plugin registers it), so its items are not SPMD cases and the
    plugin starts nothing, writes nothing and prints nothing for them."""
    try:
        lines = config.getini("markers")
    except (ValueError, KeyError):
        return False
    return any(
        str(line).split(":", 1)[0].split("(", 1)[0].strip() == SPMD_MARKER and str(line) != SPMD_MARKER_LINE
        for line in lines
    )


OWNED_MARKER_ERROR = (
    "this project declares its own 'spmd' marker (its ini's `markers`), so the spmd harness leaves "
    "items marked spmd alone; to run SPMD cases with the harness's `spmd` fixture, remove it from the "
    "ini's markers (the plugin registers the marker itself)"
)


def selects_spmd_early(options: argparse.Namespace, rootpath: Path, testpaths: Sequence[str]) -> bool:
    """Whether the command line alone says this run selects SPMD cases (a cheap, safe guess)."""
    if getattr(options, "help", False) or getattr(options, "version", False) or getattr(options, "collectonly", False):
        return False
    markexpr = getattr(options, "markexpr", "") or ""
    if markexpr:
        return marker_expression_selects_spmd(markexpr)  # asked for by name: the servers start now
    cases = (rootpath / CASES_DIR).resolve()
    if not holds_spmd_cases(cases):
        return False  # a rootdir without SPMD cases: whatever the paths, only collection can tell
    paths = list(getattr(options, "file_or_dir", None) or []) or list(testpaths) or ["."]
    for arg in paths:
        given = Path(arg.split("::", 1)[0])
        path = given if given.is_absolute() else (rootpath / given).resolve()
        if path == cases or cases in path.parents or path in cases.parents:
            return True
    return False


def holds_spmd_cases(folder: Path) -> bool:
    """A folder of SPMD cases: one of its test files marks items spmd."""
    try:
        files = sorted(folder.glob("test_*.py"))
    except OSError:
        return False
    for file in files:
        try:
            if SPMD_MARK_TEXT in file.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            continue
    return False


def marker_expression_selects_spmd(markexpr: str) -> bool:
    """True if the expression asks for SPMD cases: it selects an item marked `spmd` (and nothing
    else), and not an unmarked one (`-m "not slow"` selects everything: only collection can tell)."""
    return _expression_selects(markexpr, {SPMD_MARKER}) and not _expression_selects(markexpr, set())


def may_be_deselected(item: pytest.Item) -> bool:
    """Whether a collected item may still be deselected (then only the end of collection decides).
    `-m` alone cannot drop an item its expression selects (`-m spmd` and an spmd item)."""
    options = item.config.option
    if any(getattr(options, name, None) for name in DESELECTING_OPTIONS if name != "markexpr"):
        return True
    markexpr = getattr(options, "markexpr", "") or ""
    return bool(markexpr) and not _expression_selects(markexpr, {marker.name for marker in item.iter_markers()})


def _expression_selects(markexpr: str, names: set[str]) -> bool:
    try:
        from _pytest.mark.expression import Expression

        def has(name: str, /, **_: object) -> bool:
            return name in names

        return bool(Expression.compile(markexpr).evaluate(has))
    except Exception:  # a private API or a bad expression: pytest reports the latter later
        return False
