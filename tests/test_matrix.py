"""The release matrix: table logic, rendering, compare, disk check, the env cache and the CLI.

Everything runs on synthetic CaseRecords with a fake installer and a fake suite runner: no pip,
no torch, no subprocess.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.matrix import envs, render
from harness.matrix.__main__ import Deps, main
from harness.matrix.compare import compare, compare_all, to_text
from harness.matrix.envs import EnvCache, EnvRequest
from harness.matrix.errors import EnvBuildError, EnvMismatchError, NotEnoughDiskError
from harness.matrix.suite import SuiteRun
from harness.matrix.table import ColumnResult, State, build_matrix
from harness.records.results import CaseRecord, read_records, write_record
from harness.registry import load_registry

pytestmark = pytest.mark.selftest

REGISTRY_TOML = """
[[bug]]
id = "fixed-in-2.7"
title = "fixed by 2.7.0"
upstream_issue = "x#1"
status = "fixed"
carried_by = "<2.7.0"
signatures = ["TypeError: boom"]

[[bug]]
id = "open"
title = "carried by every release"
upstream_issue = "x#2"
status = "open"
carried_by = ">=2.4"
signatures = ["RuntimeError: open bug"]

[[bug]]
id = "untested"
title = "no case names this"
upstream_issue = "x#3"
status = "open"
carried_by = ">=2.4"
signatures = ["never"]
"""


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    path = tmp_path / "bugs.toml"
    path.write_text(REGISTRY_TOML)
    return path


@pytest.fixture
def registry(registry_path: Path):
    return load_registry(registry_path)


def rec(name: str, outcome: str, bug: str | None, version: str | None = "2.6.0", evidence: str = "") -> CaseRecord:
    """A record as the plugin writes it, with the registry verdict it stores. In these tables the
    only signature is "TypeError: boom"; a failure without evidence is the plugin's unexpected pass."""
    verdict = {"xfailed": "reproduced", "passed": "passed"}.get(outcome)
    if outcome == "failed":
        verdict = "unexpected-pass" if not evidence else "regressed" if "TypeError: boom" in evidence else "failed"
    return CaseRecord(
        nodeid=f"cases/test_x.py::{name}",
        family="x",
        outcome=outcome,
        known_bug=bug,
        known_bugs=[bug] if bug else [],
        registry_verdict=verdict if bug else None,
        evidence=evidence,
        torch_xla=version,
        reason=f"{outcome} reason",
    )


def column(
    name: str, records: Sequence[CaseRecord], exit_code: int | None = 1, declared: str | None = None
) -> ColumnResult:
    return ColumnResult(name, "release", SuiteRun(Path(f"/r/{name}"), list(records), exit_code), declared or name)


def healthy(version: str) -> list[CaseRecord]:
    """What a correct release reports: fixed-in-2.7 reproduced before 2.7.0, open reproduced everywhere."""
    carried = version < "2.7.0"
    return [
        rec("scalar", "xfailed" if carried else "passed", "fixed-in-2.7", version),
        rec("open_a", "xfailed", "open", version),
        rec("open_b", "xfailed", "open", version),
    ]


# ---------------------------------------------------------------------------------------------
# Table logic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "records, state, detail, agrees",
    [
        # Every case xfailed on a carrying release: the bug is there, as predicted.
        pytest.param([rec("a", "xfailed", "fixed-in-2.7")], State.REPRODUCED, "1 xfailed", True, id="reproduced"),
        # The plugin fails a case that passed on a carrying release, with no evidence: an unexpected pass.
        pytest.param(
            [rec("a", "failed", "fixed-in-2.7")], State.UNEXPECTED, "1 unexpected pass", False, id="unexpected-pass"
        ),
        # A carrying release fails some other way: a new failure, not the known bug.
        pytest.param(
            [rec("a", "failed", "fixed-in-2.7", evidence="ValueError: new")],
            State.UNEXPECTED,
            "1 failed",
            False,
            id="new-failure",
        ),
        # One case reproduces, another fails: mixed, and the counts say so.
        pytest.param(
            [rec("a", "xfailed", "fixed-in-2.7"), rec("b", "failed", "fixed-in-2.7", evidence="ValueError: x")],
            State.UNEXPECTED,
            "mixed: 1 failed, 1 xfailed",
            False,
            id="mixed",
        ),
        # A skipped case is set aside when another case for the entry ran (a TPU-only case on CPU).
        pytest.param(
            [rec("a", "xfailed", "fixed-in-2.7"), rec("b", "skipped", "fixed-in-2.7")],
            State.REPRODUCED,
            "1 xfailed, +1 skipped",
            True,
            id="partly-skipped",
        ),
    ],
)
def test_cell_on_a_carrying_release(registry, records, state, detail, agrees):
    matrix = build_matrix(registry, [column("2.6.0", records)])
    cell = matrix.cell("fixed-in-2.7", "2.6.0")
    assert (cell.observed.state, cell.observed.detail, cell.agrees) == (state, detail, agrees)
    assert cell.expected is State.REPRODUCED


def test_all_skipped_is_not_run_and_listed_apart_not_a_disagreement(registry):
    records = [rec("a", "skipped", "fixed-in-2.7"), rec("b", "skipped", "fixed-in-2.7")] + healthy("2.6.0")[1:]
    matrix = build_matrix(registry, [column("2.6.0", records)])
    cell = matrix.cell("fixed-in-2.7", "2.6.0")
    assert (cell.observed.state, cell.observed.detail) == (State.NOT_RUN, "2 skipped: skipped reason")
    assert not cell.disagrees and [d.entry for d in matrix.not_run] == ["fixed-in-2.7"]
    assert {d.entry for d in matrix.disagreements} == {"untested"}
    text = render.to_markdown(matrix, "cmd")
    assert "| `fixed-in-2.7` | `<2.7.0` | not run (2 skipped: skipped reason) |" in text
    assert "## Not run (1): every case for the entry skipped itself" in text


def test_fixed_release_passing_agrees_and_reproducing_there_is_a_regression(registry):
    ok = build_matrix(registry, [column("2.9.0", [rec("a", "passed", "fixed-in-2.7", "2.9.0")])])
    assert ok.cell("fixed-in-2.7", "2.9.0").agrees
    back = build_matrix(registry, [column("2.9.0", [rec("a", "failed", "fixed-in-2.7", "2.9.0", "TypeError: boom")])])
    cell = back.cell("fixed-in-2.7", "2.9.0")
    assert cell.observed.detail == "1 regressed" and cell.expected is State.FIXED and not cell.agrees
    assert any("regression" in d.message for d in back.disagreements)


def test_healthy_releases_agree_everywhere_but_the_untested_entry(registry):
    matrix = build_matrix(registry, [column(v, healthy(v)) for v in ("2.6.0", "2.7.0", "2.9.0")])
    assert [matrix.cell("fixed-in-2.7", v).observed.state for v in ("2.6.0", "2.7.0", "2.9.0")] == [
        State.REPRODUCED,
        State.FIXED,
        State.FIXED,
    ]
    assert all(matrix.cell("open", v).agrees for v in ("2.6.0", "2.7.0", "2.9.0"))
    # The registry claims "untested" and nothing tests it: a disagreement in every column.
    assert {(d.entry, d.column) for d in matrix.disagreements} == {("untested", v) for v in ("2.6.0", "2.7.0", "2.9.0")}
    assert matrix.cell("untested", "2.6.0").observed.state is State.NO_CASE
    assert "nothing tests" in matrix.disagreements[0].message


def test_entry_tested_elsewhere_but_not_in_this_column_says_no_case_ran(registry):
    matrix = build_matrix(registry, [column("2.6.0", healthy("2.6.0")), column("2.9.0", healthy("2.9.0")[1:])])
    cell = matrix.cell("fixed-in-2.7", "2.9.0")
    assert (cell.observed.state, cell.observed.detail) == (State.UNEXPECTED, "no case ran")


def test_column_problems_are_disagreements(registry):
    crashed = column("2.7.0", [], exit_code=2)
    wrong_version = column("2.9.0", healthy("2.8.0"), declared="2.9.0")
    other_failure = column("2.6.0", healthy("2.6.0") + [rec("smoke", "failed", None, evidence="boom")])
    matrix = build_matrix(registry, [crashed, wrong_version, other_failure])
    messages = [d.message for d in matrix.disagreements if d.entry is None]
    assert any("pytest exited 2 (interrupted)" in m for m in messages)
    assert any("ran torch_xla 2.8.0, but the column is 2.9.0" in m for m in messages)
    assert any("test_x.py::smoke failed on 2.6.0 (no registry entry)" in m for m in messages)


def test_expected_follows_the_version_the_children_ran(registry):
    # A results folder read back has no declared version; the children's own report decides.
    records = [rec("a", "xfailed", "fixed-in-2.7", "2.6.0")]
    matrix = build_matrix(registry, [ColumnResult("nightly", "results", SuiteRun(Path("/r"), records, 1))])
    assert matrix.cell("fixed-in-2.7", "nightly").expected is State.REPRODUCED


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def test_markdown_has_one_row_per_entry_one_column_per_release_and_flags_disagreements(registry):
    records = healthy("2.6.0")
    records[0] = rec("scalar", "failed", "fixed-in-2.7")  # unexpected pass on 2.6.0
    matrix = build_matrix(registry, [column("2.6.0", records), column("2.9.0", healthy("2.9.0"))])
    text = render.to_markdown(matrix, "python -m harness.matrix --releases 2.6.0,2.9.0")
    assert "| registry entry | carried_by | 2.6.0 | 2.9.0 |" in text
    assert (
        "| `fixed-in-2.7` | `<2.7.0` | ⚠ **unexpected** (1 unexpected pass), expected reproduced | fixed (1) |" in text
    )
    assert "| `open` | `>=2.4` | reproduced (2) | reproduced (2) |" in text
    assert "| `untested` | `>=2.4` | ⚠ **no case**, expected reproduced |" in text
    assert "## ⚠ Disagreements with the registry (3)" in text
    assert "Generated by `python -m harness.matrix --releases 2.6.0,2.9.0`" in text


def test_markdown_says_when_everything_agrees_and_escapes_pipes(registry):
    registry = {k: v for k, v in registry.items() if k != "untested"}
    records = healthy("2.6.0") + [rec("x", "passed", None)]
    records[1] = rec("open_a", "xfailed", "open", "2.6.0")
    matrix = build_matrix(registry, [column("2.6.0", records)])
    text = render.to_markdown(matrix, "cmd")
    assert "All 2 measured cells agree with the registry." in text
    assert render._md("a | b") == "a \\| b"


def test_json_carries_cells_cases_and_disagreements(registry):
    matrix = build_matrix(registry, [column("2.6.0", healthy("2.6.0"))])
    data = json.loads(render.dumps(matrix, "cmd"))
    row = {r["entry"]: r for r in data["rows"]}["fixed-in-2.7"]
    assert row["cells"]["2.6.0"]["observed"] == "reproduced" and row["cells"]["2.6.0"]["agrees"] is True
    assert row["cells"]["2.6.0"]["cases"][0]["nodeid"] == "cases/test_x.py::scalar"
    assert data["agrees"] is False and data["disagreements"][0]["entry"] == "untested"
    assert data["columns"][0]["name"] == "2.6.0" and data["schema"] == 1


# ---------------------------------------------------------------------------------------------
# Compare
# ---------------------------------------------------------------------------------------------


def test_compare_names_only_entries_whose_verdict_changed(registry):
    good = column("2.7.0", healthy("2.7.0"))
    bad_records = healthy("2.7.0")
    bad_records[0] = rec("scalar", "failed", "fixed-in-2.7", "2.7.0", "TypeError: boom")
    bad = column("2.7.1", bad_records)
    changes = compare(registry, good, bad)
    assert [c.entry for c in changes] == ["fixed-in-2.7"]
    assert changes[0].cases == (("cases/test_x.py::scalar", "passed", "regressed"),)
    text = to_text(changes, good, bad)
    assert "fixed-in-2.7: fixed (1 passed) -> unexpected (1 regressed)" in text
    assert compare(registry, good, column("x", healthy("2.7.0"))) == []
    assert "No registry entry changed verdict" in to_text([], good, good)


def test_compare_of_a_partial_run_lists_what_did_not_run_and_changes_nothing(registry):
    """Not run is not changed (issue 29): a run of one file against the full suite."""
    full = column("2.7.0", healthy("2.7.0"))
    partial = column("2.7.1", healthy("2.7.0")[:1])  # only the scalar case ran
    changes, not_run = compare_all(registry, full, partial)
    assert changes == []
    assert [n.entry for n in not_run] == ["open"]
    text = to_text(changes, full, partial, not_run)
    assert "No registry entry changed verdict." in text
    assert "1 entry not run on one side (not compared):" in text and "- open: reproduced" in text
    assert compare(registry, partial, full) == []  # either way round


# ---------------------------------------------------------------------------------------------
# Disk check and the environment cache (fake installer)
# ---------------------------------------------------------------------------------------------


def test_disk_check_raises_with_the_numbers(tmp_path: Path):
    with pytest.raises(
        NotEnoughDiskError, match=r"2 environment\(s\) needs about 16.0 GB under .*only 5.0 GB is free"
    ) as info:
        envs.check_disk(tmp_path / "not" / "yet", 2, free_bytes=lambda p: 5 * 10**9)
    assert (info.value.needed_gb, info.value.free_gb) == (16.0, 5.0)
    envs.check_disk(tmp_path, 2, free_bytes=lambda p: 17 * 10**9)  # enough
    envs.check_disk(tmp_path, 0, free_bytes=lambda p: 0)  # nothing to build: no check


def test_disk_check_probes_the_nearest_existing_folder(tmp_path: Path):
    probed = []
    envs.check_disk(tmp_path / "a" / "b", 1, free_bytes=lambda p: probed.append(p) or 10**12)
    assert probed == [tmp_path]


class FakeInstaller:
    """Records each step; makes bin/python; can fail at one step; reports versions from what it installed."""

    def __init__(self, fail_at: str | None = None, versions: dict[str, dict[str, str]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail_at = fail_at
        self.versions = versions or {}
        self.installed: dict[str, str] = {}

    def create_venv(self, path: Path, log: Path) -> None:
        self.calls.append(("venv", path.name))
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").write_text("")

    def pip_install(self, python: Path, args: Sequence[str], log: Path) -> None:
        self.calls.append(("pip", *args))
        if self.fail_at == ("harness" if "-e" in args else "deps"):
            raise EnvBuildError(f"pip install exited 1; log: {log}")
        for arg in args:
            if arg.startswith("torch_xla[pallas]=="):
                self.installed[str(python)] = arg.split("==")[1]
            elif arg.startswith("torch_xla[pallas] @ "):
                self.installed[str(python)] = arg.split("torch_xla-")[1].split("-")[0]

    def installed_versions(self, python: Path) -> dict[str, str]:
        if str(python) in self.versions:
            return self.versions[str(python)]
        return {"torch_xla": self.installed.get(str(python), "0"), "torch": "t", "jax": "j"}


def _request(version: str = "2.7.0") -> EnvRequest:
    return EnvRequest(
        key=f"torch_xla-{version}",
        label=version,
        requirements=(f"torch=={version}", f"torch_xla[pallas]=={version}", "pytest"),
        torch_xla=version,
    )


def test_env_is_built_once_then_reused(tmp_path: Path):
    installer, said = FakeInstaller(), []
    cache = EnvCache(tmp_path, installer, Path("/repo"), said.append)
    env = cache.ensure(_request())
    assert installer.calls == [
        ("venv", "torch_xla-2.7.0"),
        ("pip", "torch==2.7.0", "torch_xla[pallas]==2.7.0", "pytest"),
        ("pip", "--no-deps", "-e", "/repo"),
    ]
    marker = json.loads((env / envs.MARKER).read_text())
    assert marker["versions"]["torch_xla"] == "2.7.0"
    installer.calls.clear()
    assert cache.ensure(_request()) == env and installer.calls == []
    assert any("reusing cached environment" in s for s in said)


@pytest.mark.parametrize("fail_at", ["deps", "harness"])
def test_a_failed_build_leaves_no_marker_and_is_rebuilt(tmp_path: Path, fail_at):
    with pytest.raises(EnvBuildError):
        EnvCache(tmp_path, FakeInstaller(fail_at=fail_at), Path("/repo"), lambda s: None).ensure(_request())
    assert not (tmp_path / "torch_xla-2.7.0" / envs.MARKER).exists()
    said, installer = [], FakeInstaller()
    EnvCache(tmp_path, installer, Path("/repo"), said.append).ensure(_request())
    assert installer.calls[0] == ("venv", "torch_xla-2.7.0")
    assert any("no completion marker" in s for s in said)


def test_half_built_env_without_marker_is_deleted_first(tmp_path: Path):
    leftover = tmp_path / "torch_xla-2.7.0" / "lib" / "half-unpacked.so"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("x")
    EnvCache(tmp_path, FakeInstaller(), Path("/repo"), lambda s: None).ensure(_request())
    assert not leftover.exists() and (tmp_path / "torch_xla-2.7.0" / envs.MARKER).exists()


def test_changed_requirements_rebuild_the_env(tmp_path: Path):
    cache = EnvCache(tmp_path, FakeInstaller(), Path("/repo"), lambda s: None)
    cache.ensure(_request())
    changed = EnvRequest(
        **{**_request().__dict__, "requirements": ("torch==2.7.0", "torch_xla[pallas]==2.7.0", "pytest>=9")}
    )
    assert not cache.is_complete(changed)


def test_env_holding_another_torch_xla_is_refused_and_unmarked(tmp_path: Path):
    installer = FakeInstaller(versions={str(tmp_path / "torch_xla-2.7.0" / "bin" / "python"): {"torch_xla": "2.6.0"}})
    with pytest.raises(EnvMismatchError, match="has torch_xla 2.6.0, not 2.7.0"):
        EnvCache(tmp_path, installer, Path("/repo"), lambda s: None).ensure(_request())
    assert not (tmp_path / "torch_xla-2.7.0" / envs.MARKER).exists()


def test_release_request_installs_the_pallas_extra_and_the_harness_deps():
    request = envs.release_request("2.7.0", Path(__file__).resolve().parents[1])
    assert request.requirements[:2] == ("torch==2.7.0", "torch_xla[pallas]==2.7.0")
    assert any(r.startswith("pytest") for r in request.requirements) and request.key.startswith("torch_xla-2.7.0-py")


# ---------------------------------------------------------------------------------------------
# CLI end to end (fake installer, fake suite)
# ---------------------------------------------------------------------------------------------


class FakeSuite:
    """Writes the records a release would produce, from a table keyed by torch_xla version."""

    runs: list[str] = []
    results_dirs: list[Path] = []

    def __init__(self, by_version: dict[str, list[CaseRecord]], installer: FakeInstaller) -> None:
        self.by_version, self.installer = by_version, installer

    def run(self, python: Path, results_dir: Path, label: str) -> SuiteRun:
        version = self.installer.installed_versions(python)["torch_xla"]
        FakeSuite.runs.append(version)
        FakeSuite.results_dirs.append(results_dir)
        for record in self.by_version.get(version, []):
            write_record(results_dir, record)
        records = list(read_records(results_dir))
        return SuiteRun(results_dir, records, exit_code=1 if any(r.outcome == "failed" for r in records) else 0)


def run_cli(
    argv: list[str],
    tmp_path: Path,
    by_version: dict[str, list[CaseRecord]] | None = None,
    installer: FakeInstaller | None = None,
    free_gb: float = 1000,
) -> tuple[int, str, str, FakeInstaller]:
    installer = installer or FakeInstaller()
    by_version = by_version if by_version is not None else {v: healthy(v) for v in ("2.6.0", "2.7.0", "2.9.0")}
    out, err = io.StringIO(), io.StringIO()
    FakeSuite.runs, FakeSuite.results_dirs = [], []
    deps = Deps(
        stdout=out,
        stderr=err,
        installer=lambda say: installer,
        suite=lambda repo, say, **kw: FakeSuite(by_version, installer),
        free_bytes=lambda p: int(free_gb * 1e9),
    )
    code = main([*argv, "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")], deps)
    return code, out.getvalue(), err.getvalue(), installer


def test_cli_agreement_exits_0_and_writes_markdown_and_json(tmp_path: Path, registry_path: Path):
    registry_path.write_text(REGISTRY_TOML.split('[[bug]]\nid = "untested"')[0])
    code, out, err, _ = run_cli(
        [
            "--releases",
            "2.6.0,2.7.0,2.9.0",
            "--registry",
            str(registry_path),
            "--table",
            str(tmp_path / "docs" / "m.md"),
        ],
        tmp_path,
    )
    assert code == 0, err
    assert "| `fixed-in-2.7` | `<2.7.0` | reproduced (1) | fixed (1) | fixed (1) |" in out
    assert "build 3 environment(s)" in err and "about 2-5 min and 7 GB each" in err
    assert json.loads((tmp_path / "docs" / "m.json").read_text())["agrees"] is True
    assert (tmp_path / "docs" / "m.md").read_text() == out.removesuffix("\n")
    assert FakeSuite.runs == ["2.6.0", "2.7.0", "2.9.0"]


def test_cli_disagreement_exits_1_and_second_run_reuses_envs(tmp_path: Path, registry_path: Path):
    code, out, err, installer = run_cli(["--releases", "2.6.0", "--registry", str(registry_path)], tmp_path)
    assert code == 1 and "⚠ 1 disagreement(s)" in err
    assert (tmp_path / "out" / "release-matrix.md").exists()
    code, _, err, installer = run_cli(["--releases", "2.6.0", "--registry", str(registry_path)], tmp_path)
    assert "reuse cached environment for 2.6.0" in err and installer.calls == []


def test_cli_existing_venv_replaces_the_build(tmp_path: Path, registry_path: Path):
    venv = tmp_path / "v26"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    installer = FakeInstaller(versions={str(venv / "bin" / "python"): {"torch_xla": "2.6.0", "torch": "2.6.0"}})
    code, _, err, installer = run_cli(
        ["--releases", "2.6.0", "--env", f"2.6.0={venv}", "--registry", str(registry_path)],
        tmp_path,
        installer=installer,
    )
    assert "use existing venv for 2.6.0" in err and installer.calls == [] and FakeSuite.runs == ["2.6.0"]
    installer = FakeInstaller(versions={str(venv / "bin" / "python"): {"torch_xla": "2.9.0"}})
    code, _, err, _ = run_cli(["--releases", "2.6.0", "--env", f"2.6.0={venv}"], tmp_path, installer=installer)
    assert code == 3 and "has torch_xla 2.9.0, not 2.6.0" in err


def test_cli_wheel_folder_is_a_column_named_after_its_torch_xla(tmp_path: Path, registry_path: Path):
    wheels = tmp_path / "pr"
    wheels.mkdir()
    (wheels / "torch-2.10.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"t")
    (wheels / "torch_xla-2.10.0.dev20250301-cp311-cp311-linux_x86_64.whl").write_bytes(b"x")
    by_version = {
        "2.10.0.dev20250301": [
            rec("s", "passed", "fixed-in-2.7", "2.10.0.dev20250301"),
            rec("o", "xfailed", "open", "2.10.0.dev20250301"),
        ]
    }
    code, out, err, installer = run_cli(
        ["--wheels", str(wheels), "--registry", str(registry_path)], tmp_path, by_version
    )
    assert "| registry entry | carried_by | 2.10.0.dev20250301 |" in out
    pip_args = installer.calls[1]
    assert any(a.startswith("torch_xla[pallas] @ file://") for a in pip_args), pip_args
    assert any(a.endswith("torch-2.10.0-cp311-cp311-linux_x86_64.whl") for a in pip_args)
    assert code == 1  # only the untested entry disagrees
    assert any((tmp_path / "cache").glob("wheels-*-py*/" + envs.MARKER))


def test_wheel_env_key_follows_content_not_names(tmp_path: Path):
    # Two PR builds can carry identical filenames; their environments must not be shared.
    keys = []
    for content in (b"build-1", b"build-2", b"build-1"):
        folder = tmp_path / f"w{len(keys)}"
        folder.mkdir()
        (folder / "torch_xla-2.10.0+gitabc-cp311-cp311-linux_x86_64.whl").write_bytes(content)
        keys.append(envs.wheels_request(envs.read_wheel_folder(folder), tmp_path).key)
    assert keys[0] != keys[1] and keys[0] == keys[2]
    assert envs.read_wheel_folder(folder).torch_xla_version == "2.10.0+gitabc"


def test_cli_not_enough_disk_exits_3_before_building(tmp_path: Path):
    code, _, err, installer = run_cli(["--releases", "2.6.0,2.7.0"], tmp_path, free_gb=10)
    assert code == 3 and "needs about 16.0 GB" in err and "only 10.0 GB is free" in err
    assert installer.calls == []


@pytest.mark.parametrize(
    "argv, message",
    [
        # Not a version at all.
        pytest.param(["--releases", "2.x"], "'2.x' is not a version", id="bad-release"),
        # --env must name a listed release.
        pytest.param(
            ["--releases", "2.9.0", "--env", "2.6.0=/x"],
            "--env names 2.6.0, which --releases does not list",
            id="env-unlisted",
        ),
        # --env needs NAME=PATH.
        pytest.param(["--releases", "2.9.0", "--env", "/x"], "expected NAME=PATH", id="env-no-equals"),
        # --env pointing at something that is not a venv.
        pytest.param(
            ["--releases", "2.9.0", "--env", "2.9.0=/nonexistent"], "no /nonexistent/bin/python", id="env-not-venv"
        ),
        # Nothing to do.
        pytest.param([], "nothing to measure", id="no-columns"),
        # Twice the same release.
        pytest.param(["--releases", "2.6.0,2.6.0"], "names 2.6.0 twice", id="duplicate"),
        # xdist workers must be positive.
        pytest.param(["--releases", "2.6.0", "--jobs-per-env", "0"], "not a positive whole number", id="jobs-zero"),
        # A wheel folder without a torch_xla wheel.
        pytest.param(["--wheels", "EMPTY"], "needs exactly one torch_xla wheel", id="wheels-no-xla"),
        # An unknown option.
        pytest.param(["--release", "2.6.0"], "unknown argument(s): --release", id="unknown-option"),
        # compare needs both folders.
        pytest.param(["compare", "--good", "/tmp"], "--bad", id="compare-missing-bad"),
        # compare with a folder that is neither wheels nor results.
        pytest.param(
            ["compare", "--good", "EMPTY", "--bad", "EMPTY"], "no verdicts-*.jsonl there", id="compare-empty-dir"
        ),
    ],
)
def test_usage_errors_exit_2_with_a_message(tmp_path: Path, argv, message):
    (tmp_path / "empty").mkdir()
    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in argv]
    code, _, err, installer = run_cli(argv, tmp_path)
    assert code == 2 and message in err, err
    assert installer.calls == []


def test_help_exits_0(tmp_path: Path, capsys):
    assert run_cli(["--help"], tmp_path)[0] == 0
    assert "--releases" in capsys.readouterr().out


def test_compare_cli_on_results_folders_names_the_changed_entry(tmp_path: Path, registry_path: Path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for record in healthy("2.7.0"):
        write_record(good, record)
    for record in healthy("2.7.0")[1:] + [rec("scalar", "failed", "fixed-in-2.7", "2.7.0", "TypeError: boom")]:
        write_record(bad, record)
    code, out, _, _ = run_cli(
        ["compare", "--good", str(good), "--bad", str(bad), "--registry", str(registry_path)], tmp_path
    )
    assert (
        code == 1
        and "1 entry changed verdict" in out
        and "fixed-in-2.7: fixed (1 passed) -> unexpected (1 regressed)" in out
    )
    code, out, _, _ = run_cli(
        ["compare", "--good", str(good), "--bad", str(good), "--registry", str(registry_path)], tmp_path
    )
    assert code == 0 and "No registry entry changed verdict" in out


def test_compare_points_at_nested_results_of_a_matrix_run(tmp_path: Path):
    write_record(tmp_path / "run" / "2.6.0", rec("a", "passed", None))
    code, _, err, _ = run_cli(["compare", "--good", str(tmp_path / "run"), "--bad", str(tmp_path / "run")], tmp_path)
    assert code == 2 and "pass one of those" in err and "2.6.0" in err


def test_results_of_an_earlier_run_re_render_without_running(tmp_path: Path, registry_path: Path):
    run_cli(["--releases", "2.6.0", "--registry", str(registry_path)], tmp_path)
    code, out, err, installer = run_cli(
        [
            "--results",
            f"2.6.0={tmp_path / 'out' / '2.6.0'}",
            "--registry",
            str(registry_path),
            "--table",
            str(tmp_path / "again.md"),
        ],
        tmp_path,
    )
    assert code == 1 and FakeSuite.runs == [] and installer.calls == []
    assert "| `fixed-in-2.7` | `<2.7.0` | reproduced (1) |" in out
    assert "| 2.6.0 | results | 2.6.0 | t | j | built in 0 s |" in out  # kept from the run's matrix-column.json


def test_compare_cli_on_wheel_folders_builds_and_runs_each(tmp_path: Path, registry_path: Path):
    versions = {"good": "2.7.0.dev20250310", "bad": "2.7.0.dev20250311"}
    for role, version in versions.items():
        (tmp_path / role).mkdir()
        (tmp_path / role / f"torch_xla-{version}-cp311-cp311-linux_x86_64.whl").write_bytes(role.encode())
    by_version = {
        versions["good"]: [rec("o", "xfailed", "open", versions["good"])],
        versions["bad"]: [rec("o", "failed", "open", versions["bad"], "ValueError: other")],
    }
    code, out, err, installer = run_cli(
        ["compare", "--good", str(tmp_path / "good"), "--bad", str(tmp_path / "bad"), "--registry", str(registry_path)],
        tmp_path,
        by_version,
    )
    assert code == 1 and FakeSuite.runs == [versions["good"], versions["bad"]]
    assert "- open: reproduced (1 xfailed) -> unexpected (1 failed)" in out
    assert "build 2 environment(s)" in err


# ---------------------------------------------------------------------------------------------
# The suite command and the logged-process helper
# ---------------------------------------------------------------------------------------------


def test_suite_command_runs_the_spmd_cases_with_xdist_only_when_asked(monkeypatch):
    from harness.matrix.suite import PytestSuite, _isolated_environ

    python = Path("/envs/e/bin/python")
    plain = PytestSuite(Path("/repo"), lambda s: None).command(python, Path("/out/2.7.0"))
    assert plain == [
        str(python),
        "-m",
        "pytest",
        "-c",
        "/repo/pyproject.toml",
        "--rootdir",
        "/repo",
        "-m",
        "spmd",
        "cases",
        "--spmd-results-dir",
        "/out/2.7.0",
        "-p",
        "no:cacheprovider",
    ]
    parallel = PytestSuite(Path("/repo"), lambda s: None, jobs=2, extra_args=["-k", "scalar"]).command(
        python, Path("/o")
    )
    assert parallel[-4:] == ["-n", "2", "-k", "scalar"]
    monkeypatch.setenv("PYTHONPATH", "/elsewhere/site-packages")
    env = _isolated_environ(python)
    assert "PYTHONPATH" not in env and env["PATH"].startswith("/envs/e/bin") and env["VIRTUAL_ENV"] == "/envs/e"


def test_run_logged_keeps_output_in_the_log_and_beats(tmp_path: Path):
    import sys

    from harness.matrix.procs import run_logged

    beats, said = [], []
    code = run_logged(
        [sys.executable, "-c", "import time; print('hello'); time.sleep(0.5)"],
        tmp_path / "l.log",
        heartbeat=lambda t: beats.append(t) or "beat",
        every_s=0.1,
        say=said.append,
    )
    assert code == 0 and "hello" in (tmp_path / "l.log").read_text() and said and said[0] == "beat"


def test_run_logged_stops_a_command_past_its_timeout(tmp_path: Path):
    import sys

    from harness.matrix.errors import CommandTimedOut, MatrixError
    from harness.matrix.procs import run_logged

    with pytest.raises(CommandTimedOut) as raised:
        run_logged(
            [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "l.log", timeout_s=0.3, every_s=0.1
        )
    assert isinstance(raised.value, MatrixError), "a timeout belongs to the matrix's error tree"


def test_relative_out_reaches_the_suite_as_an_absolute_path(tmp_path: Path, registry_path: Path, monkeypatch):
    # pytest runs from the repo root; a relative --out would land its verdicts somewhere else.
    monkeypatch.chdir(tmp_path)
    installer = FakeInstaller()
    deps = Deps(
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        installer=lambda say: installer,
        suite=lambda repo, say, **kw: FakeSuite({"2.6.0": healthy("2.6.0")}, installer),
        free_bytes=lambda p: 10**13,
    )
    FakeSuite.runs, FakeSuite.results_dirs = [], []
    main(["--releases", "2.6.0", "--out", "rel", "--cache", "cache", "--registry", str(registry_path)], deps)
    assert FakeSuite.results_dirs == [tmp_path / "rel" / "2.6.0"]


def test_a_row_that_names_two_entries_counts_for_the_one_that_judged_it():
    """The bug-4 trace_pallas row names megascale-no-guard (<2.6.0) and the 2.6 entry: on 2.5.1 the
    first judges it, on 2.6.0 the second; the other entry's cell then says so and agrees."""
    from harness.registry import load_registry

    names = ["megascale-preset-dropped-by-trace-pallas", "megascale-no-guard"]

    def row(version: str, judged_by: str) -> CaseRecord:
        return CaseRecord(
            nodeid="cases/test_multislice.py::test_preset[via-trace-pallas]",
            family="multislice",
            outcome="xfailed",
            known_bug=judged_by,
            known_bugs=names,
            registry_verdict="reproduced",
            torch_xla=version,
        )

    matrix = build_matrix(
        load_registry(), [column("2.5.1", [row("2.5.1", names[1])]), column("2.6.0", [row("2.6.0", names[0])])]
    )
    for entry, version, state in [
        (names[1], "2.5.1", State.REPRODUCED),
        (names[0], "2.5.1", State.ELSEWHERE),
        (names[0], "2.6.0", State.REPRODUCED),
        (names[1], "2.6.0", State.ELSEWHERE),
    ]:
        cell = matrix.cell(entry, version)
        assert cell.observed.state is state and cell.agrees, (entry, version, cell)
    assert matrix.cell(names[0], "2.5.1").observed.detail == f"judged as {names[1]}"


def test_identical_large_files_of_cached_envs_become_hard_links(tmp_path):
    from harness.matrix.share import MIN_SHARED_BYTES, share_identical_files

    same = b"x" * MIN_SHARED_BYTES
    old, new = tmp_path / "old", tmp_path / "new"
    for env, other_bytes in ((old, b"a"), (new, b"b")):
        (env / "lib").mkdir(parents=True)
        (env / "lib" / "libcudnn.so").write_bytes(same)
        (env / "lib" / "libtorch.so").write_bytes(other_bytes * MIN_SHARED_BYTES)  # same name, other bytes
        (env / "lib" / "small.py").write_bytes(b"print()")
    freed = share_identical_files(new, [old, new])
    assert freed == MIN_SHARED_BYTES
    assert (new / "lib" / "libcudnn.so").stat().st_ino == (old / "lib" / "libcudnn.so").stat().st_ino
    assert (new / "lib" / "libtorch.so").stat().st_ino != (old / "lib" / "libtorch.so").stat().st_ino
    assert (new / "lib" / "libcudnn.so").read_bytes() == same
    assert share_identical_files(new, [old]) == 0  # already shared


def test_the_readme_table_is_written_between_its_markers_only(registry):
    from harness.matrix.render import README_BEGIN, README_END, replace_in_readme

    matrix = build_matrix(registry, [column("2.6.0", healthy("2.6.0")), column("2.7.0", healthy("2.7.0"))])
    text = f"intro\n{README_BEGIN}\nold table\n{README_END}\noutro\n"
    out = replace_in_readme(text, matrix, "python -m harness.matrix --releases 2.6.0,2.7.0")
    assert out.startswith("intro\n") and out.endswith(f"{README_END}\noutro\n") and "old table" not in out
    assert "| `fixed-in-2.7` | `<2.7.0` | reproduced (1) | fixed (1) |" in out
    with pytest.raises(ValueError, match="markers"):
        replace_in_readme("no markers here", matrix, "cmd")


def test_sharding_changes_between_consecutive_columns_list_moved_tensors_only():
    from harness.matrix.shardingchanges import consecutive_changes

    def rec_with(name: str, shardings: dict[str, str]) -> CaseRecord:
        return CaseRecord(nodeid=f"cases/test_x.py::{name}", family="x", outcome="passed", shardings=shardings)

    old = column(
        "2.6.0",
        [
            rec_with("a", {"w": "{devices=[4,1]0,1,2,3}", "out": "{replicated}"}),
            rec_with("b", {"w": "{devices=[4,1]<=[4]}"}),
        ],
    )
    new = column(
        "2.7.0",
        [
            rec_with("a", {"w": "{devices=[1,4]0,1,2,3}", "out": "{replicated}", "extra": ""}),
            rec_with("b", {"w": "{devices=[4,1]0,1,2,3}"}),
        ],
    )
    (step,) = consecutive_changes([old, new])
    assert [(m.case.split("::")[1], m.change.tensor, m.change.before, m.change.after) for m in step.moved] == [
        ("a", "w", "{devices=[4,1]0,1,2,3}", "{devices=[1,4]0,1,2,3}")
    ]  # b's iota form is the same sharding
    assert step.one_sided == 1


def test_cost_changes_between_consecutive_columns_list_changed_items_and_skip_cost_selftests():
    from harness import costs
    from harness.matrix.costchanges import consecutive_changes, to_markdown
    from tests.test_costs import signature

    def rec_with(name: str, all_gather: int, family: str = "x") -> CaseRecord:
        return CaseRecord(
            nodeid=f"cases/test_{family}.py::{name}",
            family=family,
            outcome="passed",
            costs={"train": costs.comparable(signature(all_gather=all_gather))},
        )

    stopped = rec_with("c", 3)
    stopped.outcome, stopped.costs = "xfailed", {"train": {"steps": [], "graphs": {}, "memory": {}}}
    old = column("2.6.0", [rec_with("a", 3), rec_with("b", 3), rec_with("self", 3, family="costs"), stopped])
    new = column("2.7.0", [rec_with("a", 5), rec_with("b", 3), rec_with("self", 9, family="costs"), rec_with("c", 3)])
    (step,) = consecutive_changes([old, new])
    assert [(m.case.split("::")[1], m.change.item, m.change.detail) for m in step.moved] == [
        ("a", "step0", "all-gather 3 -> 5 (+64 KiB per device)")
    ]
    assert step.compared == 2
    text = "\n".join(to_markdown([old, new]))
    assert "### 2.6.0 -> 2.7.0: 1 item(s) changed in 2 loop(s) measured in both" in text


def test_cost_section_shows_each_loops_graph_memory_and_live_tensors_per_release():
    """Memory is shown per column, not only where it changed: a reader compares 2.4 and 2.9 at a glance."""
    from harness import costs
    from harness.matrix.costchanges import memory_cell, to_markdown
    from tests.test_costs import signature

    def rec_with(name: str, temp: int | None, live: list[int] | None, outcome: str = "passed") -> CaseRecord:
        sig = costs.comparable(signature(temp=temp, live=live))
        return CaseRecord(nodeid=f"cases/test_x.py::{name}", family="x", outcome=outcome, costs={"train": sig})

    old = column("2.4.0", [rec_with("vit", 115792, [34, 34, 34]), rec_with("stops", 100, [1, 1, 1], "xfailed")])
    new = column("2.9.0", [rec_with("vit", 97380, [34, 34, 35]), rec_with("stops", 100, [1, 1, 1])])
    host_only = column("2.9.1", [rec_with("vit", None, None)])  # a loop with no device memory recorded
    text = "\n".join(to_markdown([old, new, host_only]))
    assert "### Memory per release" in text
    assert (
        "| `cases/test_x.py::vit` | train | step0 temp 113.1 KiB, peak 121.1 KiB; live after step2: 34 tensors "
        "(1.1 KiB) | step0 temp 95.1 KiB, peak 103.1 KiB; live after step2: 35 tensors (1.1 KiB) | - |"
    ) in text
    # A case that stopped mid-loop on a release carrying its bug shows no memory there.
    assert (
        "| `cases/test_x.py::stops` | train | - | step0 temp 100 B, peak 8.1 KiB; live after step2: 1 tensors (32 B) | - |"
        in text
    )
    assert memory_cell(costs.comparable(signature())) is None


def test_memory_per_release_shows_the_footprint_the_step_peak_and_native_growth():
    from harness import costs
    from harness.matrix.costchanges import to_markdown
    from tests.test_costs import signature

    sig = signature(temp=1024, live=[3, 3, 3])
    for step in sig["steps"]:
        step["live"].update(footprint_bytes=3686, step_peak_bytes=3686 + 1024)
    record = CaseRecord(nodeid="cases/test_x.py::vit", family="x", outcome="passed", costs={"train": sig})
    record.costs["train"] = costs.comparable(sig) | {"native": {"heap_bytes": 2048, "rss_bytes": 0}}
    text = "\n".join(to_markdown([column("2.9.0", [record])]))
    assert (
        "| `cases/test_x.py::vit` | train | step0 temp 1 KiB, peak 9 KiB; live after step2: 3 tensors (96 B); "
        "footprint 3.6 KiB, step peak 4.6 KiB; native heap +2 KiB, resident set +0 B per step |"
    ) in text


def test_a_not_reproduced_entry_expects_its_guard_to_pass_on_every_release(tmp_path: Path):
    path = tmp_path / "reported.toml"
    path.write_text(
        '[[bug]]\nid = "reported"\ntitle = "t"\nupstream_issue = "x#9"\nstatus = "not-reproduced"\n'
        'signatures = ["distorted mesh"]\n'
    )
    registry = load_registry(path)
    matrix = build_matrix(
        registry,
        [
            column("2.4.0", [rec("a", "passed", "reported", "2.4.0")]),
            column("2.9.0", [rec("a", "passed", "reported", "2.9.0")]),
        ],
    )
    assert matrix.agrees and all(matrix.cell("reported", v).expected is State.FIXED for v in ("2.4.0", "2.9.0"))
    assert "| `reported` | `none (reported, not reproduced)` | fixed (1) | fixed (1) |" in render.to_markdown(
        matrix, "cmd"
    )
    sighted = build_matrix(registry, [column("2.9.0", [rec("a", "failed", "reported", "2.9.0", "AssertionError: x")])])
    assert not sighted.agrees
