"""The known-bug registry (harness/known_bugs.toml) and the judgement of a case against it."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
from functools import lru_cache
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.errors import RegistryError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

REGISTRY_PATH = Path(__file__).with_name("known_bugs.toml")


@dataclasses.dataclass(frozen=True)
class KnownBug:
    id: str
    title: str
    upstream_issue: str
    fix: str
    status: str  # "fixed" | "open"
    carried_by: SpecifierSet
    signatures: tuple[re.Pattern[str], ...]

    def carried_by_release(self, version: str) -> bool:
        return self.carried_by.contains(parse_version(version), prereleases=True)

    def matching_signature(self, evidence: str) -> str | None:
        for pattern in self.signatures:
            if pattern.search(evidence):
                return pattern.pattern
        return None


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise RegistryError(f"torch_xla reported version {text!r}, which is not a PEP 440 version") from None


def _entry_from_table(table: dict) -> KnownBug:
    missing = {"id", "title", "carried_by", "signatures", "status"} - table.keys()
    if missing:
        raise RegistryError(f"registry entry {table.get('id', '?')!r} lacks {sorted(missing)}")
    try:
        carried = SpecifierSet(table["carried_by"])
    except InvalidSpecifier:
        raise RegistryError(f"entry {table['id']!r}: carried_by {table['carried_by']!r} is not a PEP 440 specifier set") from None
    if table["status"] not in ("fixed", "open"):
        raise RegistryError(f"entry {table['id']!r}: status must be 'fixed' or 'open', not {table['status']!r}")
    return KnownBug(
        id=table["id"], title=table["title"], upstream_issue=table.get("upstream_issue", ""),
        fix=table.get("fix", ""), status=table["status"], carried_by=carried,
        signatures=tuple(re.compile(s) for s in table["signatures"]),
    )


@lru_cache(maxsize=None)
def load_registry(path: Path = REGISTRY_PATH) -> dict[str, KnownBug]:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    entries = [_entry_from_table(t) for t in data.get("bug", [])]
    by_id = {e.id: e for e in entries}
    if len(by_id) != len(entries):
        raise RegistryError(f"{path}: duplicate entry ids")
    return by_id


def get_entry(entry_id: str, path: Path = REGISTRY_PATH) -> KnownBug:
    registry = load_registry(path)
    if entry_id not in registry:
        raise RegistryError(f"no known-bug entry {entry_id!r} in {path}; known: {', '.join(sorted(registry))}")
    return registry[entry_id]


class Verdict(enum.Enum):
    PASSED = "passed"  # fixed release, case passed
    REPRODUCED = "reproduced"  # carrying release, failed with a known signature -> xfail
    UNEXPECTED_PASS = "unexpected-pass"  # carrying release, passed -> failure: update the entry
    REGRESSED = "regressed"  # release outside carried_by fails with the bug's own signature
    FAILED = "failed"  # any other failure
    UNJUDGED = "unjudged"  # no torch_xla version known (fake backend): outcome stands as is


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    message: str
    signature: str | None = None


def judge(entry: KnownBug, version: str | None, evidence: str | None) -> Judgement:
    """evidence is None when the case passed, else the failure text to match signatures in."""
    if version is None:
        return Judgement(Verdict.UNJUDGED, f"no torch_xla version known; registry entry {entry.id} not applied")
    carried = entry.carried_by_release(version)
    where = f"torch_xla {version}"
    if evidence is None:
        if carried:
            return Judgement(Verdict.UNEXPECTED_PASS, (
                f"known bug {entry.id} ({entry.upstream_issue}) did not reproduce on {where}, which the "
                f"registry says carries it (carried_by {entry.carried_by}). If it was fixed, update "
                f"carried_by in harness/known_bugs.toml; if not, the case no longer detects it."))
        return Judgement(Verdict.PASSED, f"{where} is outside {entry.id}'s carried_by ({entry.carried_by})")
    signature = entry.matching_signature(evidence)
    if carried and signature:
        return Judgement(Verdict.REPRODUCED, f"known bug {entry.id} ({entry.upstream_issue}) on {where}: matched {signature!r}", signature)
    if signature:
        return Judgement(Verdict.REGRESSED, (
            f"REGRESSION? {where} fails with the signature of known bug {entry.id} ({signature!r}), "
            f"which the registry says is fixed there ({entry.fix})."), signature)
    expected = " | ".join(p.pattern for p in entry.signatures)
    if carried:
        return Judgement(Verdict.FAILED, f"{where} carries {entry.id}, but this failure matches none of its signatures ({expected}): a new failure")
    return Judgement(Verdict.FAILED, f"failed on {where}; not the signature of {entry.id}")
