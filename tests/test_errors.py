"""The error tree drawn in harness/errors.py's docstring is the one the code defines, and every
case error names its outcome."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

import harness.errors
from harness.errors import CaseCrashed, CaseError, CaseFailed, CaseProtocolError, CaseTimedOut, HarnessError
from tests.conftest import REPO

pytestmark = pytest.mark.selftest

IN_CHILDREN_ONLY = {"harness.xla", "harness.isolation.child.main"}
_BRANCH = re.compile(r"^(?P<indent>(?:│   |    )*)(?:├── |└── )?(?P<name>[A-Za-z]+)\b")


def _drawn_tree() -> dict[str, str | None]:
    """name -> parent name, read from the drawing in harness.errors' docstring."""
    doc = harness.errors.__doc__ or ""
    lines = doc.split("    HarnessError\n", 1)[1].split("\n\n", 1)[0].splitlines()
    parents: dict[str, str | None] = {"HarnessError": None}
    stack = ["HarnessError"]  # stack[d] is the last name drawn at depth d
    for line in lines:
        match = _BRANCH.match(line.removeprefix("    "))
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match["indent"]) // 4 + 1
        del stack[depth:]
        parents[match["name"]] = stack[depth - 1]
        stack.append(match["name"])
    return parents


def _harness_errors() -> dict[str, type]:
    """Every HarnessError subclass the harness defines, by name (every module imported first)."""
    names = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in (REPO / "harness").rglob("*.py")]
    for name in sorted({n.removesuffix(".__init__") for n in names} - IN_CHILDREN_ONLY):
        importlib.import_module(name)
    found: dict[str, type] = {}
    todo = [HarnessError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("harness"):
            assert found.setdefault(cls.__name__, cls) is cls, f"two error classes named {cls.__name__}"
        todo.extend(cls.__subclasses__())
    return found


def test_the_drawn_error_tree_is_the_class_tree():
    drawn = _drawn_tree()
    defined = _harness_errors()
    assert sorted(set(defined) - set(drawn)) == [], "defined but not drawn in harness/errors.py"
    assert sorted(set(drawn) - set(defined)) == [], "drawn but not defined"
    wrong = [
        f"{name} under {parent}"
        for name, parent in drawn.items()
        if parent is not None and name in defined and defined[parent] not in defined[name].__bases__
    ]
    assert wrong == [], "drawn under a class that is not its base"


@pytest.mark.parametrize(
    "error, outcome",
    [
        (CaseError, "error"),
        (CaseFailed, "error"),
        (CaseCrashed, "crashed"),
        (CaseTimedOut, "timeout"),
        (CaseProtocolError, "protocol"),
    ],
)
def test_each_case_error_carries_its_outcome(error, outcome):
    assert error("x", evidence="e").outcome == outcome


def _exception_classes_outside_the_tree() -> list[str]:
    """Classes in harness/ whose bases name a built-in exception and no harness error: read from
    the source (the child-only modules cannot be imported here). A private class (a leading
    underscore) is control flow inside its module and never raised out of it."""
    import ast
    import builtins

    built_in = {
        name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
    }
    tree_names = set(_drawn_tree())
    outside = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_") or node.name == "HarnessError":
                continue
            bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
            if bases & built_in and not bases & tree_names:
                outside.append(f"{path.relative_to(REPO)}: {node.name}({', '.join(sorted(bases))})")
    return outside


def test_every_error_the_harness_defines_is_a_harness_error():
    """One error tree (a caller catches HarnessError for anything the harness raised on purpose); an
    OS-level or parse error may also be an OSError or a ValueError."""
    assert _exception_classes_outside_the_tree() == []


def test_every_exception_class_an_importable_module_defines_is_a_harness_error():
    """The same rule, from the classes themselves: every module of harness/ the pytest process can
    import (all but the child-only ones, which the source reading above covers), every public
    exception class it defines, whatever it derives from (`json.JSONDecodeError`, a class of
    another harness module), is a HarnessError."""
    _harness_errors()  # imports every module
    outside = [
        f"{module.__name__}.{name}({', '.join(base.__name__ for base in value.__bases__)})"
        for module in list(sys.modules.values())
        if module is not None and module.__name__.split(".")[0] == "harness"
        for name, value in vars(module).items()
        if isinstance(value, type)
        and value.__module__ == module.__name__
        and issubclass(value, BaseException)
        and not name.startswith("_")
        and not issubclass(value, HarnessError)
    ]
    assert sorted(outside) == []
