# Sourced by ci-spmd.sh and nightly-multislice.sh (not run on its own).
#
# Under GitHub Actions the runner executes every line of a step's output, stdout or stderr, that
# looks like a workflow command: `::error::` adds an annotation, `##[stop-commands]TOKEN` (anywhere
# in a line) silences all later commands until `::TOKEN::`. Output of the code under test (pytest
# and the cases, the pods' text the launcher relays) must not be able to do either, or a case's
# exception message could hide every ::error the harness prints afterwards. So that output runs
# between a stop and a resume whose token only this shell knows: random, never exported, fresh
# per call.
#
# The runner also reads files after the step: $GITHUB_OUTPUT (the step's outputs, e.g. the report's
# failed=N), $GITHUB_ENV and $GITHUB_PATH (later steps' environment), $GITHUB_STATE and
# $GITHUB_STEP_SUMMARY. The code under test runs as the same user and could write them (their
# names are in its environment, their folder is findable): they are kept in this shell's memory
# (not in a file, which that code could rewrite too) while it runs, and put back as they were.
STEP_FILES=(GITHUB_OUTPUT GITHUB_ENV GITHUB_PATH GITHUB_STATE GITHUB_STEP_SUMMARY)

# Run "$@" with workflow commands stopped and the step's files guarded (under GitHub Actions);
# returns its exit status.
untrusted_output() {
  local rc=0 token name
  local -A kept=()
  if [[ ${GITHUB_ACTIONS:-} != true ]]; then
    "$@" || rc=$?
    return "$rc"
  fi
  for name in "${STEP_FILES[@]}"; do
    # The x keeps trailing newlines, which $(...) would drop.
    [[ -n ${!name:-} && -f ${!name} ]] && kept[$name]="$(cat -- "${!name}"; echo x)"
  done
  token=$(od -vAn -N16 -tx1 /dev/urandom | tr -d ' \n')
  if [[ ! $token =~ ^[0-9a-f]{32}$ ]]; then
    echo "could not read 16 random bytes from /dev/urandom for the stop-commands token" >&2
    return 2
  fi
  echo "::stop-commands::$token"
  # 2>&1: the runner reads stdout and stderr through separate pipes, so a line written to stderr
  # could be read after the resume below; one stream keeps every line before it.
  (
    unset "${STEP_FILES[@]}"
    "$@"
  ) 2>&1 || rc=$?
  echo "::$token::"
  for name in "${STEP_FILES[@]}"; do
    [[ -n ${!name:-} ]] || continue
    rm -f -- "${!name}"  # a link put in its place is removed, not written through
    [[ -v kept[$name] ]] && printf '%s' "${kept[$name]%x}" > "${!name}"
  done
  return "$rc"
}
