"""Issue 51, item 4: what the run reads after its start is what it read at its start (fake backend,
black-box runs, written as a hostile pull request would): a `.pyc` planted in the harness's
`__pycache__` with its source's stamp, a later case's module rewritten, a conftest rewritten.
Each one fails the run naming the file, or is refused where it would be used.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_fake

pytestmark = pytest.mark.selftest

PLANTS_BYTECODE = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_plants(ctx):
    import importlib._bootstrap_external as bootstrap
    import importlib.util, pathlib
    import harness.isolation.child.main as child
    source = pathlib.Path(child.__file__)
    old = "        body(ctx, **request.kwargs)\\n"
    new = "        try:\\n            body(ctx, **request.kwargs)\\n        except Exception:\\n            pass\\n"
    forged = compile(source.read_text().replace(old, new, 1), str(source), "exec")
    stat = source.stat()  # stamped like its source: Python takes it without reading the source
    data = bootstrap._code_to_timestamp_pyc(forged, stat.st_mtime, stat.st_size)
    pathlib.Path(importlib.util.cache_from_source(str(source))).write_bytes(data)

def body_fails(ctx):
    raise AssertionError("the real failure")

def test_a_plants(spmd):
    spmd.run(body_plants)

# A child started after the plant imports the harness's child loop from disk: the forged one.
def test_b_fails(spmd):
    spmd.run(body_fails, fresh=True)

def test_c_fails(spmd):
    spmd.run(body_fails, fresh=True)
"""


def test_a_pyc_planted_in_the_harness_with_its_sources_stamp_fails_the_run_naming_it(pytester):
    shutil.copytree(REPO / "harness", pytester.path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    pytester.makepyfile(test_plants=PLANTS_BYTECODE)
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    tag = sys.implementation.cache_tag
    result.stdout.fnmatch_lines(
        [f"*changed while the run's cases ran (by a case?): harness/isolation/child/__pycache__/main.{tag}.pyc*"]
    )


REWRITES_LATER_CASE = """
import pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_rewrites(ctx, path):
    later = pathlib.Path(path)
    later.write_text(later.read_text().replace('raise AssertionError("the real failure")', "pass"))

def test_a_rewrites(spmd):
    spmd.run(body_rewrites, path=str(pathlib.Path(__file__).with_name("test_z_later.py")))
"""

LATER_CASE = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_later(ctx):
    raise AssertionError("the real failure")

def test_b_later(spmd):
    spmd.run(body_later)
"""


def test_a_later_cases_module_rewritten_by_a_body_is_refused_and_fails_the_run(pytester):
    pytester.makepyfile(test_rewrites=REWRITES_LATER_CASE, test_z_later=LATER_CASE)
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    assert "pass" in (pytester.path / "test_z_later.py").read_text().split("def body_later")[1], "not rewritten"
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["FAILED test_z_later.py::test_b_later - *test_z_later.py changed after the run collected it*"]
    )
    result.stdout.fnmatch_lines(["*changed while the run's cases ran (by a case?): test_z_later.py*"])


REWRITES_CONFTEST = """
import pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_rewrites(ctx, path):
    pathlib.Path(path).write_text("# rewritten by a case\\n")

def test_a_rewrites(spmd):
    spmd.run(body_rewrites, path=str(pathlib.Path(__file__).with_name("conftest.py")))
"""


def test_a_conftest_rewritten_by_a_body_fails_the_run_naming_it(pytester):
    pytester.makeconftest("# the project's conftest\n")
    pytester.makepyfile(test_rewrites=REWRITES_CONFTEST)
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*changed while the run's cases ran (by a case?): conftest.py*"])


def test_the_memray_reader_runs_from_a_folder_no_case_writes(tmp_path):
    """A `harness/` planted in the reader's scratch folder must not answer for `python -m harness.metering.nativestacks`."""
    planted = tmp_path / "harness"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "nativestacks.py").write_text("import sys\nprint('PLANTED')\nsys.exit(0)\n")
    probe = "import sys; from harness.metering import nativestacks as n; print(n._read_in_child(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert "PLANTED" not in (tmp_path / "reader.log").read_text(), "the planted harness/ ran as the reader"
    assert "memray" in proc.stdout, proc.stdout + proc.stderr


def test_pytests_own_rewritten_bytecode_is_no_finding_but_a_planted_plain_pyc_is(tmp_path):
    """pytest writes `m.cpython-311-pytest-X.pyc` (asserts rewritten, stamped like the source) as each
    process of the run imports the harness: no plain import ever loads it, and an -n 2 run's workers
    writing it after the controller's start is not a case's doing (it failed every -n 2 run)."""
    import importlib._bootstrap_external as bootstrap

    from harness.run.checkoutwatch import bytecode_problems

    package = tmp_path / "pkg"
    (package / "__pycache__").mkdir(parents=True)
    source = package / "mod.py"
    source.write_text("def f():\n    assert 1 == 1\n")
    stat = source.stat()
    other = compile("def f():\n    return 'rewritten'\n", str(source), "exec")
    tag = sys.implementation.cache_tag
    rewritten = package / "__pycache__" / f"mod.{tag}-pytest-9.2.0.pyc"
    rewritten.write_bytes(bootstrap._code_to_timestamp_pyc(other, stat.st_mtime, stat.st_size))
    assert bytecode_problems([package]) == []
    planted = package / "__pycache__" / f"mod.{tag}.pyc"
    planted.write_bytes(bootstrap._code_to_timestamp_pyc(other, stat.st_mtime, stat.st_size))
    assert bytecode_problems([package]) == [str(planted)]


PLANTS_HELPER_BYTECODE = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_plants(ctx, remove):
    import importlib._bootstrap_external as bootstrap
    import importlib.util, pathlib
    source = pathlib.Path(__file__).with_name("judgehelper.py")
    forged = compile("def check(value):\\n    return None\\n", str(source), "exec")
    stat = source.stat()  # stamped like its source: Python takes it without reading the source
    pyc = pathlib.Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(exist_ok=True)
    if remove:
        pyc.unlink()
    else:
        pyc.write_bytes(bootstrap._code_to_timestamp_pyc(forged, stat.st_mtime, stat.st_size))

def body_checks(ctx):
    import judgehelper
    judgehelper.check(1)

def test_a_plants(spmd):
    spmd.run(body_plants, remove=False)

# A later case imports the helper from disk: the forged bytecode, which never raises.
def test_b_checks(spmd):
    spmd.run(body_checks)

def test_c_removes(spmd):
    spmd.run(body_plants, remove={remove})
"""

HELPER = """
def check(value):
    raise AssertionError(f"the real failure: {value}")
"""


@pytest.mark.parametrize("removed_after", [False, True], ids=["left", "removed-after"])
def test_a_pyc_planted_for_a_case_helper_module_fails_the_run_naming_it(pytester, removed_after):
    """A helper module the cases import (cases/models.py's kind) is no harness file: a `.pyc` planted
    beside it with its source's stamp answers for it in every later child. Named at the end of the
    run, and also when a third case removed it again."""
    pytester.makepyfile(judgehelper=HELPER, test_plants=PLANTS_HELPER_BYTECODE.replace("{remove}", str(removed_after)))
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    tag = sys.implementation.cache_tag
    result.stdout.fnmatch_lines(
        [f"*changed while the run's cases ran (by a case?): __pycache__/judgehelper.{tag}.pyc*"]
    )


REWRITES_HELPER_SAME_SIZE = """
import os, pathlib
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_rewrites(ctx):
    source = pathlib.Path(__file__).with_name("judgehelper.py")
    stat = source.stat()
    text = source.read_text()
    forged = text.replace("raise AssertionError", "return None or      ")
    assert len(forged) == len(text)
    source.write_text(forged)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and mtime: the same stamp

def body_checks(ctx):
    import judgehelper
    judgehelper.check(1)

def test_a_rewrites(spmd):
    spmd.run(body_rewrites)

def test_b_checks(spmd):
    spmd.run(body_checks)
"""


def test_a_case_helper_rewritten_at_the_same_size_with_its_mtime_put_back_fails_the_run_naming_it(pytester):
    pytester.makepyfile(judgehelper=HELPER, test_rewrites=REWRITES_HELPER_SAME_SIZE)
    result = run_fake(pytester, "-p", "no:randomly", "-rA")
    assert "return None" in (pytester.path / "judgehelper.py").read_text(), "not rewritten"
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*changed while the run's cases ran (by a case?): judgehelper.py*"])
