"""docs/architecture.md says what the code is: every module of harness/ in its map and nothing the
map names missing, every count of "The house today" measured again from the code, and no
function in harness/ over 60 lines (the project's rule) but the ones the document names."""

from __future__ import annotations

import ast
import collections
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.run.role import Role
from harness.run.session import JUDGE_ORDER
from tests.conftest import REPO

pytestmark = pytest.mark.selftest

DOC = REPO / "docs" / "architecture.md"
HARNESS = REPO / "harness"
MAX_FUNCTION_LINES = 60
# Folders the map describes as a whole (their own README or package docstring lists their files).
DESCRIBED_WHOLE = ("gke", "matrix", "oracles")
# The layering the module map states: a folder never imports one above it.
LAYERS = ["isolation", "records", "config", "judges", "run"]  # lowest first; plugin.py stands above all


def _section(title: str) -> str:
    text = DOC.read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _map_names() -> set[str]:
    """The paths the module map names (harness/... files and folders), read from its block."""
    block = _section("Module map").split("```", 2)[1]
    named: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        match = re.match(r"^( *)(\S.*)$", line)
        if not match or match[2].startswith("--"):
            continue
        depth = len(match[1]) // 2
        del folders[depth:]
        for token in match[2].replace(",", " ").split():
            if token.endswith("/"):
                folders.append(token)
                named.add("".join(folders))
            elif token.endswith(".py"):
                named.add("".join(folders) + token)
            else:
                break  # the description begins
    return named


def _modules() -> list[Path]:
    return sorted(p for p in HARNESS.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_module_map_names_every_module_and_nothing_else():
    named = _map_names()
    missing = [
        str(p.relative_to(REPO))
        for p in _modules()
        if p.name not in ("__init__.py", "__main__.py")
        and p.relative_to(HARNESS).parts[0] not in DESCRIBED_WHOLE
        and str(p.relative_to(REPO)) not in named
    ]
    assert missing == [], "modules the map in docs/architecture.md does not name"
    absent = sorted(name for name in named if name.startswith("harness/") and not (REPO / name).exists())
    assert absent == [], "the map names what is not there"


def long_functions() -> list[str]:
    """`path:function (lines)` for every function of harness/ longer than MAX_FUNCTION_LINES."""
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(REPO)}:{node.name} ({length})")
    return sorted(found)


def _imports() -> dict[str, set[str]]:
    """Module -> the harness modules it imports, at module level or in a function."""
    names = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p for p in _modules()}
    edges: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                if target in names and target != name and target != "harness":
                    edges[name].add(target)
                    break  # `from harness.judges import basecheck`: the module, not its package too
    return edges


def import_cycles() -> list[list[str]]:
    """Groups of harness modules that import each other in a loop (Tarjan's strongly connected
    components of more than one module)."""
    edges = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(cycles)


def imports_against_the_layers() -> list[str]:
    """`a -> b` where folder a of LAYERS imports folder b above it, or a folder imports plugin.py."""
    found = []
    for name, targets in _imports().items():
        parts = name.split(".")
        layer = LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else None
        for target in targets:
            tparts = target.split(".")
            above = tparts[1] in LAYERS[layer + 1 :] if layer is not None and len(tparts) > 2 else False
            if above or (target == "harness.plugin" and name != "harness.plugin"):
                found.append(f"{name} -> {target}")
    return sorted(found)


def judges_importing_a_judge() -> list[str]:
    """A judge's module (harness.judges.*check) importing another judge's module: data passing
    between judges outside the JudgedCase."""
    judge = re.compile(r"^harness\.judges\.\w+check$")
    return sorted(
        f"{name} -> {target}"
        for name, targets in _imports().items()
        if judge.match(name)
        for target in targets
        if judge.match(target)
    )


def classes_defined_twice() -> list[str]:
    """Public class names (no leading underscore) that two modules of harness/ define."""
    seen = collections.Counter(
        node.name
        for path in _modules()
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    )
    return sorted(name for name, count in seen.items() if count > 1)


# Each row of "The house today" and how it is measured; a row the test cannot measure fails it.
MEASURES: dict[str, Callable[[], int]] = {
    "modules at the top of `harness/` (`__init__.py` included)": lambda: len(list(HARNESS.glob("*.py"))),
    "folders by role under `harness/` (packages)": lambda: len(list(HARNESS.glob("*/__init__.py"))),
    "kinds of judge (`run/session.JUDGE_ORDER`)": lambda: len(JUDGE_ORDER),
    "process roles (`run/role.Role`)": lambda: len(Role),
    "judge modules that import another judge's module": lambda: len(judges_importing_a_judge()),
    "imports against the layers (`isolation/` < `records/` < `config/` < `judges/` < `run/` < `plugin.py`)": lambda: (
        len(imports_against_the_layers())
    ),
    "import cycles among the modules of `harness/` (function-level imports included)": lambda: len(import_cycles()),
    f"functions in `harness/` over {MAX_FUNCTION_LINES} lines": lambda: len(long_functions()),
    "public class names defined in two modules": lambda: len(classes_defined_twice()),
    "lines of `plugin.py`, at most": lambda: len((HARNESS / "plugin.py").read_text().splitlines()),
}


def _today() -> dict[str, str]:
    rows = {}
    for line in _section("The house today").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= {"-"} and cells[0] != "what":
            rows[cells[0]] = cells[1]
    return rows


def test_every_count_of_the_house_today_is_measured_from_the_code():
    rows = _today()
    assert sorted(rows) == sorted(MEASURES), "a row without a measure, or a measure without its row"
    wrong = []
    for what, shown in rows.items():
        measured = MEASURES[what]()
        claimed = int(re.split(r"\D", shown, maxsplit=1)[0])
        ok = measured <= claimed if what.endswith("at most") else measured == claimed
        if not ok:
            wrong.append(f"{what}: the document says {shown}, the code {measured}")
    assert wrong == []


def test_the_long_functions_and_the_import_cycles_the_document_names_are_the_ones_there_are():
    """The house today names each long function and each cycle: a new one fails here, and so does
    one that was split (the document then says so)."""
    text = _section("The house today")
    named_functions = sorted(re.findall(r"`(harness/[\w/]+\.py:\w+ \(\d+\))`", text))
    assert named_functions == long_functions()
    named_cycles = sorted(sorted(group.split(" <-> ")) for group in re.findall(r"`(harness\.[\w. <>-]+)`", text))
    assert named_cycles == import_cycles()


def test_the_measures_see_what_they_count(tmp_path, monkeypatch):
    """Each measure on a small tree with the fault it counts: a long function, a cycle, an import
    up the layers, a judge importing a judge."""
    tree = tmp_path / "harness"
    for folder in ("judges", "run", "isolation"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "judges" / "acheck.py").write_text("from harness.judges import bcheck\n")
    (tree / "judges" / "bcheck.py").write_text("def f():\n    from harness.judges import acheck\n")
    (tree / "isolation" / "low.py").write_text("import harness.run.high\n")
    (tree / "run" / "high.py").write_text("def g():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    monkeypatch.setattr(sys.modules[__name__], "HARNESS", tree)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert long_functions() == [f"harness/run/high.py:g ({MAX_FUNCTION_LINES + 1})"]
    assert import_cycles() == [["harness.judges.acheck", "harness.judges.bcheck"]]
    assert imports_against_the_layers() == ["harness.isolation.low -> harness.run.high"]
    assert judges_importing_a_judge() == [
        "harness.judges.acheck -> harness.judges.bcheck",
        "harness.judges.bcheck -> harness.judges.acheck",
    ]
