"""Sharding baselines: what every case's tensors were sharded as, kept in the repository.

Bug 2b is the typical SPMD regression: nothing raises, the numbers still match CPU, and a tensor
is quietly `{replicated}`. A case asserts what it names; the baseline catches a change of any
sharding a case records (`ctx.record_sharding`). One file per backend and device count,
`baselines/shardings/<backend>-<devices>.json`, keyed by case (results.case_id) and tensor name, holding
the canonical text of each sharding (harness.sharding.canonical_text: an iota and an explicit
device list compare equal; a different device assignment does not), and the torch_xla version
it was taken on.

Judging (Baseline.check; harness.judges.shardingcheck asks it after the known-bug registry): a passing case
whose shardings differ from its entry fails on the baseline's *release line* (the same
major.minor torch_xla, nightlies and +git builds of it included) with a per-tensor diff; on other
releases the difference is recorded and reported, not failed. Tensors a case records that its
entry lacks are reported as new (`--spmd-update-shardings` adds them), never failed: recording
more must not break a run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.baselinefile import BaselineFile
from harness.errors import BaselineError
from harness.judges import shardingcompare
from harness.judges.shardingcompare import ShardingChange
from harness.schema import shown

BASELINE_DIR = Path("baselines") / "shardings"  # under the repository root (pytest's rootdir)


@dataclasses.dataclass(frozen=True)
class CaseCheck:
    """What the baseline says of one passing case's shardings (Baseline.check)."""

    changes: list[ShardingChange]  # against the case's entry; empty: the case matches it
    failure: str | None = None  # the case fails with this text (drift on the baseline's release line)
    heading: str = ""  # otherwise, where there are changes: the title they are reported under
    listing: str = ""  # the changes, a line per tensor, with device grids where they help (listing())


class Baseline(BaselineFile[dict[str, str]]):
    """The sharding baseline: per case, each recorded tensor's canonical sharding text."""

    KIND = "sharding"
    PREDICTS = "shardings"
    DIR = BASELINE_DIR
    OPTION = "spmd_shardings_baseline"
    FLAG = "--spmd-update-shardings"
    ENTRIES = "their tensors"
    ERROR = BaselineError

    @classmethod
    def checked_entry(cls, entry: Any, where: str) -> dict[str, str]:
        if not isinstance(entry, dict):
            raise BaselineError(f"{where} must map tensor names to sharding text; got {shown(entry)}")
        for name, spec in entry.items():
            if not isinstance(spec, str):
                raise BaselineError(
                    f"{where}, tensor {name!r}: {shown(spec)} is not sharding text "
                    f'(e.g. "{{replicated}}"); {cls.rewrite_hint()}'
                )
        return dict(entry)

    def compare(self, case: str, observed: Mapping[str, str]) -> list[ShardingChange] | None:
        """Per-tensor changes against the case's entry; None when the baseline has no entry for it."""
        expected = self.cases.get(case)
        return None if expected is None else shardingcompare.compare_by_role(expected, observed)

    def check(self, case: str, observed: Mapping[str, str], version: str | None, rewrite: str) -> CaseCheck | None:
        """The policy above, for a passing case that observed these shardings on torch_xla `version`;
        None when the baseline has no entry for it. `rewrite` is the shell command that rewrites the
        entry (harness.baselinefile.rewrite_command)."""
        changes = self.compare(case, observed)
        if changes is None:
            return None
        if not changes:
            return CaseCheck([])
        shown = listing(changes)
        if is_drift(changes) and self.on_release_line(version):
            return CaseCheck(
                changes,
                listing=shown,
                failure=(
                    f"sharding drift: {len(changes)} tensor(s) differ from {self.path.name} (taken on torch_xla "
                    f"{self.torch_xla}; this run: {version}):\n{shown}\nIf the change is intended, rewrite the "
                    f"entry: {rewrite}"
                ),
            )
        why = (
            "new tensors" if not is_drift(changes) else f"torch_xla {version} is not on {self.torch_xla}'s release line"
        )
        return CaseCheck(changes, heading=f"sharding changes (reported, not failed: {why})", listing=shown)

    def update(self, case: str, observed: Mapping[str, str], torch_xla: str | None) -> list[ShardingChange]:
        """Set the case's entry to what it observed; return what changed."""
        changes = shardingcompare.compare(self.cases.get(case, {}), observed)
        self.cases[case] = shardingcompare.canonical(observed)
        self.torch_xla = torch_xla or self.torch_xla
        return sorted(changes, key=lambda change: change.tensor)

    def render(self) -> str:
        """The file's text (harness.baselinefile.rewrite writes it): sorted, one tensor per line, a
        reviewable diff in a pull request."""
        data = {
            "backend": self.backend,
            "devices": self.devices,
            "torch_xla": self.torch_xla,
            "cases": {case: dict(sorted(t.items())) for case, t in sorted(self.cases.items())},
        }
        return json.dumps(data, indent=1, sort_keys=False) + "\n"


def listing(changes: list[ShardingChange], indent: str = "  ") -> str:
    """One line per change; a move that involves a partially replicated or multi-axis sharding is
    followed by both layouts as device grids (harness.tiles), since the one-line text of two such
    shardings can differ only in a device list that says nothing at a glance."""
    lines = []
    for change in changes:
        lines.append(f"{indent}{change}")
        lines += [f"{indent}    {row}" for row in change.grids(("baseline", "this run"))]
    return "\n".join(lines)


def is_drift(changes: list[ShardingChange] | None) -> bool:
    """A change that fails a case: a tensor whose sharding moved or that vanished (not a new one)."""
    return any(c.before is not None for c in changes or ())
