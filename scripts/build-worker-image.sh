#!/usr/bin/env bash
# Build the GKE worker image from k8s/image/Dockerfile, push it to Artifact Registry and print
# its immutable reference (repository@sha256:...) as the last line of stdout.
#
#   bash scripts/build-worker-image.sh REPOSITORY [TAG]
#   e.g. bash scripts/build-worker-image.sh us-central1-docker.pkg.dev/my-project/tpu/spmd-worker
#
# TAG defaults to <commit>-<UTC date>, so each nightly image says what it was built from.
# Needs docker and gcloud credentials allowed to push to the repository.
set -euo pipefail

die() { echo "build-worker-image: $*" >&2; exit 2; }

main() {
  local repository=${1:-} tag=${2:-}
  [[ -n $repository ]] || die "usage: $0 REPOSITORY [TAG] (e.g. REGION-docker.pkg.dev/PROJECT/REPO/spmd-worker)"
  [[ $repository == *-docker.pkg.dev/*/*/* ]] ||
    die "'$repository' is not an Artifact Registry image path (REGION-docker.pkg.dev/PROJECT/REPO/IMAGE)"
  cd "$(dirname "$0")/.."
  tag=${tag:-$(git rev-parse --short=12 HEAD)-$(date -u +%Y%m%d)}

  # Docker's credential helper for this registry host only, not every Google registry.
  gcloud auth configure-docker "${repository%%/*}" --quiet >&2
  docker build --file k8s/image/Dockerfile --tag "$repository:$tag" . >&2
  docker push "$repository:$tag" >&2
  # The digest, not the tag: every host of every slice must run the very same image.
  docker inspect --format '{{index .RepoDigests 0}}' "$repository:$tag"
}

main "$@"
