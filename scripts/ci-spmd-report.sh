#!/usr/bin/env bash
# The report job of the reusable PR workflow (.github/workflows/spmd-regression.yml): the job
# summary, the ::error annotations and the counts (the workflow's outputs) of a run that
# `scripts/ci-spmd.sh --report-later` made in another job, read from its uploaded results folder.
#
#   bash scripts/ci-spmd-report.sh --results-dir DIR --run-id ID --pytest-exit-status N
#
# It runs no code under test: the harness comes from this checkout (the harness's pinned ref, not
# the PR's tree) and is installed without torch or torch_xla, which the report does not need. The
# results folder is untrusted input (a case body could write any of it): harness.report validates
# every file and holds the records to the exit status pytest gave the suite job.
#
# Options (each also settable through the environment variable in brackets):
#   --results-dir DIR       the downloaded results folder                  [SPMD_RESULTS_DIR]
#   --run-id ID             the run folder the suite job named (ci-spmd.sh --run-id)  [SPMD_RUN_ID]
#   --pytest-exit-status N  what pytest exited with in the suite job; empty: it never finished,
#                           and the report fails saying so              [SPMD_PYTEST_EXIT_STATUS]
#   --base-pytest-exit-status N  the same for the base build's run (RESULTS/base/ID); empty:
#                           there was none                         [SPMD_BASE_PYTEST_EXIT_STATUS]
#   --suite-result R        the suite job's result (success, failure, cancelled): a job that did
#                           not succeed is never reported green     [SPMD_SUITE_RESULT]
#   --venv DIR              virtualenv for the harness (default .venv-report)   [SPMD_VENV]
#   --skip-install          use the virtualenv as it is
#
# Exit status: pytest's when it is not 0, else harness.report's, else 1 when the suite job did
# not succeed; 2 for a usage error.
set -euo pipefail

results_dir=${SPMD_RESULTS_DIR:-}
run_id=${SPMD_RUN_ID:-}
pytest_rc=${SPMD_PYTEST_EXIT_STATUS:-}
base_rc=${SPMD_BASE_PYTEST_EXIT_STATUS:-}
suite_result=${SPMD_SUITE_RESULT:-success}
venv=${SPMD_VENV:-}
skip_install=false

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "ci-spmd-report: $*" >&2; exit 2; }

parse_args() {
  while [[ $# -gt 0 ]]; do
    case $1 in
      --results-dir) results_dir=${2:?--results-dir needs a folder}; shift 2 ;;
      --run-id) run_id=${2:?--run-id needs a name}; shift 2 ;;
      --pytest-exit-status) pytest_rc=$2; shift 2 ;;
      --base-pytest-exit-status) base_rc=$2; shift 2 ;;
      --suite-result) suite_result=${2:?--suite-result needs a result}; shift 2 ;;
      --venv) venv=${2:?--venv needs a folder}; shift 2 ;;
      --skip-install) skip_install=true; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
  done
  [[ -n $results_dir ]] || die "--results-dir is required (the downloaded results artifact)"
  [[ $run_id =~ ^run-[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]] ||
    die "--run-id must be run- and a plain name (letters, digits, . _ -), got '$run_id'"
  [[ -z $pytest_rc || $pytest_rc =~ ^[0-9]{1,3}$ ]] || die "--pytest-exit-status must be a number, got '$pytest_rc'"
  [[ -z $base_rc || $base_rc =~ ^[0-9]{1,3}$ ]] || die "--base-pytest-exit-status must be a number, got '$base_rc'"
  [[ $suite_result =~ ^(success|failure|cancelled|skipped)$ ]] ||
    die "--suite-result must be success, failure, cancelled or skipped, got '$suite_result'"
}

install() {
  [[ -x $venv/bin/python ]] || "${PYTHON:-python3}" -m venv "$venv"
  # The harness alone (pytest, PyYAML, ...): no extra, so no torch or torch_xla.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check .
}

# A suite job that ended before its pytest did has nothing to report; that is a failure, said once.
no_exit_status() {
  local message="the suite job (result: $suite_result) gave no pytest exit status: it ended before pytest did (see its log), so nothing it left is reported"
  echo "::error title=SPMD regression::$message"
  if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then
    printf '## SPMD regression results\n\n%s.\n' "${message^}" >> "$GITHUB_STEP_SUMMARY"
  fi
  exit 1
}

main() {
  parse_args "$@"
  [[ -z $results_dir || $results_dir == /* ]] || results_dir=$PWD/$results_dir
  [[ -z $venv || $venv == /* ]] || venv=$PWD/$venv
  cd "$(dirname "$0")/.."
  venv=${venv:-$PWD/.venv-report}
  [[ $skip_install == true ]] || install
  [[ -n $pytest_rc ]] || no_exit_status

  # The base build's run first (its table leads the summary); its failures are its own: no
  # annotations, and the step's outputs are the PR run's counts alone.
  if [[ -n $base_rc ]]; then
    env -u GITHUB_OUTPUT "$venv/bin/python" -m harness.report "$results_dir/base/$run_id" \
      --pytest-exit-status "$base_rc" --title "SPMD regression results: base build" || true
  fi
  local report_rc=0 annotate=()
  [[ ${GITHUB_ACTIONS:-} == true ]] && annotate=(--annotate)
  "$venv/bin/python" -m harness.report "$results_dir/$run_id" --pytest-exit-status "$pytest_rc" \
    "${annotate[@]}" || report_rc=$?

  [[ $pytest_rc -eq 0 ]] || exit "$pytest_rc"
  [[ $report_rc -eq 0 ]] || exit "$report_rc"
  if [[ $suite_result != success ]]; then
    echo "ci-spmd-report: pytest exited 0, but the suite job's result is $suite_result: not a pass (see its log)" >&2
    exit 1
  fi
}

main "$@"
