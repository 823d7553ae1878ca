"""harness.report, loaded before any case runs, for a caller that reports in the job that ran the cases.

    python -m harness.heldreport ANSWER_FD       (scripts/ci-spmd.sh starts it, before any case runs)

It writes `ready` and a newline to ANSWER_FD once loaded; then, for each request on its stdin (a
count and that many arguments of harness.report, each ended by a NUL byte), it reports and writes
harness.report's exit status and a newline to ANSWER_FD. Its stdin closed, it exits 0.

A case body runs as the same user as the CI script, in the same checkout: it can rewrite
harness/report.py (or a module it imports, or their bytecode), and a report started after the
suite would run that code: `failed=0`, an `::add-mask::` and a green notice into the job. This
process imports the report and everything it uses before the first case starts, runs it once
on a run of its own making (so what the report imports on first use, a codec, a lazily imported
module, is imported now too), and from then on refuses every import: code a case wrote is never
loaded, and a path the warm-up missed fails the report loudly instead of loading it.

What it does not stop: a case that, as the same user, signals or debugs this process (use
--case-user, under which cases run as another user and can do neither). Killed, it answers
nothing, and the script fails saying so.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from harness import report
from harness.judges.basecompare import Comparison
from harness.records import runfolder
from harness.records.results import CaseRecord, write_record

EXIT_CRASHED = 1  # the report itself failed (an import refused, a bug): never a pass
MAX_ARGUMENTS = 100
# The warm-up's text goes through every escape the report has: markup, workflow commands, controls,
# text UTF-8 cannot hold (so the codecs that escape it are imported now).
WARM_UP_TEXT = "<!-- | ` ::error:: %0A ##[ \x1b[31m \u2028 \ud800 é\nsecond line"


class ImportsClosed(importlib.abc.MetaPathFinder):
    """Every import from now on is refused: what the report needs was imported before the cases ran."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> None:
        raise ImportError(
            f"harness.heldreport: {fullname} was not imported before the cases ran, and is not imported now "
            "(a case could have written it); the report cannot be made"
        )


def warm_up() -> None:
    """Report a small run of its own (a failure, a pass, a problem, a comparison, hostile text)
    into a private folder, as the CI script asks (annotated, and plain), output discarded."""
    folder = Path(tempfile.mkdtemp(prefix="spmd-heldreport-"))
    try:
        run = folder / "run-warm-up"
        run.mkdir()
        write_record(run, CaseRecord("cases/test_a.py::test_x", "a", "failed", reason=WARM_UP_TEXT, evidence="e"))
        write_record(run, CaseRecord("cases/test_a.py::test_y", "a", "passed"))
        manifest = runfolder.Manifest("run-warm-up", 1, "host", "2026-01-01T00:00:00+00:00", [], status="finished")
        manifest.exitstatus, manifest.failed_ids, manifest.problems = 1, ["cases/test_a.py::test_x"], [WARM_UP_TEXT]
        (run / runfolder.MANIFEST_NAME).write_text(manifest.to_json())
        comparison = Comparison("base", "2.9.0", ["2.9.0"], 1, registry=[WARM_UP_TEXT])
        (run / runfolder.COMPARISON_NAME).write_text(comparison.to_json())
        args = [str(run), "--pytest-exit-status", "1", "--title", "warm-up"]
        args += ["--github-output", str(folder / "output"), "--step-summary", str(folder / "step-summary")]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            report.main([*args, "--annotate"])
            report.main(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_field(stream: BinaryIO) -> str | None:
    """One NUL-ended field of the request stream; None at its end."""
    data = bytearray()
    while (byte := stream.read(1)) != b"\0":
        if not byte:
            return None
        data += byte
    return os.fsdecode(bytes(data))


def read_request(stream: BinaryIO) -> list[str] | None:
    """harness.report's arguments, as a count and that many fields; None when the stream ended."""
    count = read_field(stream)
    if count is None:
        return None
    if not count.isdigit() or int(count) > MAX_ARGUMENTS:
        raise ValueError(f"a request starts with its number of arguments, not {count[:50]!r}")
    fields = [read_field(stream) for _ in range(int(count))]
    if any(field is None for field in fields):
        raise ValueError("the request ended before its last argument")
    return [field for field in fields if field is not None]


def run_report(args: list[str]) -> int:
    try:
        return report.main(args)
    except SystemExit as exc:  # argparse's usage error
        return exc.code if isinstance(exc.code, int) else EXIT_CRASHED
    except Exception:  # an import refused, or a bug: said, and never a pass
        traceback.print_exc()
        return EXIT_CRASHED


def main(argv: Sequence[str] | None = None) -> int:
    (answer_fd,) = [int(a) for a in (argv if argv is not None else sys.argv[1:])]
    warm_up()
    sys.meta_path.insert(0, ImportsClosed())
    os.write(answer_fd, b"ready\n")
    while (args := read_request(sys.stdin.buffer)) is not None:
        code = run_report(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(answer_fd, f"{code}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
