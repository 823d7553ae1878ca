"""Records held to what the process that judged each case wrote, before a later case could touch it.

A case body runs as the same user as pytest and can rewrite any line of the run's verdicts files:
an earlier case's `regressed` into `reproduced`, its reason into "infrastructure, not a
regression". The process that wrote a record keeps its digest (harness.records.results.record_digest)
and sends it with the case's report to the controlling pytest process, which writes every digest
into the run's manifest (and puts the manifest back if a case changes it). A reader then names:

- a record whose digest differs: rewritten after its case ended, its verdict not believed;
- a record the manifest vouches for that is gone: deleted after its case ended;
- a record that does not fail and that the manifest does not vouch for: planted. A failed one
  is kept (the controller's own records of crashed workers carry no digest, and a planted
  failure hides nothing).

A manifest without digests (an older harness's, or a run whose records were all written by the
controller) vouches for nothing and names nothing.
"""

from __future__ import annotations

from pathlib import Path

from harness.records.results import is_failure, read_records

MAX_NAMED = 20  # the rest are counted: a case that rewrites every record must not flood the report


def problems(run: Path, vouched: dict[str, str]) -> list[str]:
    """What in `run`'s records differs from the digests its manifest vouches for."""
    if not vouched:
        return []
    found: dict[str, str] = {}
    records = {record.nodeid: record for record in read_records(run, [], digests=found)}
    named = []
    for nodeid, digest in sorted(vouched.items()):
        if nodeid not in found:
            named.append(f"the record of {nodeid} that pytest wrote is gone (deleted after its case ended, by a case?)")
        elif found[nodeid] != digest:
            named.append(
                f"the record of {nodeid} was rewritten after its case ended (by a later case?): it is not what "
                f"pytest wrote, so what it says ({records[nodeid].outcome}, "
                f"{records[nodeid].registry_verdict or 'no registry verdict'}) is not believed"
            )
    for nodeid, record in sorted(records.items()):
        if nodeid not in vouched and not is_failure(record):
            named.append(f"a record of {nodeid} ({record.outcome}) that pytest did not write (planted by a case?)")
    if len(named) > MAX_NAMED:
        named = named[: MAX_NAMED - 1] + [f"{len(named) - MAX_NAMED + 1} more records not as pytest wrote them"]
    return named
