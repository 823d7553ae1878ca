#!/usr/bin/env bash
# Create .venv with the harness, the pinned torch/torch_xla pair (CPU XLA works with it) and memray (the xla extra).
#   bash scripts/setup.sh          # what `pytest -m spmd` needs
#   bash scripts/setup.sh --test   # plus the harness's own test tools (Kubernetes emulator, linters)
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="xla"
if [[ "${1:-}" == "--test" ]]; then
  extras="xla,test"
elif [[ $# -gt 0 ]]; then
  echo "usage: bash scripts/setup.sh [--test]" >&2
  exit 2
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "setup.sh: needs Python 3.10 or newer; $python is $("$python" -V 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi

free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [[ ! -d .venv && "$free_gb" -lt 10 ]]; then
  echo "setup.sh: torch + torch_xla + jax take about 8 GB installed, 10 GB while installing; only ${free_gb} GB free on $(pwd). Free some space or clone the project where there is more." >&2
  exit 1
fi

[[ -d .venv ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
echo "setup.sh: installing the harness with extras [$extras] (first time: torch and torch_xla, a few GB)..."
.venv/bin/python -m pip install --quiet --progress-bar off -e ".[$extras]"
.venv/bin/python -m pip check >/dev/null || echo "setup.sh: pip check reports conflicts (see 'pip check')" >&2
# pytest rewrites the asserts of test modules and of every plugin's package (hypothesis, xdist, the
# harness) when it imports them, and caches the result beside the source, except where
# PYTHONDONTWRITEBYTECODE is set: there every pytest process pays it again, about 2 s of CPU each,
# and a `-n 2` run starts three. One collection here with writing allowed leaves that cache for the
# venv's plugins and this tree (pytest checks each entry against its source before using it). Best
# effort: if it fails, the first runs only pay what they would have paid anyway.
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true
echo "setup.sh: ready: $(.venv/bin/python -c 'import importlib.metadata as m; print("torch_xla", m.version("torch_xla"), "torch", m.version("torch"))')"
