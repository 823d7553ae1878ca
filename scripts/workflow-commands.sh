# Sourced by ci-spmd.sh and nightly-multislice.sh (not run on its own).
#
# Under GitHub Actions the runner executes every line of a step's output, stdout or stderr, that
# looks like a workflow command: `::error::` adds an annotation, `##[stop-commands]TOKEN` (anywhere
# in a line) silences all later commands until `::TOKEN::`. Output of the code under test (pytest
# and the cases, the pods' text the launcher relays) must not be able to do either, or a case's
# exception message could hide every ::error the harness prints afterwards. So that output runs
# between a stop and a resume whose token only this shell knows: random, never exported, fresh
# per call.

# Run "$@" with workflow commands stopped (under GitHub Actions); returns its exit status.
untrusted_output() {
  local rc=0 token
  if [[ ${GITHUB_ACTIONS:-} != true ]]; then
    "$@" || rc=$?
    return "$rc"
  fi
  token=$(od -vAn -N16 -tx1 /dev/urandom | tr -d ' \n')
  if [[ ! $token =~ ^[0-9a-f]{32}$ ]]; then
    echo "could not read 16 random bytes from /dev/urandom for the stop-commands token" >&2
    return 2
  fi
  echo "::stop-commands::$token"
  # 2>&1: the runner reads stdout and stderr through separate pipes, so a line written to stderr
  # could be read after the resume below; one stream keeps every line before it.
  "$@" 2>&1 || rc=$?
  echo "::$token::"
  return "$rc"
}
