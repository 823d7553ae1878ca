"""The nightly differential search (harness.oracles.search) passes over what the registry names:
a failure a known-bug entry carried by the build explains is counted, never a finding. Found by
running the nightly tier on 2.9.0: the search drew a scatter_add with a src sharded unevenly
(scatter-add-uneven-src-aborts, an open entry) and failed the night on it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harness.oracles import runner, search
from harness.registry import get_entry

pytestmark = pytest.mark.selftest

ABORT = (
    "SIGABRT: F external/xla/xla/service/spmd/spmd_partitioner_util.h:127] Check failed: "
    "ShapeUtil::IsScalarWithElementType(value.shape(), primitive_type)"
)


@pytest.fixture
def every_program_aborts(monkeypatch):
    def check_programs(spmd: Any, programs: list[dict], **_: Any) -> list[dict[str, str]]:
        return [{"status": "crashed", "detail": ABORT} for _ in programs]

    monkeypatch.setattr(runner, "check_programs", check_programs)


def children_of(version: str) -> Any:
    return SimpleNamespace(results=[SimpleNamespace(torch_xla=version)])


def test_a_failure_a_carried_entry_explains_is_counted_not_found(every_program_aborts):
    spmd = children_of("2.9.0")
    entry = get_entry("scatter-add-uneven-src-aborts")
    summary = search.search(spmd, 4, 0.5, batch=2, examples=2, explains=search.known_bugs(spmd, [entry]))
    assert summary.findings == []
    assert summary.known.get("scatter-add-uneven-src-aborts", 0) >= 1, summary
    assert "known bugs passed over: scatter-add-uneven-src-aborts x" in summary.line()


@pytest.mark.parametrize("version", ["2.3.0", None], ids=["release-not-carrying-it", "no-version-reported"])
def test_the_same_failure_is_a_finding_where_no_carried_entry_explains_it(every_program_aborts, version):
    spmd = SimpleNamespace(results=[SimpleNamespace(torch_xla=version)])
    entry = get_entry("scatter-add-uneven-src-aborts")
    summary = search.search(spmd, 4, 0.5, batch=2, examples=2, explains=search.known_bugs(spmd, [entry]))
    assert len(summary.findings) == 1 and summary.known == {}, summary
    assert "IsScalarWithElementType" in summary.findings[0].text()
