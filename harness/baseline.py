"""Sharding baselines: what every case's tensors were sharded as, kept in the repository.

Bug 2b is the typical SPMD regression: nothing raises, the numbers still match CPU, and a tensor
is quietly `{replicated}`. A case asserts what it names; the baseline catches a change of any
sharding a case records (`ctx.record_sharding`). One file per backend and device count,
`baselines/shardings/<backend>-<devices>.json`, keyed by case node id and tensor name, holding
the canonical text of harness.sharding (an iota and an explicit device list compare equal; a
different device assignment does not), and the torch_xla version it was taken on.

Judging (harness.plugin, after the known-bug registry): a passing case whose shardings differ
from its entry fails on the baseline's *release line* (the same major.minor torch_xla, nightlies
and +git builds of it included) with a per-tensor diff; on other releases the difference is
recorded and reported, not failed. Tensors a case records that its entry lacks are reported as
new (`--update-shardings` adds them), never failed: recording more must not break a run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

from packaging.version import InvalidVersion, Version

from harness.errors import HarnessUsageError
from harness.sharding import ShardingParseError, format_sharding, parse_sharding

BASELINE_DIR = Path("baselines") / "shardings"  # under the repository root (pytest's rootdir)


def default_path(root: Path, backend: str, devices: int) -> Path:
    return root / BASELINE_DIR / f"{backend}-{devices}.json"


def canonical(spec: str) -> str:
    """The one text of a sharding: iota forms spelled out, metadata dropped. Unparsable text stays as is."""
    try:
        return format_sharding(parse_sharding(spec))
    except ShardingParseError:
        return spec


@dataclasses.dataclass(frozen=True)
class Change:
    tensor: str
    before: str | None  # None: the tensor is new
    after: str | None  # None: the tensor disappeared

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.tensor}: new, {_shown(self.after)} (not in the baseline)"
        if self.after is None:
            return f"{self.tensor}: {_shown(self.before)} -> no longer recorded"
        return f"{self.tensor}: {_shown(self.before)} -> {_shown(self.after)}"


def _shown(spec: str | None) -> str:
    return spec or "''"  # torch_xla's text for "no sharding annotation"


@dataclasses.dataclass
class Baseline:
    path: Path
    backend: str
    devices: int
    torch_xla: str | None
    cases: dict[str, dict[str, str]]

    @classmethod
    def load(cls, path: Path, backend: str, devices: int) -> "Baseline | None":
        """The baseline at path, or None where there is none yet; a broken file is a usage error."""
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return cls(path, data["backend"], int(data["devices"]), data.get("torch_xla"),
                       {case: dict(tensors) for case, tensors in data["cases"].items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HarnessUsageError(f"sharding baseline {path} cannot be read ({exc}); fix it or rewrite it "
                                    "with --update-shardings") from None

    @classmethod
    def empty(cls, path: Path, backend: str, devices: int) -> "Baseline":
        return cls(path, backend, devices, None, {})

    def on_release_line(self, version: str | None) -> bool:
        """Whether `version` is on the release line the baseline was taken on (same major.minor)."""
        if version is None or self.torch_xla is None:
            return False
        try:
            return Version(version).release[:2] == Version(self.torch_xla).release[:2]
        except InvalidVersion:
            return False

    def compare(self, case: str, observed: Mapping[str, str]) -> list[Change] | None:
        """Per-tensor changes against the case's entry; None when the baseline has no entry for it."""
        expected = self.cases.get(case)
        if expected is None:
            return None
        seen = {name: canonical(spec) for name, spec in observed.items()}
        changes = [Change(name, expected[name], seen.get(name)) for name in sorted(expected)
                   if expected[name] != seen.get(name)]
        changes += [Change(name, None, seen[name]) for name in sorted(set(seen) - set(expected))]
        return changes

    def update(self, case: str, observed: Mapping[str, str], torch_xla: str | None) -> list[Change]:
        """Set the case's entry to what it observed; return what changed."""
        before = self.cases.get(case, {})
        after = {name: canonical(spec) for name, spec in observed.items()}
        self.cases[case] = after
        self.torch_xla = torch_xla or self.torch_xla
        names = sorted(set(before) | set(after))
        return [Change(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]

    def save(self) -> None:
        """Sorted, one tensor per line: a reviewable diff in a pull request."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"backend": self.backend, "devices": self.devices, "torch_xla": self.torch_xla,
                "cases": {case: dict(sorted(t.items())) for case, t in sorted(self.cases.items())}}
        self.path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def is_drift(changes: list[Change] | None) -> bool:
    """A change that fails a case: a tensor whose sharding moved or that vanished (not a new one)."""
    return bool(changes) and any(c.before is not None for c in changes)
