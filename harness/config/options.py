"""The plugin's options: one table, one `--spmd-` prefix, each also an ini key.

The plugin is a pytest11 entry point, so it is loaded by every pytest in the venv, beside other
projects' conftests. Generic names (`--backend`, `--devices`) collided with theirs ("option
dest 'backend' already used"), so every option and ini key carries the `spmd` prefix.

A value is taken from, in order: the command line, the environment variable where one exists,
the ini file (`[tool.pytest.ini_options]` / `pytest.ini`), the default. An ini value is parsed
and checked like the command line's; a bad one is a usage error naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.config import argtypes
from harness.config.backends import BACKEND_NAMES
from harness.errors import HarnessUsageError
from harness.records.runfolder import check_run_id

FORK_SERVER_CHOICES = ("auto", "on", "off")
FORK_SERVER_ENV = "HARNESS_FORK_SERVER"
# The two tiers (docs/tiers.md): `pr` is what every torch_xla PR and README's `pytest -m spmd` run,
# sized to stay fast; `nightly` runs everything (`nightly`-marked cases, longer loops, larger sizes).
TIERS = ("pr", "nightly")
TIER_ENV = "SPMD_TIER"
# The training-job cases' decoder (cases/jobsize.py has each size's dimensions): `tiny` is what the
# CPU cases and the committed baselines hold; a larger one is what the nightly GKE job trains on its
# slices (`python -m harness.gke run --job-size`, which sets the variable in the pods).
JOB_SIZES = ("tiny", "small", "medium")
JOB_SIZE_ENV = "SPMD_JOB_SIZE"


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise HarnessUsageError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    return parse


@dataclasses.dataclass(frozen=True)
class Option:
    name: str  # the ini key and argparse dest: spmd_backend
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    env: str | None = None  # an environment variable that overrides the ini file
    ini: bool = True  # False for one-off actions (rewrite the baseline) that make no sense in a config file

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS = (
    Option(
        "spmd_backend",
        "cpu",
        choices=BACKEND_NAMES,
        parse=_choice(BACKEND_NAMES),
        help="where case bodies run: cpu (PJRT CPU, virtual devices), tpu (this host's TPUs), "
        "fake (no torch_xla; for testing the harness). Default: cpu.",
    ),
    Option(
        "spmd_devices",
        4,
        parse=argtypes.positive_int,
        metavar="N",
        help="number of virtual devices for the cpu/fake backends (CPU_NUM_DEVICES). Default: 4.",
    ),
    Option(
        "spmd_case_timeout",
        180.0,
        parse=argtypes.positive_seconds,
        metavar="SECONDS",
        help="kill a child (its whole process group) whose case or start-up runs longer. Default: 180.",
    ),
    Option(
        "spmd_results_dir",
        "results",
        metavar="DIR",
        help="each run writes its verdicts, child logs and HLO excerpts into DIR/run-<start>-p<pid>/ "
        "and points DIR/latest at it; nothing else in DIR is touched. Default: results.",
    ),
    Option(
        "spmd_run_id",
        None,
        parse=check_run_id,
        metavar="NAME",
        ini=False,
        help="the run folder's name (run-...) instead of run-<start>-p<pid>: a wrapper that must know "
        "which folder its pytest made (scripts/ci-spmd.sh reports exactly that one) chooses it; "
        "the folder must not exist yet.",
    ),
    Option(
        "spmd_shardings_baseline",
        None,
        metavar="PATH",
        help="the sharding baseline to compare passing cases with. "
        "Default: baselines/shardings/<backend>-<devices>.json under the rootdir.",
    ),
    Option(
        "spmd_costs_baseline",
        None,
        metavar="PATH",
        help="the cost baseline training steps are compared with (harness/judges/costcheck.py). "
        "Default: baselines/costs/<backend>-<devices>.json under the rootdir.",
    ),
    Option(
        "spmd_known_bugs",
        None,
        metavar="PATH",
        help="the known-bug registry the known_bug markers name (a copy you own, e.g. after a fix "
        "landed in your torch_xla). Default: the one shipped in harness/known_bugs.toml.",
    ),
    Option(
        "spmd_compare",
        None,
        metavar="PATH",
        help="hold every passing case to its record in a run of the same suite on the base build "
        "(a results folder: its newest finished run; or one run folder): recorded shardings and cost "
        "signatures must match whatever the two versions; a difference fails the case "
        "(harness/judges/basecompare.py). Default: no comparison.",
    ),
    Option(
        "spmd_case_user",
        None,
        metavar="USER",
        help="a run with root runs every case child as USER (a name or uid, e.g. nobody): it can then "
        "write nothing the run reads (checkout, venv, results, baselines) and signal none of the run's "
        "processes. The checkout and venv must be readable by USER. Default: children run as pytest's user.",
    ),
    Option(
        "spmd_bug",
        None,
        metavar="ID",
        ini=False,
        help="run only the cases whose known_bug markers name this registry entry (harness/known_bugs.toml), "
        "e.g. --spmd-bug=fsdpv2-scalar-param-spec.",
    ),
    Option(
        "spmd_tier",
        "pr",
        choices=TIERS,
        parse=_choice(TIERS),
        env=TIER_ENV,
        help="which tier of the suite runs: pr (the PR gate: every case at the size that keeps it fast) "
        "or nightly (also the cases marked nightly, longer loops and larger sizes; docs/tiers.md). "
        f"Default: ${TIER_ENV} if set, else pr.",
    ),
    Option(
        "spmd_fuzz_budget",
        120.0,
        parse=argtypes.positive_seconds,
        metavar="SECONDS",
        help="how long the nightly tier's differential oracle draws new programs "
        "(cases/test_oracle_differential.py; e.g. 600, 10m). Default: 120.",
    ),
    Option(
        "spmd_job_size",
        "tiny",
        choices=JOB_SIZES,
        parse=_choice(JOB_SIZES),
        env=JOB_SIZE_ENV,
        help="the size of the decoder the training-job cases train (cases/test_training_job.py; "
        "cases/jobsize.py lists the dimensions): tiny (the CPU cases, what the baselines hold), small, "
        "medium. A case at another size than tiny carries it in its id ([job-small-fsdp]; a case takes the size as its spmd_job_size argument), so the "
        f"baselines have no entry for it and --spmd-compare needs a base run of the same size. Default: ${JOB_SIZE_ENV} if set, else tiny.",
    ),
    Option(
        "spmd_fork_server",
        None,
        choices=FORK_SERVER_CHOICES,
        parse=_choice(FORK_SERVER_CHOICES),
        env=FORK_SERVER_ENV,
        help="fork case children from a server that imported torch_xla once: auto (on for the cpu "
        "backend; tpu children are always fresh processes), on, off. "
        f"Default: ${FORK_SERVER_ENV} if set, else auto.",
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}
UPDATE_SHARDINGS = "spmd_update_shardings"
UPDATE_COSTS = "spmd_update_costs"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("spmd", "SPMD regression harness (each option is also an ini key, e.g. spmd_backend = cpu)")
    for option in OPTIONS:
        # The command line's default is None so that "not given" can fall through to the ini file.
        kwargs: dict[str, Any] = {"default": None, "help": option.help, "dest": option.name}
        if option.choices:
            kwargs["choices"] = option.choices
        else:
            kwargs["type"] = _argparse_type(option.parse)
        if option.metavar:
            kwargs["metavar"] = option.metavar
        group.addoption(option.flag, **kwargs)
        if option.ini:
            parser.addini(option.name, help=option.help.split(". Default")[0], default="")
    group.addoption(
        "--spmd-update-shardings",
        action="store_true",
        dest=UPDATE_SHARDINGS,
        help="rewrite the baseline entries of the cases that ran and passed, and print what changed",
    )
    group.addoption(
        "--spmd-update-costs",
        action="store_true",
        dest=UPDATE_COSTS,
        help="rewrite the cost baseline entries of the cases that ran and passed, and print what changed",
    )


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse turns only an ArgumentTypeError (or a ValueError) into a usage error (exit 4): a
    HarnessUsageError raised by a parser (a run id like `latest` or `run-../x`) was a traceback."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except HarnessUsageError as exc:
            if isinstance(exc, argparse.ArgumentTypeError):
                raise
            raise argparse.ArgumentTypeError(str(exc)) from None

    parsed.__name__ = getattr(parse, "__name__", "value")
    return parsed


def value(config: pytest.Config, name: str, namespace: Any = None) -> Any:
    """The option's value: command line, environment, ini file, default (see the module doc).

    namespace: pytest's early known_args_namespace, for hooks that run before full parsing.
    """
    option = BY_NAME[name]
    given = getattr(namespace if namespace is not None else config.option, name, None)
    if given is not None:
        return given
    if option.env and os.environ.get(option.env):
        return _parsed(option, os.environ[option.env], f"${option.env}")
    text = str(config.getini(name)).strip() if option.ini else ""
    if text:
        return _parsed(option, text, f"ini key {name} = {text!r} ({config.inipath or 'ini file'})")
    return option.default


def results_dir(config: pytest.Config, namespace: Any = None) -> Path:
    """--spmd-results-dir. A path on the command line is the user's, from where pytest started; the
    ini's or the default is the project's: anchored at the rootdir wherever pytest starts (run from
    cases/, results still land in the project's results/, where spmd-report and .gitignore expect them)."""
    path = Path(value(config, "spmd_results_dir", namespace)).expanduser()
    given = getattr(namespace if namespace is not None else config.option, "spmd_results_dir", None)
    return path if given is not None or path.is_absolute() else config.rootpath / path


def _parsed(option: Option, text: str, where: str) -> Any:
    try:
        return option.parse(text)
    except (HarnessUsageError, ValueError) as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None


def xdist_distributes(option: Any) -> bool:
    """The run's cases go to pytest-xdist workers: -n N (N > 0, or auto) or --tx entries.

    option: config.option, or the early known_args_namespace. --dist alone distributes nothing
    (this repository's addopts hold --dist=worksteal); xdist turns -n into --tx entries later."""
    return bool(getattr(option, "numprocesses", None)) or bool(getattr(option, "tx", None))


def check_not_taken_for_a_test_path(config: pytest.Config) -> None:
    """pytest chooses its rootdir and ini file before it has read this plugin's options, so the value
    of `--spmd-results-dir /tmp/r` written as a separate word is taken for a test path there; where
    that path exists outside the project, pytest runs without the project's ini file (its testpaths,
    markers, addopts) and from a rootdir whose baselines/ is not the project's: every baseline check
    is silently off. The `=` form is read after; refused (exit 4) naming it. A run that pins its
    config (-c, --rootdir) is not affected."""
    if config.option.rootdir or config.option.inifilename:
        return
    args = [str(arg) for arg in config.invocation_params.args]
    flags = {option.flag for option in OPTIONS}
    project = config.inipath.parent if config.inipath is not None else None
    for flag, given in zip(args, args[1:]):
        if flag not in flags:
            continue
        path = (config.invocation_params.dir / given).expanduser()
        if not path.exists() or (project is not None and path.resolve().is_relative_to(project)):
            continue
        raise pytest.UsageError(
            f"{flag} {given}: pytest took {given} for a test path when it chose its rootdir ({config.rootpath}) "
            f"and ini file ({config.inipath or 'none'}), before it knew {flag}: the project's config and "
            f"baselines would not be used. Write {flag}={given}"
        )
