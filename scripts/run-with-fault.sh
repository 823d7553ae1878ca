#!/usr/bin/env bash
# Run pytest on a torch_xla build that carries one of the job's faults (cases/faults.py), to see
# which regular cases go red and what they say:
#   bash scripts/run-with-fault.sh loader-keeps-batches -m spmd -n 2 cases/test_training_job.py
# The fault is put back in every process that imports torch_xla (scripts/fault-build/faulthook.py);
# the files on disk are not changed. docs/training-job.md lists what each fault turned red.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 ]]; then
  echo "usage: bash scripts/run-with-fault.sh FAULT [pytest arguments]; FAULT is one of:" >&2
  .venv/bin/python -c 'import sys; sys.path.insert(0, "."); from cases import faults; print(" ", " ".join(faults.FAULTS))' >&2
  exit 2
fi
fault="$1"
shift
if ! .venv/bin/python -c 'import sys; sys.path.insert(0, "."); from cases import faults; sys.exit(sys.argv[1] not in faults.FAULTS)' "$fault"; then
  echo "run-with-fault.sh: unknown fault '$fault'; run it without arguments for the list" >&2
  exit 2
fi
# The fault's name travels in a sitecustomize.py of this run's own: the harness gives its children
# PYTHONPATH, no other variable of the caller's.
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
printf 'import faulthook\nfaulthook.install(%s)\n' "'$fault'" >"$site/sitecustomize.py"
PYTHONPATH="$site:$PWD/scripts/fault-build:$PWD${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/pytest "$@"
