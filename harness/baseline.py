"""Sharding baselines: what every case's tensors were sharded as, kept in the repository.

Bug 2b is the typical SPMD regression: nothing raises, the numbers still match CPU, and a tensor
is quietly `{replicated}`. A case asserts what it names; the baseline catches a change of any
sharding a case records (`ctx.record_sharding`). One file per backend and device count,
`baselines/shardings/<backend>-<devices>.json`, keyed by case (results.case_id) and tensor name, holding
the canonical text of each sharding (harness.sharding.canonical_text: an iota and an explicit
device list compare equal; a different device assignment does not), and the torch_xla version
it was taken on.

Judging (Baseline.check; harness.plugin asks it after the known-bug registry): a passing case
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

from packaging.version import InvalidVersion, Version

from harness.errors import BaselineError, HarnessError
from harness.schema import shown, unknown_keys
from harness.sharding import canonical_text
from harness.tiles import grids_side_by_side, is_multi_axis

BASELINE_DIR = Path("baselines") / "shardings"  # under the repository root (pytest's rootdir)


def default_path(root: Path, backend: str, devices: int) -> Path:
    return root / BASELINE_DIR / f"{backend}-{devices}.json"


@dataclasses.dataclass(frozen=True)
class ShardingChange:
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


@dataclasses.dataclass(frozen=True)
class CaseCheck:
    """What the baseline says of one passing case's shardings (Baseline.check)."""

    changes: list[ShardingChange]  # against the case's entry; empty: the case matches it
    failure: str | None = None  # the case fails with this text (drift on the baseline's release line)
    heading: str = ""  # otherwise, where there are changes: the title they are reported under
    listing: str = ""  # the changes, a line per tensor, with device grids where they help (listing())


@dataclasses.dataclass
class Baseline:
    path: Path
    backend: str
    devices: int
    torch_xla: str | None
    cases: dict[str, dict[str, str]]

    @classmethod
    def load(cls, path: Path, backend: str, devices: int) -> Baseline | None:
        """The baseline at path, or None where there is none yet.

        A file that is not a baseline, or a baseline of another backend or device count, is a
        BaselineError (a usage error): used, it would fail or pass cases on shardings it cannot
        predict; ignored, it would switch the drift check off without a word.
        """
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise BaselineError(f"sharding baseline {path} cannot be read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise BaselineError(f"sharding baseline {path} is not valid JSON ({exc}); {REWRITE}") from None
        base = cls(path, *_checked_fields(data, f"sharding baseline {path}"))
        differ = [
            field
            for field, theirs, ours in (("backend", base.backend, backend), ("devices", base.devices, devices))
            if theirs != ours
        ]
        if differ:
            raise BaselineError(
                f"sharding baseline {path} was taken on backend {base.backend!r} with {base.devices} devices "
                f"(its {' and '.join(differ)} field{'s' if len(differ) > 1 else ''}); this run uses backend {backend} "
                f"with {devices} devices, whose shardings that baseline does not predict. Point --spmd-shardings-baseline "
                f"at a baseline of this backend and device count (default: {BASELINE_DIR}/{backend}-{devices}.json), "
                f"or write one: --spmd-update-shardings --spmd-shardings-baseline=NEW.json"
            )
        return base

    @classmethod
    def empty(cls, path: Path, backend: str, devices: int) -> Baseline:
        return cls(path, backend, devices, None, {})

    def on_release_line(self, version: str | None) -> bool:
        """Whether `version` is on the release line the baseline was taken on (same major.minor)."""
        return on_release_line(version, self.torch_xla)

    def compare(self, case: str, observed: Mapping[str, str]) -> list[ShardingChange] | None:
        """Per-tensor changes against the case's entry; None when the baseline has no entry for it."""
        expected = self.cases.get(case)
        if expected is None:
            return None
        seen = {name: canonical_text(spec) for name, spec in observed.items()}
        changes = [
            ShardingChange(name, expected[name], seen.get(name))
            for name in sorted(expected)
            if expected[name] != seen.get(name)
        ]
        changes += [ShardingChange(name, None, seen[name]) for name in sorted(set(seen) - set(expected))]
        return changes

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
        before = self.cases.get(case, {})
        after = {name: canonical_text(spec) for name, spec in observed.items()}
        self.cases[case] = after
        self.torch_xla = torch_xla or self.torch_xla
        names = sorted(set(before) | set(after))
        return [ShardingChange(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]

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


BASELINE_KEYS = ("backend", "devices", "torch_xla", "cases")
REWRITE = "fix it, or delete it and write it again with --spmd-update-shardings"


def checked_header(
    data: Any, where: str, error: type[HarnessError], rewrite: str, kind: str
) -> tuple[str, int, str | None, Any]:
    """backend, devices, torch_xla and (unchecked) cases of a baseline file, each of the type
    save() writes. Shared by the sharding and the cost baseline (harness.costbaseline); `kind`
    names what the file predicts ("shardings", "costs")."""
    if not isinstance(data, dict):
        raise error(f"{where} holds {shown(data)}, not an object with {', '.join(BASELINE_KEYS)}; {rewrite}")
    unknown = unknown_keys(data, BASELINE_KEYS)
    if unknown:
        raise error(f"{where}: {unknown}")
    missing = [key for key in ("backend", "devices", "cases") if key not in data]
    if missing:
        raise error(f"{where} lacks {', '.join(missing)}; {rewrite}")
    backend, devices, version, cases = data["backend"], data["devices"], data.get("torch_xla"), data["cases"]
    if not isinstance(backend, str) or not backend:
        raise error(f'{where}: backend must be a backend name, e.g. "cpu"; got {shown(backend)}')
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise error(f"{where}: devices must be a whole number, e.g. 4; got {shown(devices)}")
    if version is not None:
        try:
            Version(version if isinstance(version, str) else "")
        except InvalidVersion:
            raise error(
                f"{where}: torch_xla {version!r} is not a PEP 440 version, so no run could be placed on its "
                f"release line and a change of {kind} would never fail a case; set it to the torch_xla the "
                f'baseline was taken on (e.g. "2.9.0"), or {rewrite.removeprefix("fix it, or ")}'
            ) from None
    return backend, devices, version, cases


def on_release_line(version: str | None, baseline_version: str | None) -> bool:
    """Whether `version` is on the release line a baseline was taken on (same major.minor:
    nightlies and +git builds of it included)."""
    if version is None or baseline_version is None:
        return False
    try:
        return Version(version).release[:2] == Version(baseline_version).release[:2]
    except InvalidVersion:
        return False


def _checked_fields(data: Any, where: str) -> tuple[str, int, str | None, dict[str, dict[str, str]]]:
    """backend, devices, torch_xla and cases of a sharding baseline file."""
    backend, devices, version, cases = checked_header(data, where, BaselineError, REWRITE, "shardings")
    if not isinstance(cases, dict):
        raise BaselineError(f"{where}: cases must map case node ids to their tensors; got {shown(cases)}")
    for case, tensors in cases.items():
        if not isinstance(tensors, dict):
            raise BaselineError(f"{where}: case {case!r} must map tensor names to sharding text; got {shown(tensors)}")
        for name, spec in tensors.items():
            if not isinstance(spec, str):
                raise BaselineError(
                    f"{where}: case {case!r}, tensor {name!r}: {shown(spec)} is not sharding text "
                    f'(e.g. "{{replicated}}"); {REWRITE}'
                )
    return backend, devices, version, {case: dict(tensors) for case, tensors in cases.items()}


def summarise(
    terminalreporter: Any,
    kind: str,
    path: Path,
    updated: Mapping[str, list[Any]] | None,
    without_entry: list[str],
    update_flag: str,
    not_written: str | None = None,
) -> None:
    """The end-of-run section of a baseline (sharding or cost): what a rewrite changed, why an
    update wrote nothing, or the cases that had no entry to be compared with."""
    if not_written is not None:
        terminalreporter.section(f"{kind} baseline not written", red=True)
        terminalreporter.line(not_written, red=True)
    elif updated is not None:
        terminalreporter.section(f"{kind} baseline {path} rewritten for {len(updated)} case(s)")
        for case, changes in updated.items():
            if changes:
                terminalreporter.line(f"{case}:")
                for change in changes:
                    terminalreporter.line(f"  {change}")
        if not any(updated.values()):
            terminalreporter.line(f"no {kind} changed")
    elif without_entry:
        terminalreporter.section(f"cases without a {kind} baseline entry (not compared)")
        for case in without_entry:
            terminalreporter.line(case)
        terminalreporter.line(f"add them with {update_flag} ({path})")


def listing(changes: list[ShardingChange], indent: str = "  ") -> str:
    """One line per change; a move that involves a partially replicated or multi-axis sharding is
    followed by both layouts as device grids (harness.tiles), since the one-line text of two such
    shardings can differ only in a device list that says nothing at a glance."""
    lines = []
    for change in changes:
        lines.append(f"{indent}{change}")
        if (
            change.before is not None
            and change.after is not None
            and (is_multi_axis(change.before) or is_multi_axis(change.after))
        ):
            lines += [
                f"{indent}    {row}"
                for row in grids_side_by_side(change.before, change.after, ("baseline", "this run"))
            ]
    return "\n".join(lines)


def is_drift(changes: list[ShardingChange] | None) -> bool:
    """A change that fails a case: a tensor whose sharding moved or that vanished (not a new one)."""
    return any(c.before is not None for c in changes or ())
