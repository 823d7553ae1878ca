"""The known-bug registry: the shipped file loads, and each judgement comes out as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import RegistryError
from harness.registry import REGISTRY_PATH, JudgementKind, check_disjoint, get_entry, judge, load_registry

pytestmark = pytest.mark.selftest

SCALAR = "fsdpv2-scalar-param-spec"  # carried_by <2.7.0.dev20250125, TypeError signature
OPEN = "fsdpv2-params-left-replicated"  # open upstream: carried by every release


def test_shipped_registry_loads_with_every_family():
    registry = load_registry(REGISTRY_PATH)
    assert {
        "fsdpv2-scalar-param-spec",
        "sharding-on-view-lacks-annotation",
        "dtensor-parallelize-module-forward",
        "megascale-guard-deleted-by-nesting",
    } <= set(registry)
    for entry in registry.values():
        assert entry.signatures, f"{entry.id} has no signature, so it could never be reproduced"
        assert entry.upstream_issue, f"{entry.id} names no upstream issue"


@pytest.mark.parametrize(
    "entry_id, version, evidence, kind",
    [
        # 2.6.0 carries bug 1 and fails with its TypeError: the bug reproduced.
        pytest.param(SCALAR, "2.6.0", "TypeError: unhashable type: 'list'", JudgementKind.REPRODUCED, id="reproduced"),
        # 2.6.0 carries it but the case passed: the entry or the case is wrong.
        pytest.param(SCALAR, "2.6.0", None, JudgementKind.UNEXPECTED_PASS, id="unexpected-pass"),
        # 2.9.0 is fixed and passes.
        pytest.param(SCALAR, "2.9.0", None, JudgementKind.PASSED, id="fixed-passes"),
        # 2.9.0 fails with the old signature: it came back.
        pytest.param(SCALAR, "2.9.0", "TypeError: unhashable type: 'list'", JudgementKind.REGRESSED, id="regressed"),
        # A carrying release fails some other way: a new failure, not the known bug.
        pytest.param(SCALAR, "2.6.0", "RuntimeError: something else", JudgementKind.FAILED, id="other-signature"),
        # Nightlies: the day before the fix reached nightlies carries it, the day after does not.
        pytest.param(
            SCALAR,
            "2.7.0.dev20250124",
            "TypeError: unhashable type: 'list'",
            JudgementKind.REPRODUCED,
            id="nightly-before-fix",
        ),
        pytest.param(SCALAR, "2.7.0.dev20250126", None, JudgementKind.PASSED, id="nightly-after-fix"),
        # A PR build of a later release (local version label) is past every fix.
        pytest.param(SCALAR, "2.10.0+gitabc1234", None, JudgementKind.PASSED, id="pr-wheel"),
        # An open bug is carried by the newest release too.
        pytest.param(
            OPEN,
            "2.9.0",
            "AssertionError: 16 of 16 parameters left {replicated} instead of sharded",
            JudgementKind.REPRODUCED,
            id="open-bug",
        ),
        # No torch_xla version (fake backend): the registry is not applied.
        pytest.param(SCALAR, None, "TypeError: unhashable type: 'list'", JudgementKind.UNJUDGED, id="no-version"),
    ],
)
def test_judgement(entry_id, version, evidence, kind):
    judgement = judge(get_entry(entry_id), version, evidence)
    assert judgement.kind is kind, judgement.message


def test_unexpected_pass_tells_the_maintainer_what_to_update():
    message = judge(get_entry(SCALAR), "2.6.0", None).message
    assert "harness/known_bugs.toml" in message and "carried_by" in message


def test_unknown_entry_names_the_known_ones():
    with pytest.raises(RegistryError, match="no known-bug entry 'nosuch'.*fsdpv2-scalar-param-spec"):
        get_entry("nosuch")


@pytest.mark.parametrize(
    "body, message",
    [
        pytest.param(
            '[[bug]]\nid="x"\ntitle="t"\nstatus="open"\ncarried_by="<<2"\nsignatures=["a"]\n',
            "not a PEP 440 specifier",
            id="bad-specifier",
        ),
        pytest.param(
            '[[bug]]\nid="x"\ntitle="t"\nstatus="maybe"\ncarried_by="<2"\nsignatures=["a"]\n',
            "status must be",
            id="bad-status",
        ),
        pytest.param('[[bug]]\nid="x"\ntitle="t"\n', "lacks", id="missing-fields"),
        # A misspelt status is named, not taken for an entry without carried_by.
        pytest.param(
            '[[bug]]\nid="x"\ntitle="t"\nstatus="not_reproduced"\nsignatures=["a"]\n',
            "status must be 'fixed', 'open' or 'not-reproduced', not the string 'not_reproduced'",
            id="misspelt-status",
        ),
    ],
)
def test_malformed_registry_is_a_typed_error(tmp_path: Path, body, message):
    path = tmp_path / "bugs.toml"
    path.write_text(body)
    with pytest.raises(RegistryError, match=message):
        load_registry(path)


JUDGED_CASES = """
import pytest
pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def body_list_spec(ctx):
    raise TypeError("unhashable type: 'list'")

def body_ok(ctx):
    pass

def body_other(ctx):
    raise RuntimeError("a brand new failure")

@pytest.mark.known_bug("fsdpv2-scalar-param-spec")
def test_reproduces(spmd):
    spmd.run(body_list_spec)

@pytest.mark.known_bug("fsdpv2-scalar-param-spec")
def test_passes(spmd):
    spmd.run(body_ok)

@pytest.mark.known_bug("fsdpv2-scalar-param-spec")
def test_other(spmd):
    spmd.run(body_other)
"""


@pytest.mark.parametrize(
    "version, outcomes, lines",
    [
        # A carrying release: reproduced -> xfail naming the entry; a pass -> failure; other error -> failure.
        pytest.param(
            "2.6.0",
            dict(xfailed=1, failed=2),
            [
                "XFAIL*test_reproduces*known bug fsdpv2-scalar-param-spec (pytorch/xla#8522) on torch_xla 2.6.0*",
                "FAILED*test_passes*",
                "FAILED*test_other*",
            ],
            id="carrying-release",
        ),
        # A fixed release: the old signature is a regression, a pass is a pass.
        pytest.param(
            "2.9.0", dict(passed=1, failed=2), ["FAILED*test_reproduces*", "FAILED*test_other*"], id="fixed-release"
        ),
    ],
)
def test_plugin_applies_the_registry_end_to_end(pytester, monkeypatch, version, outcomes, lines):
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", version)
    pytester.makepyfile(test_judged=JUDGED_CASES)
    result = pytester.runpytest_subprocess("--spmd-backend", "fake", "-p", "no:cacheprovider", "-rxf")
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines_random(lines)
    if version == "2.9.0":
        result.stdout.fnmatch_lines(["*REGRESSION? torch_xla 2.9.0 fails with the signature of known bug*"])


# --------------------------------------------------------------------------------------------
# A case that names several entries: the one whose carried_by holds the release judges it
# --------------------------------------------------------------------------------------------

NO_GUARD = "megascale-no-guard"  # <2.6.0
PRESET = "megascale-preset-dropped-by-trace-pallas"  # >=2.6.0rc1,<2.7.0.dev20250313
NOT_TRUE = "AssertionError: SKIP_MEGASCALE_PJRT_CLIENT was not 'true' while trace_pallas traced the kernel"
NOT_RESTORED = "AssertionError: SKIP_MEGASCALE_PJRT_CLIENT not restored by trace_pallas: 'true' before, None after"


@pytest.mark.parametrize(
    "version, evidence, kind, entry",
    [
        # 2.5.1 has no guard at all: judged by megascale-no-guard, not by the 2.6 entry.
        pytest.param("2.5.1", NOT_TRUE, JudgementKind.REPRODUCED, NO_GUARD, id="2.5.1-no-guard"),
        # 2.6.0's inline guard pops a preset value: the 2.6 entry judges it.
        pytest.param("2.6.0", NOT_RESTORED, JudgementKind.REPRODUCED, PRESET, id="2.6.0-preset-dropped"),
        # 2.9.0 is outside both windows and passes.
        pytest.param("2.9.0", None, JudgementKind.PASSED, PRESET, id="2.9.0-fixed"),  # recorded against the first named
        # 2.9.0 failing with one entry's signature is that entry's regression.
        pytest.param("2.9.0", NOT_RESTORED, JudgementKind.REGRESSED, PRESET, id="2.9.0-regressed"),
        # 2.5.1 failing with the 2.6 entry's symptom only is not what 2.5.1 is known for.
        pytest.param("2.5.1", NOT_RESTORED, JudgementKind.FAILED, NO_GUARD, id="2.5.1-other-symptom"),
    ],
)
def test_several_entries_are_judged_by_the_one_that_holds_the_release(version, evidence, kind, entry):
    judgement = judge([get_entry(PRESET), get_entry(NO_GUARD)], version, evidence)
    assert (judgement.kind, judgement.entry) == (kind, entry), judgement.message


def test_entries_that_claim_the_same_release_are_refused():
    with pytest.raises(RegistryError, match="both claim torch_xla"):
        check_disjoint([get_entry(SCALAR), get_entry("fsdpv2-scalar-output-spec")])
    check_disjoint([get_entry(PRESET), get_entry(NO_GUARD)])  # disjoint windows: fine


def test_an_unknown_entry_suggests_the_closest_ids():
    with pytest.raises(RegistryError, match="did you mean fsdpv2-scalar-param-spec"):
        get_entry("fsdpv2-scalar-param-specs")


# --------------------------------------------------------------------------------------------
# Development builds: pytorch/xla CI's +git<sha> wheels and dated nightlies
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, carried",
    [
        # A +git build is judged as its public version, the release its branch becomes.
        pytest.param("2.6.0+git1a2b3c4", True, id="git-build-of-a-carrying-release"),
        pytest.param("2.9.0+gitdeadbee", False, id="git-build-of-a-fixed-release"),
        pytest.param("2.5.1+cu121", True, id="other-local-label"),
        # Nightlies are placed by their date.
        pytest.param("2.7.0.dev20250124", True, id="nightly-before-the-fix"),
        pytest.param("2.7.0.dev20250125", False, id="nightly-of-the-fix-day"),
        pytest.param("2.7.0.dev20250124+git1a2b3c4", True, id="nightly-with-a-local-label"),
    ],
)
def test_development_builds_are_placed_against_carried_by(version, carried):
    assert get_entry(SCALAR).carried_by_release(version) is carried


def test_the_judgement_message_keeps_the_exact_version_string():
    message = judge(get_entry(SCALAR), "2.6.0+git1a2b3c4", "TypeError: unhashable type: 'list'").message
    assert "torch_xla 2.6.0+git1a2b3c4" in message


def test_a_version_that_is_not_pep_440_is_a_clear_error():
    with pytest.raises(RegistryError, match="not a PEP 440 version"):
        get_entry(SCALAR).carried_by_release("nightly-latest")


# --------------------------------------------------------------------------------------------
# The verdict comes first: the FAILED line, the first line of the failure and the JUnit message
# --------------------------------------------------------------------------------------------


def test_a_regressed_known_bug_leads_with_the_verdict(pytester, monkeypatch):
    monkeypatch.setenv("HARNESS_FAKE_TORCH_XLA", "2.9.0")
    pytester.makepyfile(test_judged=JUDGED_CASES)
    result = pytester.runpytest_subprocess(
        "--spmd-backend=fake",
        "-p",
        "no:cacheprovider",
        "--junitxml=junit.xml",
        "-rf",
        "-k",
        "test_reproduces or test_other",
    )
    result.assert_outcomes(failed=2)
    # The short summary is cut to the terminal's width (80 columns here).
    result.stdout.fnmatch_lines(["FAILED test_judged.py::test_reproduces - REGRESSION? torch_xla 2.9.0*"])
    # A marked case that failed otherwise: its line leads with its own cause; the registry's word
    # ("failed on torch_xla 2.9.0; not the signature of ...") leads its section above.
    result.stdout.fnmatch_lines(["FAILED test_judged.py::test_other - *RuntimeError: a brand new failure*"])
    result.stdout.fnmatch_lines(["failed on torch_xla 2.9.0; not the signature of fsdpv2-scalar-param-spec*"])
    # In the failure's own section, the verdict is the first line after the header.
    lines = result.outlines
    header = next(i for i, line in enumerate(lines) if line.strip("_ ").startswith("test_reproduces"))
    assert lines[header + 1].startswith("REGRESSION? torch_xla 2.9.0"), lines[header : header + 4]
    junit = (pytester.path / "junit.xml").read_text()
    assert 'message="REGRESSION? torch_xla 2.9.0 fails with the signature' in junit


def test_a_skip_for_unmet_needs_is_reported_at_the_case(pytester):
    pytester.makepyfile(
        test_needs="""
import pytest

@pytest.mark.spmd
@pytest.mark.needs(devices=64, xla=False)
def test_big(spmd):
    pass
"""
    )
    result = pytester.runpytest_subprocess("--spmd-backend=fake", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED ?1? test_needs.py:?: needs 64 devices; backend fake has 4"])


ENTRY = """[[bug]]
id = "demo"
title = "a demo bug"
upstream_issue = "pytorch/xla#1"
status = "{status}"
carried_by = "{carried_by}"
signatures = ['{signature}']
"""


def _registry(
    tmp_path: Path, status="open", carried_by=">=2.4", signature=r"unhashable type: \(list\)", name="copy.toml"
) -> Path:
    path = tmp_path / name  # a new name for each file: load_registry caches by path
    path.write_text(ENTRY.format(status=status, carried_by=carried_by, signature=signature))
    return path


def test_hints_name_the_registry_in_use_not_the_shipped_one(tmp_path: Path):
    """With --spmd-known-bugs=COPY the maintainer must edit COPY (issue 29, item 3)."""
    copy = _registry(tmp_path)
    message = judge(get_entry("demo", copy), "2.9.0", None).message
    assert str(copy) in message and "harness/known_bugs.toml" not in message
    other = _registry(tmp_path, carried_by="<2.7", name="other.toml")
    with pytest.raises(RegistryError) as caught:
        check_disjoint([get_entry("demo", copy), load_registry(other)["demo"]])
    assert str(copy) in str(caught.value) and "known_bugs.toml" not in str(caught.value)


@pytest.mark.parametrize("carried_by", [">=2.4", ">=2.4,!=2.5.0", "!=2.6.0"])
def test_a_fixed_bug_needs_an_upper_bound(tmp_path: Path, carried_by: str):
    with pytest.raises(
        RegistryError, match=r'status = "fixed" but carried_by = .* has no upper bound.*status = "open"'
    ):
        load_registry(_registry(tmp_path, status="fixed", carried_by=carried_by))


@pytest.mark.parametrize("carried_by", ["<2.7", ">=2.4,<=2.6.0", "~=2.5.0", "==2.5.*"])
def test_a_fixed_bug_with_a_bounded_window_loads(tmp_path: Path, carried_by: str):
    assert load_registry(_registry(tmp_path, status="fixed", carried_by=carried_by))["demo"].status == "fixed"


def test_regular_expressions_are_shown_as_written(tmp_path: Path):
    entry = get_entry("demo", _registry(tmp_path))
    written = r"unhashable type: \(list\)"
    reproduced = judge(entry, "2.9.0", "TypeError: unhashable type: (list)").message
    new_failure = judge(entry, "2.9.0", "ValueError: other").message
    for message in (reproduced, new_failure):
        assert f'"{written}"' in message and "\\\\" not in message, message
    with pytest.raises(RegistryError) as caught:
        load_registry(_registry(tmp_path, signature=r"\d(unclosed", name="bad.toml"))
    assert r'"\d(unclosed"' in str(caught.value)


NOT_REPRODUCED_ENTRY = """
[[bug]]
id = "reported"
title = "reported upstream, reproduced by no release"
upstream_issue = "pytorch/xla#1"
status = "not-reproduced"
signatures = ["distorted mesh"]
"""


def test_a_not_reproduced_bug_carries_no_release_and_its_sighting_fails(tmp_path: Path):
    path = tmp_path / "reported.toml"
    path.write_text(NOT_REPRODUCED_ENTRY + ENTRY.format(status="open", carried_by=">=2.4", signature="other"))
    registry = load_registry(path)
    reported, demo = registry["reported"], registry["demo"]
    assert not any(reported.carried_by_release(v) for v in ("2.4.0", "2.9.0", "2.10.0.dev20260101"))
    assert reported.window == "none (reported, not reproduced)"
    check_disjoint([reported, demo])  # it claims no release
    passed = judge(reported, "2.9.0", None)
    assert passed.kind is JudgementKind.PASSED and "none (reported, not reproduced)" in passed.message
    seen = judge(reported, "2.9.0", "AssertionError: a distorted mesh")
    assert seen.kind is JudgementKind.REGRESSED and seen.message.startswith("FIRST SIGHTING? torch_xla 2.9.0")
    assert str(path) in seen.message
    # Named beside an entry that holds the release: a failure matching neither stays a new failure,
    # one matching the reported bug only is its first sighting, the holder's own signature reproduces.
    assert judge([demo, reported], "2.9.0", "ValueError: x").kind is JudgementKind.FAILED
    assert judge([demo, reported], "2.9.0", "distorted mesh").entry == "reported"
    assert judge([demo, reported], "2.9.0", "other").kind is JudgementKind.REPRODUCED
    assert judge(reported, "2.9.0", "ValueError: x").kind is JudgementKind.FAILED


def test_a_not_reproduced_bug_with_a_window_is_refused(tmp_path: Path):
    path = tmp_path / "windowed.toml"
    path.write_text(NOT_REPRODUCED_ENTRY.replace("signatures", 'carried_by = ">=2.4"\nsignatures'))
    with pytest.raises(RegistryError, match='status = "not-reproduced" takes no carried_by'):
        load_registry(path)


def test_a_regression_names_the_fix_or_the_window_never_empty_parentheses():
    """An open entry has no fix version: a build outside its carried_by that fails its way names the
    window instead (a fork built before the release the entry starts at)."""
    fixed = judge(get_entry(SCALAR), "2.9.0", "TypeError: unhashable type: 'list'")
    assert f"is fixed there ({get_entry(SCALAR).fix})" in fixed.message
    opened = judge(get_entry(OPEN), "2.3.0", "AssertionError: 16 of 16 parameters left {replicated} instead of sharded")
    assert opened.kind is JudgementKind.REGRESSED
    assert "is fixed there (carried_by >=2.4)" in opened.message and "()" not in opened.message


@pytest.mark.parametrize("moves", ['"native heap"', '["native memory"]', "[1]"])
def test_moves_names_only_the_figures_a_reproduced_case_is_judged_on(tmp_path: Path, moves: str):
    path = _registry(tmp_path)
    path.write_text(path.read_text() + f"moves = {moves}\n")
    with pytest.raises(RegistryError, match=r'moves must be a list .*"native heap", "resident set"'):
        load_registry(path)


def test_what_a_bug_moves_is_excused_and_nothing_else(tmp_path: Path):
    """A reproduced bug whose mechanism keeps native memory (scan_layers' retraces held from C++) is
    not judged on the native heap; its resident set still is (harness.judges.excused)."""
    from harness.judges.excused import names_figure

    path = _registry(tmp_path)
    path.write_text(path.read_text() + 'moves = ["native heap"]\n')
    entry = load_registry(path)["demo"]
    assert entry.moves == ("native heap",)
    assert names_figure([entry], ("native heap",)) and not names_figure([entry], ("resident set",))
    assert not names_figure([get_entry("demo", _registry(tmp_path, name="plain.toml"))], ("native heap",))


@pytest.mark.parametrize("drawn", ['"true"', "1", "[true]"])
def test_drawn_programs_is_a_boolean(tmp_path: Path, drawn: str):
    path = _registry(tmp_path)
    path.write_text(path.read_text() + f"drawn_programs = {drawn}\n")
    with pytest.raises(RegistryError, match=r"drawn_programs must be true or false \(unquoted\)"):
        load_registry(path)


def test_the_searches_pass_over_only_entries_written_for_drawn_programs():
    """An entry written for its own case (DTensor's "Check failed: xtensor") explains no drawn
    program: the metamorphic search on 2.4.0 passed such failures over as that DTensor bug."""
    from types import SimpleNamespace

    from harness.oracles import search

    config = SimpleNamespace(option=SimpleNamespace(), getini=lambda name: "", inipath=None)
    chosen = {entry.id for entry in search.registry_entries(config)}
    assert "dtensor-parallelize-module-forward" not in chosen
    assert {"scatter-add-uneven-src-aborts", "functionalization-off-adds-collectives"} <= chosen
