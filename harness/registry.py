"""The known-bug registry (harness/known_bugs.toml) and the judgement of a case against it."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import re
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.errors import RegistryError
from harness.isolation.parent.evidence import headline
from harness.schema import shown, unknown_keys

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
    status: str  # "fixed" | "open" | "not-reproduced"
    carried_by: SpecifierSet  # empty for "not-reproduced": no release carries it
    signatures: tuple[re.Pattern[str], ...]
    # Steady-state figures the bug's own mechanism moves (MOVED_FIGURES): its reproduced case is not
    # judged on them, every other figure is (harness.judges.excused).
    moves: tuple[str, ...] = ()
    # The oracles' nightly searches (harness.oracles) may pass over a drawn program's failure that
    # this entry explains: its signatures (or its class) were written for drawn programs. Other
    # entries' signatures were written for their own cases and can be as generic as "Check failed:
    # xtensor": a drawn program failing that way is a finding, not their bug.
    drawn_programs: bool = False
    source: Path = REGISTRY_PATH  # the registry file it was read from (--spmd-known-bugs): hints name it

    def carried_by_release(self, version: str) -> bool:
        """Whether `version` carries the bug. Nightlies (2.9.0.dev20250601) are placed by their date.

        A development build of pytorch/xla's CI (2.9.0+git1a2b3c4, or any local label such as +cpu)
        is judged as its public version, the release its branch becomes: `carried_by` windows are
        written in releases and nightly dates, and a commit hash has no date to place it by.
        """
        if self.status == NOT_REPRODUCED:
            return False
        return self.carried_by.contains(Version(parse_version(version).public), prereleases=True)

    @property
    def window(self) -> str:
        """carried_by as tables show it."""
        if self.status == NOT_REPRODUCED:
            return "none (reported, not reproduced)"
        return str(self.carried_by) or "any"

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


ENTRY_KEYS = ("id", "title", "upstream_issue", "fix", "status", "carried_by", "signatures", "moves", "drawn_programs")
# What an entry's `moves` may name: the figures a reproduced bug's case is still judged on alone.
MOVED_FIGURES = ("native heap", "resident set")
REQUIRED_KEYS = ("id", "title", "status", "carried_by", "signatures")
# A bug reported upstream that no release measured here reproduces: its case guards the invariant
# the report broke, so a build that breaks it is named, and the entry carries no release at all
# (a made-up carried_by window would claim releases that were never seen to carry it).
NOT_REPRODUCED = "not-reproduced"
STATUSES = ("fixed", "open", NOT_REPRODUCED)
# Operators that put an upper bound on a carried_by window: a fixed bug is carried up to its fix.
UPPER_BOUND_OPERATORS = ("<", "<=", "==", "===", "~=")


def _entry_from_table(table: Any, number: int, path: Path) -> KnownBug:
    """One [[bug]] table, every field's type checked: a wrong type must not judge a single case.

    (A string of signatures used to be read letter by letter, so 'T' matched any TypeError or
    RuntimeError and turned an unrelated failure into an xfail.)
    """
    where = f"{path}: [[bug]] #{number}"
    if not isinstance(table, dict):
        raise RegistryError(f"{where} is {shown(table)}; write each entry as a [[bug]] table")
    if isinstance(table.get("id"), str) and table["id"]:
        where = f"{path}: entry {table['id']!r}"
    unknown = unknown_keys(table, ENTRY_KEYS)
    if unknown:
        raise RegistryError(f"{where}: {unknown}")
    if "status" in table and table["status"] not in STATUSES:  # first: a misspelt status explains what follows
        raise RegistryError(
            f"{where}: status must be 'fixed', 'open' or '{NOT_REPRODUCED}', not {shown(table['status'])}"
        )
    not_reproduced = table.get("status") == NOT_REPRODUCED
    if not_reproduced and "carried_by" in table:
        raise RegistryError(
            f'{where}: status = "{NOT_REPRODUCED}" takes no carried_by (no release carries the bug); a release '
            'that reproduces it makes it status = "open" or "fixed" with its carried_by window'
        )
    missing = [key for key in REQUIRED_KEYS if key not in table and not (not_reproduced and key == "carried_by")]
    if missing:
        raise RegistryError(
            f"{where} lacks {', '.join(missing)}; every entry needs {', '.join(REQUIRED_KEYS)} "
            f'(carried_by but where status = "{NOT_REPRODUCED}")'
        )
    for key in ("id", "title", "upstream_issue", "fix"):
        value = table.get(key, "")
        if not isinstance(value, str) or (key in ("id", "title") and not value):
            raise RegistryError(f'{where}: {key} must be a non-empty string, e.g. {key} = "..."; got {shown(value)}')
    if not isinstance(table.get("drawn_programs", False), bool):
        raise RegistryError(
            f"{where}: drawn_programs must be true or false (unquoted), e.g. drawn_programs = true; "
            f"got {shown(table['drawn_programs'])}"
        )
    carried_by = SpecifierSet() if not_reproduced else _carried_by(table["carried_by"], where)
    if table["status"] == "fixed" and not any(spec.operator in UPPER_BOUND_OPERATORS for spec in carried_by):
        raise RegistryError(
            f'{where}: status = "fixed" but carried_by = "{carried_by}" has no upper bound, so every later '
            f'release would carry the bug; bound it by the first fixed release (e.g. "{carried_by},<2.7") '
            'or write status = "open"'
        )
    return KnownBug(
        id=table["id"],
        title=table["title"],
        upstream_issue=table.get("upstream_issue", ""),
        fix=table.get("fix", ""),
        status=table["status"],
        carried_by=carried_by,
        signatures=_signatures(table["signatures"], where),
        moves=_moves(table.get("moves", []), where),
        drawn_programs=table.get("drawn_programs", False),
        source=path,
    )


def _moves(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or any(item not in MOVED_FIGURES for item in value):
        names = ", ".join(f'"{name}"' for name in MOVED_FIGURES)
        raise RegistryError(
            f"{where}: moves must be a list naming figures the bug itself moves, of {names} "
            f'(e.g. moves = ["native heap"]); got {shown(value)}'
        )
    return tuple(value)


def _carried_by(value: Any, where: str) -> SpecifierSet:
    if not isinstance(value, str) or not value.strip():
        raise RegistryError(
            f"{where}: carried_by must be a quoted PEP 440 specifier set over torch_xla versions, "
            f'e.g. carried_by = "<2.7" (or ">=2.4" for every release); got {shown(value)}'
        )
    try:
        return SpecifierSet(value)
    except InvalidSpecifier:
        raise RegistryError(
            f'{where}: carried_by {value!r} is not a PEP 440 specifier set; write e.g. ">=2.6.0rc1,<2.7.0.dev20250313"'
        ) from None


def _signatures(value: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if isinstance(value, str):
        raise RegistryError(
            f"{where}: signatures must be a list of regular expressions, not a string (each "
            f"letter would be a signature); write signatures = [{json.dumps(value)}]"
        )
    if not isinstance(value, list) or not value:
        raise RegistryError(
            f"{where}: signatures must be a non-empty list of regular expressions, e.g. "
            f'signatures = ["TypeError: unhashable type"]; got {shown(value)}'
        )
    patterns = []
    for index, text in enumerate(value):
        if not isinstance(text, str) or not text:
            what = "empty (it would match every failure)" if text == "" else f"{shown(text)}, not a string"
            raise RegistryError(f"{where}: signatures[{index}] is {what}; give the text the failure must contain")
        try:
            patterns.append(re.compile(text))
        except re.error as exc:
            raise RegistryError(
                f"{where}: signatures[{index}] {shown_pattern(text)} is not a regular expression ({exc}); "
                'escape what is meant literally (in the TOML file, "\\\\(" matches a literal "(")'
            ) from None
    return tuple(patterns)


def shown_pattern(pattern: str) -> str:
    """A regular expression as its author wrote it (repr() would double every backslash)."""
    return f'"{pattern}"'


@cache
def load_registry(path: Path = REGISTRY_PATH) -> dict[str, KnownBug]:
    """Every entry of the registry at path; a malformed file is a RegistryError naming entry and field."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise RegistryError(f"known-bug registry {path} cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path} is not valid TOML: {exc}; fix the syntax there") from None
    unknown = unknown_keys(data, ("bug",))
    if unknown:
        raise RegistryError(f"{path}: {unknown} at the top level; entries are [[bug]] tables")
    tables = data.get("bug", [])
    if not isinstance(tables, list):
        raise RegistryError(f"{path}: bug is {shown(tables)}; write each entry as a [[bug]] table")
    by_id: dict[str, KnownBug] = {}
    for number, table in enumerate(tables, start=1):
        entry = _entry_from_table(table, number, path)
        if entry.id in by_id:
            raise RegistryError(
                f"{path}: two entries have id {entry.id!r} (the second is [[bug]] #{number}); ids must be unique"
            )
        by_id[entry.id] = entry
    return by_id


def get_entry(entry_id: str, path: Path = REGISTRY_PATH) -> KnownBug:
    registry = load_registry(path)
    if entry_id not in registry:
        close = difflib.get_close_matches(entry_id, registry, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise RegistryError(f"no known-bug entry {entry_id!r} in {path}; {hint}known: {', '.join(sorted(registry))}")
    return registry[entry_id]


# Releases every entry set is checked at, on top of the entries' own boundary versions.
SUPPORTED_RELEASES = ("2.4.0", "2.4.1", "2.5.0", "2.5.1", "2.6.0", "2.6.1", "2.7.0", "2.8.0", "2.8.1", "2.9.0")


def check_disjoint(entries: Sequence[KnownBug]) -> None:
    """Entries named by one case must not claim the same release: which one would judge it?

    Windows are compared at every boundary version of their specifiers and at every supported
    release: two PEP 440 windows that overlap always share one of those points.
    """
    if len(entries) < 2:
        return
    probes = set(SUPPORTED_RELEASES)
    for entry in entries:
        probes.update(spec.version for spec in entry.carried_by)
    for probe in sorted(probes, key=parse_version):
        claimants = [e.id for e in entries if e.carried_by_release(probe)]
        if len(claimants) > 1:
            raise RegistryError(
                f"entries {' and '.join(claimants)} both claim torch_xla {probe}; one case can be judged "
                f"against only one entry per release. Make their carried_by windows disjoint in {entries[0].source}."
            )


def entry_for_release(entries: Sequence[KnownBug], version: str) -> KnownBug | None:
    """The entry whose carried_by holds `version`, if any."""
    for entry in entries:
        if entry.carried_by_release(version):
            return entry
    return None


class JudgementKind(enum.Enum):
    """How a case stands against the registry entries it names. Records keep its value under the
    older name `registry_verdict` (a field readers of earlier results folders know)."""

    PASSED = "passed"  # fixed release, case passed
    REPRODUCED = "reproduced"  # carrying release, failed with a known signature -> xfail
    UNEXPECTED_PASS = "unexpected-pass"  # carrying release, passed -> failure: update the entry
    REGRESSED = "regressed"  # release outside carried_by fails with the bug's own signature
    FAILED = "failed"  # any other failure
    UNJUDGED = "unjudged"  # no torch_xla version known (fake backend): outcome stands as is


@dataclasses.dataclass(frozen=True)
class Judgement:
    kind: JudgementKind
    message: str
    signature: str | None = None
    entry: str | None = None  # the entry the case was judged against


def judge(entries: KnownBug | Sequence[KnownBug], version: str | None, evidence: str | None) -> Judgement:
    """Judge a case that names `entries` on `version`; evidence is None when the case passed.

    The entry whose carried_by holds the release decides. Where none does, the case must pass,
    and a failure with one of the entries' signatures is a regression of that entry.
    """
    entries = [entries] if isinstance(entries, KnownBug) else list(entries)
    if version is None:
        names = ", ".join(e.id for e in entries)
        return Judgement(JudgementKind.UNJUDGED, f"no torch_xla version known; registry entry {names} not applied")
    where = f"torch_xla {version}"
    carrier = entry_for_release(entries, version)
    if carrier is not None:
        judgement = _judge_carried(carrier, where, evidence)
        if judgement.kind is JudgementKind.FAILED and evidence is not None:
            return _first_sighting(entries, where, evidence) or judgement
        return judgement
    names = ", ".join(e.id for e in entries)
    if evidence is None:
        windows = "; ".join(f"{e.id}: {e.window}" for e in entries)
        return Judgement(JudgementKind.PASSED, f"{where} is outside the carried_by of {windows}", entry=entries[0].id)
    cause = headline(evidence)
    sighting = _first_sighting(entries, where, evidence)
    if sighting is not None:
        return sighting
    for entry in entries:
        signature = entry.matching_signature(evidence)
        if signature:
            return Judgement(
                JudgementKind.REGRESSED,
                (
                    f"REGRESSION? {where} fails with the signature of known bug {entry.id} ({shown_pattern(signature)}), "
                    f"which the registry says is fixed there ({entry.fix or f'carried_by {entry.carried_by}'}): {cause}"
                ),
                signature,
                entry.id,
            )
    return Judgement(
        JudgementKind.FAILED, f"failed on {where}; not the signature of {names}: {cause}", entry=entries[0].id
    )


def _first_sighting(entries: Sequence[KnownBug], where: str, evidence: str) -> Judgement | None:
    """A failure with the signature of a reported bug no release reproduced: a failure (kind
    REGRESSED: the registry says this build does not carry it), named as what it is."""
    for entry in entries:
        signature = entry.matching_signature(evidence) if entry.status == NOT_REPRODUCED else None
        if signature:
            return Judgement(
                JudgementKind.REGRESSED,
                (
                    f"FIRST SIGHTING? {where} fails with the signature of reported bug {entry.id} "
                    f"({entry.upstream_issue}; {shown_pattern(signature)}), which no release measured before "
                    f"reproduced: {headline(evidence)}. If the build carries it, give the entry a carried_by "
                    f"window in {entry.source}"
                ),
                signature,
                entry.id,
            )
    return None


def _judge_carried(entry: KnownBug, where: str, evidence: str | None) -> Judgement:
    if evidence is None:
        return Judgement(
            JudgementKind.UNEXPECTED_PASS,
            (
                f"known bug {entry.id} ({entry.upstream_issue}) did not reproduce on {where}, which the "
                f"registry says carries it (carried_by {entry.carried_by}). If it was fixed, update "
                f"carried_by in {entry.source}; if not, the case no longer detects it."
            ),
            entry=entry.id,
        )
    signature = entry.matching_signature(evidence)
    cause = headline(evidence)
    if signature:
        return Judgement(
            JudgementKind.REPRODUCED,
            f"known bug {entry.id} ({entry.upstream_issue}) on {where}: {cause} (matched {shown_pattern(signature)})",
            signature,
            entry.id,
        )
    expected = " | ".join(shown_pattern(p.pattern) for p in entry.signatures)
    return Judgement(
        JudgementKind.FAILED,
        (
            f"{where} carries {entry.id}, but this failure matches none of its signatures ({expected}): "
            f"a new failure: {cause}"
        ),
        entry=entry.id,
    )
