#!/usr/bin/env bash
# The SPMD regression run of the reusable PR workflow (.github/workflows/spmd-regression.yml),
# as a script that runs the same on a laptop:
#
#   bash scripts/ci-spmd.sh                      # the pinned PyPI torch/torch_xla (pyproject's xla extra)
#   bash scripts/ci-spmd.sh --wheels /tmp/wheels # torch + torch_xla wheels built by a torch_xla PR
#   bash scripts/ci-spmd.sh --wheels /tmp/wheels --image us-central1-docker.pkg.dev/tpu-pytorch-releases/docker/development:3.12_tpuvm
#
# Options (each also settable through the environment variable in brackets):
#   --wheels DIR     folder with one torch-*.whl and one torch_xla-*.whl   [SPMD_WHEELS_DIR]
#   --base-wheels DIR  the PR's base build (same layout): the suite runs on it first, in a venv of
#                    its own (VENV-base) with results in RESULTS/base/, then on --wheels with
#                    --spmd-compare pointed at that exact run folder: a sharding or cost change
#                    between the two builds fails the PR's case   [SPMD_BASE_WHEELS_DIR]
#   --base-venv DIR  the PR's base build already installed in a virtualenv, used as it is (instead
#                    of --base-wheels): two existing venvs compared, e.g.
#                    --base-venv ../xla-base/.venv --venv ../xla-pr/.venv --skip-install   [SPMD_BASE_VENV]
#   --devices N      CPU XLA devices per case (default 4)                   [SPMD_DEVICES]
#   --results-dir DIR  results folder (default results)                     [SPMD_RESULTS_DIR]
#   --known-bugs PATH  the known-bug registry to judge by (default: the harness's own,
#                    harness/known_bugs.toml), e.g. a torch_xla PR's copy     [SPMD_KNOWN_BUGS]
#   --workers N      pytest-xdist workers (default 2)                       [SPMD_WORKERS]
#   --venv DIR       virtualenv to create/use (default .venv)               [SPMD_VENV]
#   --python-version X.Y  refuse to start unless python3 (or $PYTHON) is X.Y [SPMD_PYTHON_VERSION]
#   --image IMAGE    run all of the above inside this image (docker run), as pytorch/xla tests its
#                    wheels in its development image; venv default .venv-image  [SPMD_IMAGE]
#   --run-id ID      name of the run folder (and of the base run's, in RESULTS/base/); default a fresh
#                    run-<time>-ci<pid>-<random>. The reusable workflow names it from its own context,
#                    so the job that reports knows which folder to read without asking this one  [SPMD_RUN_ID]
#   --report-later   write no job summary, annotations or counts: a later job reports the uploaded
#                    results folder with scripts/ci-spmd-report.sh, running no code under test. This
#                    job's step outputs are then only pytest-exit-status (and base-pytest-exit-status),
#                    written after pytest ended, and its log gets the plain report  [SPMD_REPORT_LATER=true]
#   --case-user USER run every case child as USER (--spmd-case-user), so the code under test can
#                    write none of the run's files and signal none of its processes; needs root.
#                    `auto`: as root, a user of its own (spmd-case, created if missing; nobody when
#                    useradd is missing); not root, pytest's own user (the run header says
#                    unisolated). With --image, `auto` or a USER starts the image as root, and the
#                    files the run made are given back to the caller's uid at the end  [SPMD_CASE_USER]
#   --skip-install   use the virtualenv as it is
#   -- ARGS          passed on to pytest
#
# Writes RESULTS/junit.xml and the run's folder RESULTS/run-*/ (verdicts-*.jsonl, child logs,
# summary.md, also appended to $GITHUB_STEP_SUMMARY when set; RESULTS/latest points at it) and,
# under GitHub Actions, ::error annotations for failures (with --report-later neither: the report
# job writes them). Nothing earlier runs wrote is deleted.
# Under GitHub Actions, workflow commands are stopped while pytest runs (its stderr then joins its
# stdout), so nothing the code under test prints can annotate, mask or silence the job, and the
# step's files ($GITHUB_OUTPUT, $GITHUB_ENV, ...) are put back as they were before it ran. The run's
# folder is named here (--spmd-run-id), and the report reads exactly it, held to pytest's exit
# status: nothing a case writes in the results folder (`latest`, records, run.json) makes it green.
# The report's code is imported before the first case runs (harness/heldreport.py, a process that
# then imports nothing more), so a case that rewrites harness/report.py in this checkout cannot
# change what reports it; that process killed, the run is not reported and the script fails.
# Exit status: pytest's, except that a run that ran nothing (pytest exit 5, or no case records)
# always fails; 2 for a usage error (an unknown option, a missing --known-bugs file, wheels for
# another Python).
set -euo pipefail

# pytorch/xla PR wheels pin nightly jax/jaxlib in their pallas extra. Those are published to JAX's
# artifact-registry index; pytorch/xla's CI (_test.yml) installs the wheels first and then their
# pallas extra with `--pre --index-url` of that index, which also serves what jax depends on.
JAX_NIGHTLY_INDEX=https://us-python.pkg.dev/ml-oss-artifacts-published/jax/simple/
PYTEST_NO_TESTS_COLLECTED=5

wheels_dir=${SPMD_WHEELS_DIR:-}
base_wheels_dir=${SPMD_BASE_WHEELS_DIR:-}
base_venv=${SPMD_BASE_VENV:-}
base_run=''  # the base build's run folder, once it ran
devices=${SPMD_DEVICES:-4}
results_dir=${SPMD_RESULTS_DIR:-}
known_bugs=${SPMD_KNOWN_BUGS:-}
workers=${SPMD_WORKERS:-2}
venv=${SPMD_VENV:-}
python_version=${SPMD_PYTHON_VERSION:-}
image=${SPMD_IMAGE:-}
skip_install=false
report_later=${SPMD_REPORT_LATER:-false}
case_user=${SPMD_CASE_USER:-}
host_owner=${SPMD_HOST_OWNER:-}  # uid:gid of the caller of --image, when the image runs as root
pytest_extra=()
run_id=${SPMD_RUN_ID:-}
fixed_run_id=''  # set from --run-id
base_rc=''  # the base build's pytest exit status, once it ran

# shellcheck source=scripts/workflow-commands.sh
source "$(dirname "$0")/workflow-commands.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "ci-spmd: $*" >&2; exit 2; }

parse_args() {
  while [[ $# -gt 0 ]]; do
    case $1 in
      --wheels) wheels_dir=${2:?--wheels needs a folder}; shift 2 ;;
      --base-wheels) base_wheels_dir=${2:?--base-wheels needs a folder}; shift 2 ;;
      --base-venv) base_venv=${2:?--base-venv needs a folder}; shift 2 ;;
      --devices) devices=${2:?--devices needs a number}; shift 2 ;;
      --results-dir) results_dir=${2:?--results-dir needs a folder}; shift 2 ;;
      # The 0.1.0 spelling, kept so existing callers keep working; --help shows only --results-dir.
      --results) results_dir=${2:?--results needs a folder}; shift 2 ;;
      --known-bugs) known_bugs=${2:?--known-bugs needs a file}; shift 2 ;;
      --workers) workers=${2:?--workers needs a number}; shift 2 ;;
      --venv) venv=${2:?--venv needs a folder}; shift 2 ;;
      --python-version) python_version=${2:?--python-version needs X.Y}; shift 2 ;;
      --image) image=${2:?--image needs an image reference}; shift 2 ;;
      --run-id) run_id=${2:?--run-id needs a name}; shift 2 ;;
      --report-later) report_later=true; shift ;;
      --case-user) case_user=${2:?--case-user needs a user name or auto}; shift 2 ;;
      --skip-install) skip_install=true; shift ;;
      --) shift; pytest_extra=("$@"); break ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
  done
  [[ $devices =~ ^[1-9][0-9]*$ ]] || die "--devices must be a positive integer, got '$devices'"
  [[ $workers =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, got '$workers'"
  [[ $report_later == true || $report_later == false ]] ||
    die "SPMD_REPORT_LATER must be true or false, got '$report_later'"
  # As the plugin's --spmd-run-id: `run-` and a plain name (harness/records/runfolder.py).
  [[ -z $run_id || $run_id =~ ^run-[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]] ||
    die "--run-id must be run- and a plain name (letters, digits, . _ -), got '$run_id'"
  fixed_run_id=$run_id
  [[ -z $case_user || $case_user =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] ||
    die "--case-user must be a user name or auto, got '$case_user'"
  [[ -z $host_owner || $host_owner =~ ^[0-9]+:[0-9]+$ ]] || die "SPMD_HOST_OWNER must be uid:gid, got '$host_owner'"
  # Checked here, before minutes of installing: pytest would refuse it only at its start.
  [[ -z $base_wheels_dir || -d $base_wheels_dir ]] || die "--base-wheels $base_wheels_dir: no such folder"
  [[ -z $base_wheels_dir || -z $base_venv ]] || die "--base-wheels and --base-venv both name the base build: give one"
  [[ -z $base_venv || -x $base_venv/bin/python ]] ||
    die "--base-venv $base_venv: no virtualenv there ($base_venv/bin/python is missing)"
  [[ -z $known_bugs || -f $known_bugs ]] ||
    die "--known-bugs $known_bugs: no such file (a path in the calling repository's checkout, e.g. its copy of harness/known_bugs.toml)"
}

# Exactly one wheel matching the pattern, or a message that says what was found.
single_wheel() {
  local pattern=$1 matches
  mapfile -t matches < <(compgen -G "$wheels_dir/$pattern" || true)
  # The names are the PR's text, printed outside the stop-commands window: no `##[` in them.
  local shown=${matches[*]:-none}
  [[ ${#matches[@]} -eq 1 ]] ||
    die "expected one $pattern in $wheels_dir, found ${#matches[@]}: ${shown//'##['/'#%23['}"
  echo "${matches[0]}"
}

# The interpreter this run installs into: the venv's once it exists, else the one it is made from.
job_python() {
  if [[ -x $venv/bin/python ]]; then echo "$venv/bin/python"; else echo "${PYTHON:-python3}"; fi
}

# Wheels built for another Python cannot be installed: say so in the first seconds, naming both.
check_python_of_wheels() {
  "$(job_python)" -m harness.wheeltags --check "$wheels_dir" || exit 2
}

# The workflow's python-version input. On the runner, setup-python installed exactly that; in a
# container job the image brings its own Python, which no input changes: say so before anything.
check_requested_python() {
  [[ -z $python_version ]] && return 0
  local have
  have=$("$(job_python)" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $have == "$python_version" ]] ||
    die "python-version is $python_version, but this job's Python is $have (in a container job, the image's):" \
        "leave python-version empty, pick an image with Python $python_version (input container)," \
        "or run on the runner with container: ''"
}

install() {
  local torch_wheel xla_wheel
  check_requested_python
  if [[ -n $wheels_dir ]]; then
    torch_wheel=$(single_wheel 'torch-*.whl')
    xla_wheel=$(single_wheel 'torch_xla-*.whl')
    check_python_of_wheels
  fi
  [[ -x $venv/bin/python ]] || "${PYTHON:-python3}" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
  if [[ -n $wheels_dir ]]; then
    # As pytorch/xla's CI does: the PR's torch and torch_xla (their dependencies from PyPI), then
    # the nightly jax/jaxlib their pallas extra pins, from JAX's index only; then the harness,
    # whose own dependencies name no torch and want no pre-releases.
    # pip prints the wheels' names and metadata, the PR's text: inside the stop-commands window.
    untrusted_output "${pip[@]}" "$torch_wheel" "$xla_wheel" || exit
    untrusted_output "${pip[@]}" --pre --index-url "$JAX_NIGHTLY_INDEX" "${xla_wheel}[pallas]" || exit
    "${pip[@]}" -e .
  else
    "${pip[@]}" -e '.[xla]'
  fi
}

# Every pytest run writes into a folder of its own under the results folder (harness/records/runfolder.py);
# nothing is deleted. This script names that folder itself (--spmd-run-id) and reports exactly
# it: `latest`, or any other file in the results folder, can be rewritten by the code under test.
new_run_id() {
  [[ -n $fixed_run_id ]] && { echo "$fixed_run_id"; return; }
  echo "run-$(date -u +%Y%m%d-%H%M%S)-ci$$-$(od -vAn -N4 -tx1 /dev/urandom | tr -d ' \n')"
}

run_pytest() {
  # `--opt=value`: pytest finds its rootdir and config before plugins register their options, so
  # a separate value of a plugin option would be taken for a test path. `cases` keeps the run to
  # the SPMD cases: collecting tests/ could fail on test-only imports this venv does not have.
  local registry=() compare=() isolation=()
  [[ -n $known_bugs ]] && registry=("--spmd-known-bugs=$known_bugs")
  [[ -n $base_run ]] && compare=("--spmd-compare=$base_run")
  [[ -n $case_user ]] && isolation=("--spmd-case-user=$case_user")
  "$venv/bin/pytest" cases -m spmd -n "$workers" --spmd-backend=cpu --spmd-devices="$devices" \
    --spmd-results-dir="$results_dir" --spmd-run-id="$run_id" --junitxml="$results_dir/junit.xml" \
    "${registry[@]}" "${compare[@]}" "${isolation[@]}" "${pytest_extra[@]}"
}

# --case-user auto: as root, a user of its own, which no other process of the machine runs as;
# not root, nobody to drop to (the run header then says the cases are unisolated).
resolve_case_user() {
  [[ $case_user == auto ]] || return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "ci-spmd: not root, so the cases run as this script's user (unisolated; the run header says so)" >&2
    case_user=''
    return 0
  fi
  case_user=spmd-case
  id -u "$case_user" > /dev/null 2>&1 && return 0
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$case_user" ||
    case_user=nobody
}

# In an image started as root for --case-user: the run's results and venvs go back to the caller's
# uid, as a run with that uid would have left them (what pip and pytest leave in the checkout, its
# egg-info and caches, stays root's: a fresh runner does not care, a reused one's next checkout may).
give_back_to_host_owner() {
  [[ -n $host_owner ]] || return 0
  local path
  for path in "$results_dir" "$venv" "${venv}-base"; do
    if [[ -e $path ]]; then
      chown -R --no-dereference "$host_owner" "$path" || echo "ci-spmd: could not give $path back to $host_owner" >&2
    fi
  done
  return 0
}

# The report's code, imported before any case of this job runs (harness/heldreport.py), in a
# process that then imports nothing more: a case that rewrites harness/report.py (or what it
# imports, or their bytecode) in this checkout cannot change what reports its run. It waits on
# the coproc HELD (whose descriptors no command this script starts inherits) for each report,
# and prints to this script's stdout and stderr.
hold_report() {
  local job_out ready=''
  exec {job_out}>&1
  coproc HELD { exec "$venv/bin/python" -m harness.heldreport 3 3>&1 1>&"$job_out"; }
  exec {job_out}>&-
  read -r -t 600 -u "${HELD[0]}" ready || true
  [[ $ready == ready ]] || die "the report (python -m harness.heldreport) did not load; see its error above"
}

# One report by the held process: its arguments (a count, then each, NUL-ended); its exit status.
held_report() {
  local code=''
  if [[ -n ${HELD[1]:-} ]] && printf '%s\0' "$#" "$@" >&"${HELD[1]}"; then
    read -r -u "${HELD[0]}" code || true
  fi
  if [[ ! $code =~ ^[0-9]+$ ]]; then
    echo "ci-spmd: the report process loaded before the cases ended without reporting (killed?): not a pass" >&2
    return 1
  fi
  return "$code"
}

# The report of this run's folder, held to the exit status pytest gave this script: a manifest
# that disagrees, or a missing one, is a failure; a non-zero status is never reported green.
# With --report-later it runs like the code under test (it is this job's checkout, which a case
# could have rewritten): its output is inert and it writes none of the step's files; the job
# summary, annotations and counts come from the report job.
report() {
  if [[ $report_later == true ]]; then
    untrusted_output report_here "$@"
  else
    report_here "$@"
  fi
}

report_here() {
  local pytest_rc=$1 label=${2:-} annotate=()
  local title=(--title "SPMD regression results${label:+: $label}")
  # The base build's failures are not the PR's: only the PR's run annotates the job.
  [[ ${GITHUB_ACTIONS:-} == true && -z $label && $report_later == false ]] && annotate=(--annotate)
  local args=("$results_dir/$run_id" --pytest-exit-status "$pytest_rc" "${annotate[@]}" "${title[@]}")
  if [[ $report_later == false ]]; then
    held_report "${args[@]}"
  else
    # python -m puts the working directory (the repo root) on sys.path, so harness imports even
    # when the venv was set up by someone else.
    "$venv/bin/python" -m harness.report "${args[@]}"
  fi
}

# The suite on the base build, in a venv and a results folder of its own; sets base_run to the
# exact run folder it made (named here, like the PR's), for --spmd-compare.
run_base() {
  local pr_wheels=$wheels_dir pr_venv=$venv pr_results=$results_dir rc=0
  wheels_dir=$base_wheels_dir venv=${base_venv:-$venv-base} results_dir=$results_dir/base
  [[ $skip_install == true || -n $base_venv ]] || install  # --base-venv is used as it is
  mkdir -p "$results_dir"
  run_id=$(new_run_id)
  untrusted_output run_pytest || rc=$?
  if [[ ! -d $results_dir/$run_id || -L $results_dir/$run_id ]]; then
    die "the base build's suite (pytest exit $rc) wrote no run folder under $results_dir: nothing to compare with"
  fi
  # 0 and 1 are a suite that ran as a whole; anything else leaves records the comparison refuses.
  [[ $rc -le 1 ]] || die "the base build's suite ended with pytest exit $rc: nothing to compare with"
  base_run=$results_dir/$run_id
  base_rc=$rc
  report "$rc" "base build" || true  # its summary goes first in the job summary; its failures are its own
  wheels_dir=$pr_wheels venv=$pr_venv results_dir=$pr_results
}

# What the report job needs from this one, written after pytest ended (the untrusted window has
# put the step's files back): the exit status of each pytest, which the report holds the run's
# manifest to. Nothing else: the counts come from the report job.
exit_statuses_for_the_report_job() {
  [[ -n ${GITHUB_OUTPUT:-} ]] || return 0
  {
    echo "pytest-exit-status=$1"
    if [[ -n $base_rc ]]; then echo "base-pytest-exit-status=$base_rc"; fi
  } >> "$GITHUB_OUTPUT"
}

# This same script, inside `image`: the repository, the wheels, the results folder and the job
# summary are mounted at the same paths, so every path means the same on both sides. The caller's
# uid runs it (files stay theirs), with a HOME and USER an unknown uid lacks in the image.
run_in_image() {
  command -v docker > /dev/null || die "--image needs docker on PATH (or run without --image / container: '')"
  local mounts=(-v "$PWD:$PWD") env=(-e HOME=/tmp -e "USER=${USER:-spmd}")
  [[ -n $wheels_dir ]] && mounts+=(-v "$wheels_dir:$wheels_dir:ro")
  [[ -n $base_wheels_dir ]] && mounts+=(-v "$base_wheels_dir:$base_wheels_dir:ro")
  [[ -n $base_venv && $base_venv != "$PWD"/* ]] && mounts+=(-v "$base_venv:$base_venv")
  [[ $results_dir == "$PWD"/* ]] || { mkdir -p "$results_dir"; mounts+=(-v "$results_dir:$results_dir"); }
  [[ $venv == "$PWD"/* ]] || { mkdir -p "$venv"; mounts+=(-v "$venv:$venv"); }
  [[ -n $known_bugs && $known_bugs != "$PWD"/* ]] && mounts+=(-v "$known_bugs:$known_bugs:ro")
  # The job summary and the step's outputs (harness.report writes the counts there).
  local file
  for file in GITHUB_STEP_SUMMARY GITHUB_OUTPUT; do
    if [[ -n ${!file:-} ]]; then
      mounts+=(-v "${!file}:${!file}")
      env+=(-e "$file")
    fi
  done
  [[ -n ${GITHUB_ACTIONS:-} ]] && env+=(-e GITHUB_ACTIONS)
  local inner=(bash scripts/ci-spmd.sh --devices "$devices" --results-dir "$results_dir" --workers "$workers"
               --venv "$venv")
  [[ -n $known_bugs ]] && inner+=(--known-bugs "$known_bugs")
  [[ -n $wheels_dir ]] && inner+=(--wheels "$wheels_dir")
  [[ -n $base_wheels_dir ]] && inner+=(--base-wheels "$base_wheels_dir")
  [[ -n $base_venv ]] && inner+=(--base-venv "$base_venv")
  [[ -n $python_version ]] && inner+=(--python-version "$python_version")
  [[ $skip_install == true ]] && inner+=(--skip-install)
  [[ $report_later == true ]] && inner+=(--report-later)
  # Isolated cases need root in the image; the caller's uid gets the run's files back.
  local docker_user
  docker_user="$(id -u):$(id -g)"
  if [[ -n $case_user ]]; then
    inner+=(--case-user "$case_user")
    env+=(-e "SPMD_HOST_OWNER=$docker_user")
    docker_user=0:0
  fi
  [[ -n $fixed_run_id ]] && inner+=(--run-id "$fixed_run_id")
  # --shm-size: what pytorch/xla's _test.yml gives its test containers.
  exec docker run --rm --shm-size 16g --user "$docker_user" "${mounts[@]}" "${env[@]}" -w "$PWD" \
    "$image" "${inner[@]}" -- "${pytest_extra[@]}"
}

# Paths given by the caller are relative to where they ran the script; defaults to the repo root.
absolute() {
  if [[ -z $1 || $1 == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi
}

main() {
  parse_args "$@"
  wheels_dir=$(absolute "$wheels_dir")
  base_wheels_dir=$(absolute "$base_wheels_dir")
  base_venv=$(absolute "$base_venv")
  results_dir=$(absolute "$results_dir")
  venv=$(absolute "$venv")
  known_bugs=$(absolute "$known_bugs")
  cd "$(dirname "$0")/.."
  results_dir=${results_dir:-$PWD/results}
  # A venv made in the image points at the image's Python: keep it apart from the host's .venv.
  if [[ -n $image ]]; then venv=${venv:-$PWD/.venv-image}; run_in_image; fi
  venv=${venv:-$PWD/.venv}
  resolve_case_user
  trap give_back_to_host_owner EXIT
  [[ $skip_install == true ]] || install
  # Before any case of this job (the base build's too) runs: the report's code, loaded.
  [[ $report_later == true ]] || hold_report
  [[ -n $base_wheels_dir || -n $base_venv ]] && run_base
  mkdir -p "$results_dir"

  local pytest_rc=0 report_rc=0
  run_id=$(new_run_id)
  # Nothing pytest or a case prints may command the runner; the report's ::error lines must work.
  untrusted_output run_pytest || pytest_rc=$?
  [[ $report_later == false ]] || exit_statuses_for_the_report_job "$pytest_rc"
  if [[ ! -d $results_dir/$run_id || -L $results_dir/$run_id ]]; then
    echo "ci-spmd: pytest (exit $pytest_rc) wrote no run folder under $results_dir: no case ran." >&2
    [[ $pytest_rc -ne 0 ]] && exit "$pytest_rc"
    exit 2  # as harness.report's "no case records"
  fi
  report "$pytest_rc" || report_rc=$?

  if [[ $pytest_rc -eq $PYTEST_NO_TESTS_COLLECTED ]]; then
    echo "ci-spmd: pytest collected no spmd cases (exit 5); a run that ran nothing is a failure." >&2
  fi
  if [[ $pytest_rc -ne 0 ]]; then
    exit "$pytest_rc"
  fi
  exit "$report_rc"
}

main "$@"
