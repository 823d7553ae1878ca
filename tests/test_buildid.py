"""Builds told apart by their files (harness.records.buildid), not by their version label."""

from __future__ import annotations

import json

import pytest

from harness.records import buildid

pytestmark = pytest.mark.selftest

CASES = """
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body(ctx):
    ctx.record_sharding("w", "{replicated}")

def test_one(spmd):
    spmd.run(body)
"""


def install(site, native: bytes, gitrev: str = "5fab7053df86c8d503b98d9e7202ca8b8d4978c7") -> None:
    """A distribution `fakexla` 2.9.0 with a native library, a Python file and a version.py."""
    package = site / "fakexla"
    package.mkdir(parents=True, exist_ok=True)
    (site / "_FAKEC.cpython-311-x86_64-linux-gnu.so").write_bytes(native)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(f"__version__ = '2.9.0'\n__xla_gitrev__ = '{gitrev}'\n")
    info = site / "fakexla-2.9.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakexla\nVersion: 2.9.0\n")
    (info / "RECORD").write_text(
        "_FAKEC.cpython-311-x86_64-linux-gnu.so,,\nfakexla/__init__.py,,\nfakexla/version.py,,\n"
        "fakexla-2.9.0.dist-info/RECORD,,\n"
    )
    url = {"url": "file:///wheels/fakexla-2.9.0-cp311-cp311-linux_x86_64.whl", "archive_info": {"hash": "sha256=ab"}}
    (info / "direct_url.json").write_text(json.dumps(url))


def test_a_rebuilt_native_library_of_the_same_size_is_another_build(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    install(tmp_path, b"\x7fELF one build")
    first = buildid.identify("fakexla")
    install(tmp_path, b"\x7fELF two build")
    second = buildid.identify("fakexla")
    assert first and second and first["torch_xla"] == second["torch_xla"] == "2.9.0"
    assert first["native"] != second["native"] and first["python"] == second["python"]
    assert first["id"] != second["id"]
    assert second["wheel"] == "fakexla-2.9.0-cp311-cp311-linux_x86_64.whl" and second["wheel_sha256"] == "sha256=ab"
    assert second["git"] == "5fab7053df86c8d503b98d9e7202ca8b8d4978c7"
    assert buildid.describe(second).startswith(f"build {second['id']} (native ")


def test_a_forged_build_file_is_read_as_printable_strings_only(tmp_path):
    (tmp_path / buildid.FILE_NAME).write_text(json.dumps({"id": "x\x1b[2J", "native": 3, "wheel": "w" * 999}))
    read = buildid.read(tmp_path)
    assert read is not None and read["id"] == "x\\x1b[2J" and read["native"] is None and len(read["wheel"] or "") == 200


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")

    def run(build: str, *args: str, results: str = "pr") -> pytest.RunResult:
        monkeypatch.setenv(buildid.FAKE_BUILD_ENV, build)
        return pytester.runpytest_subprocess(
            "--spmd-backend=fake", "-p", "no:cacheprovider", f"--spmd-results-dir={results}", *args, timeout=120
        )

    return run


def test_same_label_different_build_is_said_once_and_the_comparison_names_both(suite, pytester):
    suite("one-build", results="base").assert_outcomes(passed=1)
    (base_run,) = (pytester.path / "base").glob("run-*")
    assert json.loads((base_run / buildid.FILE_NAME).read_text())["native"] == "one-build"
    result = suite("two-build", "--spmd-compare=base")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert out.count("same label, different build: both are torch_xla 2.9.0") == 1, out
    assert "WARNING" not in out, out
    result.stdout.fnmatch_lines(["base torch_xla 2.9.0 (build *) -> this build 2.9.0 (build *); 1 case(s) compared*"])


def test_a_base_run_of_this_very_build_is_named_so(suite):
    suite("one-build", results="base")
    result = suite("one-build", "--spmd-compare=base")
    result.stdout.fnmatch_lines(["*WARNING: the base run ran this very build (torch_xla 2.9.0, build *"])
