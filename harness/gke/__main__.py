"""Run the SPMD suite on several TPU slices of a GKE cluster as one JobSet, or as local processes
(--local); also installed as `spmd-gke`.

    python -m harness.gke run --accelerator v6e --topology 4x4 --slices 2 --image IMAGE
        [--namespace NS] [--name NAME] [--timeout 3h] [--keep] [--dry-run] [--results-dir DIR]
        [--gcs-uri gs://BUCKET/PREFIX] [--kubeconfig FILE] [--context KUBECONTEXT]
    python -m harness.gke run --local --accelerator v4 --topology 2x2x2 [--parallel N] [-- PYTEST_ARGS]
    python -m harness.gke worker --results-dir DIR [--backend tpu] [-- PYTEST_ARGS]   (in the pod)

Exit codes: 0 every host passed; 1 a failure (case, host, sharding disagreement, timeout);
2 usage error; 3 the Kubernetes API failed; 130 interrupted (the JobSet is deleted first).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from harness import cli
from harness.config import argtypes
from harness.config.options import JOB_SIZE_ENV, JOB_SIZES
from harness.errors import HarnessUsageError
from harness.gke import accelerators, manifest
from harness.gke.bucket import UPLOAD_TIMEOUT_S
from harness.gke.errors import GkeHarnessError, KubeApiError
from harness.gke.worker import DEFAULT_SUITE

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_API, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_RESULTS_DIR = "spmd-gke"  # in .gitignore


# The one duration parser of every tool (seconds, or 90m / 3h), shared with pytest and the matrix.
duration = argtypes.positive_seconds


def build_parser() -> argparse.ArgumentParser:
    parser = cli.PlainParser(prog=cli.prog("harness.gke", "spmd-gke"), description=__doc__)
    cli.add_version(parser, "spmd-gke")
    # Subparsers are PlainParsers too (argparse makes them of the parent's class).
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    exit_codes = __doc__[__doc__.index("Exit codes:") :]
    _add_run(
        sub.add_parser(
            "run",
            help="run the SPMD suite on N TPU slices (or --local)",
            description="Run the SPMD suite on N TPU slices (or --local).\n\n" + exit_codes,
        )
    )
    _add_worker(
        sub.add_parser(
            "worker",
            help="the entrypoint of each TPU host (in the pod)",
            description="The entrypoint of each TPU host (in the pod).\n\n" + exit_codes,
        )
    )
    return parser


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accelerator", required=True, help=f"one of {', '.join(accelerators.accelerator_names())}")
    p.add_argument(
        "--topology",
        required=True,
        help="; ".join(f"{n}: {', '.join(accelerators.topologies_of(n))}" for n in accelerators.accelerator_names()),
    )
    p.add_argument(
        "--slices", type=int, default=2, help=f"{accelerators.MIN_SLICES}..{accelerators.MAX_SLICES} (default 2)"
    )
    p.add_argument("--image", help="worker image (built from k8s/image/Dockerfile); required unless --local")
    p.add_argument(
        "--namespace",
        default=manifest.BASE_NAME,
        metavar="NS",
        help=f"Kubernetes namespace the JobSet runs in; it must exist (default: {manifest.BASE_NAME}, as k8s/base makes it)",
    )
    p.add_argument(
        "--name",
        default="",
        help="JobSet name, at most 26 characters with k8s/base: JobSet's coordinator "
        "label <name>-slice-0-0.<name> must fit 63 (default: spmd-<random>)",
    )
    p.add_argument("--timeout", type=duration, default=duration("3h"), help="whole run, e.g. 90m (default 3h)")
    p.add_argument("--keep", action="store_true", help="do not delete the JobSet at the end")
    p.add_argument("--dry-run", action="store_true", help="print the manifests and exit")
    p.add_argument("--local", action="store_true", help="run the hosts as local processes on the CPU backend")
    p.add_argument(
        "--parallel", type=argtypes.positive_int, default=1, help="--local: hosts at a time (each imports torch_xla)"
    )
    p.add_argument("--suite-command", default=DEFAULT_SUITE, help="--local: the suite the workers run")
    p.add_argument(
        "--results-dir",
        dest="out",
        type=Path,
        metavar="DIR",
        help=f"where junit.xml, summary.md, results.json and each host's results go "
        f"(default ./{DEFAULT_RESULTS_DIR}/<name>)",
    )
    cli.add_hidden_alias(p, "--out", dest="out", type=Path)  # the 0.1.0 spelling; scripts/nightly-multislice.sh
    p.add_argument(
        "--gcs-uri",
        default=os.environ.get("SPMD_HARNESS_GCS_URI"),
        help="gs://BUCKET/PREFIX: each worker pod also uploads its host report there, as the TPU "
        "node pools' service account (the pods run on the host network); it needs "
        "roles/storage.objectCreator (k8s/README.md)",
    )
    p.add_argument(
        "--job-size",
        choices=JOB_SIZES,
        help="the size of the decoder the training-job cases train on the slices (the pods get "
        f"{JOB_SIZE_ENV}; cases/jobsize.py lists the sizes). Default: the suite's, tiny",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: current)")
    p.add_argument("extra", nargs="*", help="after --: extra pytest arguments (--local)")


def _add_worker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", type=Path, required=True)
    p.add_argument("--backend", default="tpu", choices=("tpu", "cpu", "fake"))
    p.add_argument("--suite-command", default=DEFAULT_SUITE, help="default: %(default)s ({python} = this interpreter)")
    p.add_argument("--suite-timeout", type=duration, default=duration("4h"))
    p.add_argument("--gcs-uri", default=os.environ.get(manifest.GCS_ENV))
    p.add_argument(
        "--upload-timeout",
        type=duration,
        default=UPLOAD_TIMEOUT_S,
        help="longest the bucket copy may take, after the report is printed (default %(default)ss)",
    )
    p.add_argument("extra", nargs="*", help="after --: extra pytest arguments")


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _worker(args, out) if args.command == "worker" else _run(args, out)
    except HarnessUsageError as exc:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {exc}\n")
    except KubeApiError as exc:
        print(f"error: Kubernetes API: {exc}", file=sys.stderr)
        return EXIT_API
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except GkeHarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _worker(args: argparse.Namespace, out: IO[str]) -> int:
    from harness.gke.worker import WorkerOptions, run_worker

    opts = WorkerOptions(
        results_dir=args.results_dir,
        backend=args.backend,
        suite_command=args.suite_command,
        suite_timeout_s=args.suite_timeout,
        extra_args=args.extra,
        gcs_uri=args.gcs_uri,
        upload_timeout_s=args.upload_timeout,
    )
    return run_worker(opts, dict(os.environ), out)


def _run(args: argparse.Namespace, out: IO[str]) -> int:
    accel = accelerators.lookup(args.accelerator, args.topology)
    slices = accelerators.check_slices(args.slices)
    if args.local:
        return _run_local(args, accel, slices, out)
    if not args.image:
        raise HarnessUsageError("--image is required (build k8s/image/Dockerfile and push it), or use --local")
    from harness.gke import launcher

    cfg = launcher.RunConfig(
        accel=accel,
        slices=slices,
        image=args.image,
        out_dir=Path("."),
        namespace=args.namespace,
        name=args.name,
        timeout_s=args.timeout,
        keep=args.keep,
        gcs_uri=args.gcs_uri,
        job_size=args.job_size,
    )
    if args.dry_run:
        out.write(manifest.dump(launcher.render(cfg)))
        return EXIT_OK
    cfg.out_dir = args.out or Path(DEFAULT_RESULTS_DIR) / cfg.name
    from harness.gke.aggregate import verdict_line
    from harness.gke.kube import Kube

    kube = Kube.from_kubeconfig(args.kubeconfig, args.context, log=lambda msg: print(msg, file=out, flush=True))
    result = launcher.run(cfg, kube, out)
    print(verdict_line(result, cfg.out_dir), file=out)
    return EXIT_OK if result.ok else EXIT_FAILED


def _run_local(args: argparse.Namespace, accel: accelerators.AcceleratorType, slices: int, out: IO[str]) -> int:
    from harness.gke.aggregate import verdict_line
    from harness.gke.local import LocalConfig, run_local

    out_dir = args.out or Path(DEFAULT_RESULTS_DIR) / "local"
    cfg = LocalConfig(
        accel=accel,
        slices=slices,
        out_dir=out_dir,
        parallel=args.parallel,
        suite_command=args.suite_command,
        suite_timeout_s=args.timeout,
        extra_args=args.extra,
        job_size=args.job_size,
    )
    if args.dry_run:
        out.write(manifest.dump(manifest.render(accel, slices, "local", name=cfg.name, job_size=cfg.job_size)))
        return EXIT_OK
    result = run_local(cfg, out)
    print(verdict_line(result, out_dir), file=out)
    return EXIT_OK if result.ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
