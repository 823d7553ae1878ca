#!/usr/bin/env bash
# The nightly multi-slice run (.github/workflows/nightly-multislice.yml) as a script that runs the
# same from a laptop with gcloud/kubectl credentials for the cluster:
#
#   ACCELERATOR=v6e SLICES=2 WORKER_IMAGE_REPOSITORY=REGION-docker.pkg.dev/P/R/spmd-worker \
#     bash scripts/nightly-multislice.sh
#
# Environment (all optional but WORKER_IMAGE_REPOSITORY when IMAGE is empty):
#   ACCELERATOR  v6e | v4 (default v6e)
#   TOPOLOGY     slice topology (default: 4x4 for v6e, 2x2x2 for v4, as in harness/gke/accelerators.py)
#   SLICES       number of slices (default 2)
#   JOB_SIZE     the training job's decoder on the slices: tiny | small | medium (default small;
#                cases/jobsize.py; the CPU cases keep it tiny)
#   IMAGE        worker image to run; empty = build and push one (scripts/build-worker-image.sh)
#   WORKER_IMAGE_REPOSITORY  where to push a built image
#   OUT          results folder (default gke-results)
#   LAUNCH_TIMEOUT_S  launcher timeout in seconds (default 7200; the workflow job allows 180 min, image build included)
#   VENV         virtualenv for the launcher (default .venv)
#   SPMD_HARNESS_GCS_URI  read by the launcher, which passes it to the pods: each worker also uploads its report to gs://...
#
# Exit status: the launcher's (non-zero when any host failed). The launcher's summary.md is
# appended to $GITHUB_STEP_SUMMARY when that is set.
set -euo pipefail

# shellcheck source=scripts/workflow-commands.sh
source "$(dirname "$0")/workflow-commands.sh"

die() { echo "nightly-multislice: $*" >&2; exit 2; }

default_topology() {
  case $1 in
    v6e) echo 4x4 ;;
    v4) echo 2x2x2 ;;
    *) die "ACCELERATOR must be v6e or v4, got '$1'" ;;
  esac
}

resolve_image() {
  if [[ -n ${IMAGE:-} ]]; then
    echo "$IMAGE"
    return
  fi
  [[ -n ${WORKER_IMAGE_REPOSITORY:-} ]] || die "set IMAGE, or WORKER_IMAGE_REPOSITORY to build one"
  bash scripts/build-worker-image.sh "$WORKER_IMAGE_REPOSITORY" | tail -n 1
}

install_launcher() {
  [[ -x $venv/bin/python ]] || "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check -e '.[gke]'
}

publish_summary() {
  local summary=$out/summary.md
  [[ -n ${GITHUB_STEP_SUMMARY:-} ]] || return 0
  if [[ -f $summary ]]; then
    cat "$summary" >> "$GITHUB_STEP_SUMMARY"
  else
    echo "❌ The launcher wrote no summary ($summary); see the job log." >> "$GITHUB_STEP_SUMMARY"
  fi
}

main() {
  cd "$(dirname "$0")/.."
  local accelerator=${ACCELERATOR:-v6e}
  local topology=${TOPOLOGY:-$(default_topology "$accelerator")}
  local slices=${SLICES:-2}
  local job_size=${JOB_SIZE:-small}
  out=${OUT:-gke-results}
  venv=${VENV:-.venv}
  [[ $slices =~ ^[1-9][0-9]*$ ]] || die "SLICES must be a positive integer, got '$slices'"
  # Checked here too (the launcher refuses it as well), before the launcher's install and the image build.
  [[ $job_size =~ ^(tiny|small|medium)$ ]] || die "JOB_SIZE must be tiny, small or medium (cases/jobsize.py), got '$job_size'"

  install_launcher
  local image
  image=$(resolve_image)
  echo "nightly-multislice: $slices x $accelerator $topology, $job_size job, image $image" >&2

  local rc=0
  # The launcher relays text from the cluster (pod and kubelet messages): it may not command the runner.
  untrusted_output "$venv/bin/python" -m harness.gke run --accelerator "$accelerator" --topology "$topology" \
    --slices "$slices" --image "$image" --out "$out" --timeout "${LAUNCH_TIMEOUT_S:-7200}" \
    --job-size "$job_size" || rc=$?
  publish_summary
  exit "$rc"
}

main "$@"
