"""Run the SPMD suite against several torch_xla releases or wheel builds (also installed as
`spmd-matrix`), and tabulate registry entry x release; or, with `compare`, name the entries whose
verdict changed between a good and a bad build (for `git bisect run`).

    python -m harness.matrix --releases 2.6.0,2.7.0,2.9.0 [--wheels DIR ...] [--env RELEASE=VENV ...]
        [--results NAME=DIR ...] [--results-dir DIR] [--cache DIR] [--jobs-per-env N]
        [--suite-timeout S] [--table FILE.md] [--readme FILE.md] [-- PYTEST_ARGS]
    python -m harness.matrix compare --good DIR --bad DIR [--results-dir DIR] [--cache DIR] [--jobs-per-env N]

Exit codes: 0 every cell agrees with the registry (compare: no entry changed verdict);
1 a disagreement (compare: some entry changed; one that did not run on a side is listed, not counted); 2 usage error; 3 an environment could not be
built or a suite could not be run; 125 (compare) a column's records are damaged, so this commit
cannot be judged (git bisect run skips it); 130 interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

from harness import cli
from harness.config import argtypes
from harness.errors import HarnessUsageError, RegistryError
from harness.matrix import columns as cols
from harness.matrix import compare as cmp
from harness.matrix import envs, measure, render
from harness.matrix.envs import EnvCache, Installer, PipInstaller
from harness.matrix.errors import MatrixError
from harness.matrix.procs import Progress
from harness.matrix.suite import PytestSuite, SuiteRunner
from harness.matrix.table import build_matrix
from harness.registry import REGISTRY_PATH, load_registry

EXIT_AGREE, EXIT_DISAGREE, EXIT_USAGE, EXIT_ENV, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# compare, when a column's records are damaged (a crash cut a line): `git bisect run` reads 1-127
# as "this commit is bad" (1 is our "an entry changed") and 125 as "this commit cannot be tested".
# Damaged records say nothing about the commit, so they must not blame it: 125 makes bisect skip
# it and try a neighbour, as for a commit that does not build.
EXIT_SKIP = 125
REPO = Path(__file__).resolve().parents[2]
TABLE_NAME = "release-matrix.md"
DEFAULT_RESULTS_DIR = "matrix-out"  # in .gitignore


class _HelpShown(Exception):  # control flow within this module, never raised out of it
    pass


class _Parser(cli.PlainParser):
    """argparse that raises instead of exiting: only main() decides the exit code."""

    def error(self, message: str) -> NoReturn:
        raise HarnessUsageError(f"{cli.plain(message)} (see {self.prog} --help)\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._print_message(message, sys.stderr)
        raise _HelpShown()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results-dir",
        dest="out",
        type=Path,
        default=Path(DEFAULT_RESULTS_DIR),
        metavar="DIR",
        help=f"where each column's results folder and pytest log go (default: ./{DEFAULT_RESULTS_DIR})",
    )
    cli.add_hidden_alias(p, "--out", dest="out", type=Path)  # the 0.1.0 spelling
    p.add_argument(
        "--cache",
        type=Path,
        default=envs.default_cache_root(),
        help=f"where environments are built and kept (default: {envs.default_cache_root()})",
    )
    p.add_argument(
        "--workers",
        "--jobs-per-env",
        dest="jobs_per_env",
        type=argtypes.positive_int,
        default=1,
        metavar="N",
        help="pytest-xdist workers inside each suite run (default 1: environments are measured side by side; raise it on a machine with cores to spare)",
    )
    p.add_argument(
        "--suite-timeout",
        type=argtypes.positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="stop a suite run that takes longer (default 3600)",
    )
    p.add_argument("--registry", type=Path, default=REGISTRY_PATH, help=argparse.SUPPRESS)
    cli.add_version(p, "spmd-matrix")


def run_parser() -> _Parser:
    p = _Parser(
        prog=cli.prog("harness.matrix", "spmd-matrix"),
        description=__doc__,
        epilog="Commands: (none) run the matrix; compare: bisect help, see `compare --help`. "
        "Arguments after -- go to pytest.",
    )
    p.add_argument("--releases", help="comma-separated torch_xla releases, e.g. 2.6.0,2.7.0,2.9.0")
    p.add_argument(
        "--wheels",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder with torch and torch_xla wheels (PR build or nightly); a column named after the "
        "torch_xla version in the wheel's filename. May be repeated.",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="RELEASE=VENV",
        help="use this existing venv for a listed release instead of building one (saves the "
        "download; the column says 'existing venv')",
    )
    p.add_argument(
        "--results",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a column read from an earlier run's results folder (nothing is run for it)",
    )
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        metavar="FILE.md",
        help=f"write the Markdown table here and the JSON beside it (default: OUT/{TABLE_NAME})",
    )
    p.add_argument(
        "--readme",
        type=Path,
        default=None,
        metavar="README.md",
        help="also write the entry table into this file, between its release-matrix markers",
    )
    _common(p)
    return p


def compare_parser() -> _Parser:
    p = _Parser(
        prog=cli.prog("harness.matrix", "spmd-matrix") + " compare",
        description="Name the registry entries whose verdict changed between a good and a bad build.\n\n"
        + __doc__[__doc__.index("Exit codes:") :],
    )
    p.add_argument("--good", type=Path, required=True, help="last good: a wheel folder or a results folder")
    p.add_argument("--bad", type=Path, required=True, help="first bad: a wheel folder or a results folder")
    _common(p)
    return p


# Options that only say where this machine keeps files: left out of the "Generated by" line the
# table carries into docs and README, where a local path means nothing to a reader.
_LOCAL_FOLDERS = ("--results-dir", "--out", "--cache")


def shown_arguments(argv: Sequence[str]) -> list[str]:
    """argv as the generated table shows it: no local folders, `--env RELEASE=VENV` for a venv path."""
    shown: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--":
            shown += [arg, *rest]
            break
        name, has_value, value = arg.partition("=")
        if name in _LOCAL_FOLDERS:
            if not has_value:
                next(rest, None)
            continue
        if arg == "--env":
            release = next(rest, "").partition("=")[0]
            shown += ["--env", f"{release}=VENV"]
            continue
        if name == "--env" and has_value:
            shown.append(f"--env={value.partition('=')[0]}=VENV")
            continue
        shown.append(arg)
    return shown


class Deps:
    """What main() talks to; tests swap the installer, the suite runner and the disk probe."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        installer: Callable[[Callable[[str], None]], Installer] = PipInstaller,
        suite: Callable[..., SuiteRunner] = PytestSuite,
        free_bytes: Callable[[Path], int] | None = None,
    ) -> None:
        # Looked up now, not at import: whoever redirected sys.stdout since (pytest's capture) gets the output.
        self.stdout, self.stderr = stdout or sys.stdout, stderr or sys.stderr
        self.installer, self.suite, self.free_bytes = installer, suite, free_bytes


def main(argv: Sequence[str] | None = None, deps: Deps | None = None) -> int:
    deps = deps or Deps()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "python -m harness.matrix " + shlex.join(shown_arguments(argv))
    try:
        if argv[:1] == ["compare"]:
            return _compare(compare_parser().parse_args(argv[1:]), deps)
        head, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
        return _run(run_parser().parse_args(head), extra, command, deps)
    except _HelpShown:
        return EXIT_AGREE
    except (HarnessUsageError, RegistryError) as exc:
        print(f"harness.matrix: usage error: {exc}", file=deps.stderr)
        return EXIT_USAGE
    except MatrixError as exc:
        print(f"harness.matrix: {type(exc).__name__}: {exc}", file=deps.stderr)
        return EXIT_ENV
    except KeyboardInterrupt:
        print(
            "harness.matrix: interrupted (an environment still being built stays unmarked and is rebuilt next time)",
            file=deps.stderr,
        )
        return EXIT_INTERRUPTED


def _setup(args: argparse.Namespace, extra: Sequence[str], deps: Deps) -> tuple[Progress, EnvCache, SuiteRunner]:
    progress = Progress(deps.stderr)
    cache = EnvCache(args.cache.expanduser().absolute(), deps.installer(progress.say), REPO, progress.say)
    suite = deps.suite(REPO, progress.say, jobs=args.jobs_per_env, extra_args=extra, timeout_s=args.suite_timeout)
    return progress, cache, suite


def _prepare(
    specs: Sequence[cols.ColumnSpec], cache: EnvCache, progress: Progress, deps: Deps
) -> list[measure.PlannedColumn]:
    steps = measure.plan(specs, cache, REPO)
    for line in measure.describe(steps, cache):
        progress.say(line)
    envs.check_disk(cache.root, sum(1 for s in steps if s.request and not s.cached), deps.free_bytes)
    return steps


def _run(args: argparse.Namespace, extra: Sequence[str], command: str, deps: Deps) -> int:
    registry = load_registry(args.registry)
    specs = cols.build_columns(
        cols.parse_releases(args.releases),
        cols.parse_assignments("--env", args.env),
        args.wheels,
        cols.parse_assignments("--results", args.results),
    )
    progress, cache, suite = _setup(args, extra, deps)
    steps = _prepare(specs, cache, progress, deps)
    # Absolute: pytest runs from the repo root and writes the verdicts there, this process reads them here.
    columns = measure.measure(steps, cache, suite, args.out.absolute(), progress.say)
    matrix = build_matrix(registry, columns)
    table = args.table or args.out / TABLE_NAME
    table.parent.mkdir(parents=True, exist_ok=True)
    markdown = render.to_markdown(matrix, command)
    table.write_text(markdown)
    table.with_suffix(".json").write_text(render.dumps(matrix, command))
    print(markdown, file=deps.stdout)
    progress.say(f"wrote {table} and {table.with_suffix('.json')}")
    if args.readme:
        try:
            args.readme.write_text(render.replace_in_readme(args.readme.read_text(), matrix, command))
        except (OSError, ValueError) as exc:
            raise HarnessUsageError(f"--readme {args.readme}: {exc}") from None
        progress.say(f"wrote the table into {args.readme}")
    if not matrix.agrees:
        progress.say(
            f"{render.DISAGREE} {len(matrix.disagreements)} disagreement(s) with the registry (listed under the table)"
        )
        return EXIT_DISAGREE
    return EXIT_AGREE


def _compare(args: argparse.Namespace, deps: Deps) -> int:
    registry = load_registry(args.registry)
    good = cols.dir_column("good", args.good, "--good")
    bad = cols.dir_column("bad", args.bad, "--bad")
    if good.kind == bad.kind == "wheels" and good.name == bad.name:
        # Same torch_xla version string (two PR builds): keep both columns apart in the output folder.
        good, bad = (
            cols.ColumnSpec(f"{s.name}-{role}", s.kind, s.declared, s.path)
            for s, role in ((good, "good"), (bad, "bad"))
        )
    progress, cache, suite = _setup(args, [], deps)
    steps = _prepare([good, bad], cache, progress, deps)
    measured_good, measured_bad = measure.measure(steps, cache, suite, args.out.absolute(), progress.say)
    damaged = [(c.name, c.run) for c in (measured_good, measured_bad) if c.run.unreadable]
    if damaged:
        for role, run in damaged:
            print(
                f"harness.matrix compare: {role}: {len(run.unreadable)} damaged record line(s), cut short by a crash "
                f"or not a case record: {run.damaged_lines()}",
                file=deps.stderr,
            )
        print(
            "harness.matrix compare: a column with damaged records cannot be compared; rerun it (git bisect run: "
            f"exit {EXIT_SKIP}, skip this commit)",
            file=deps.stderr,
        )
        return EXIT_SKIP
    changes, not_run = cmp.compare_all(registry, measured_good, measured_bad)
    print(cmp.to_text(changes, measured_good, measured_bad, not_run), file=deps.stdout, end="")
    return EXIT_DISAGREE if changes else EXIT_AGREE


if __name__ == "__main__":
    sys.exit(main())
