#!/usr/bin/env bash
# The guilds serve image for the test cluster, built with no registry and put into the
# cluster's containerd (as scripts/kube-test-env.sh puts the sandbox image there), and a
# sandbox image with this checkout's helpers beside it (the replicas check them).
#
#   bash scripts/kube-serve-image.sh PYTHON     # prints both images' names in the cluster, one a line
#
# PYTHON: an interpreter with guilds and its postgres extra installed (the venv).
# The base is the Docker engine's guilds-base:local (scripts/docker-test-env.sh) with
# this machine's libstdc++ added (greenlet's extension needs it); then
# `guilds serve image --no-install` copies this guilds and its dependencies on top.
# Tagged after the image's id: a changed guilds gives a new tag, never a stale image.
# Needs DOCKER_HOST (scripts/docker-test-env.sh) and the cluster of scripts/kube-test-env.sh.
set -euo pipefail
PYTHON=${1:?usage: kube-serve-image.sh PYTHON}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${GUILDS_KUBE_DIR:-/tmp/guilds-kube}
CTR_SOCK=$DIR/containerd/containerd.sock
BASE=guilds-serve-base:local
log() { echo "kube-serve-image: $*" >&2; }

serve_base() {
  docker image inspect "$BASE" >/dev/null 2>&1 && return 0
  local work
  work=$(mktemp -d)
  cp -L /usr/lib/x86_64-linux-gnu/libstdc++.so.6 "$work/"
  printf 'FROM guilds-base:local\nCOPY libstdc++.so.6 /usr/lib/x86_64-linux-gnu/\n' >"$work/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$BASE" "$work" >/dev/null 2>"$work/build.log" \
    || { cat "$work/build.log" >&2; exit 1; }
  rm -rf "$work"
}

# into_cluster NAME: the Docker engine's NAME into the cluster's containerd, tagged after its id
# (a changed build gives a new tag, never a stale image); prints the tag.
into_cluster() {
  local id image
  id=$(docker image inspect -f '{{.Id}}' "$1")
  id=${id#sha256:}
  image=${1%%:*}:kube-${id:0:13}
  if ! ctr -a "$CTR_SOCK" -n k8s.io images ls -q | grep -qx "docker.io/library/$image"; then
    docker tag "$1" "$image"
    docker save "$image" | ctr -a "$CTR_SOCK" -n k8s.io images import - >/dev/null
    log "imported $image"
  fi
  echo "$image"
}

# Built under tags of this run's own (runs at once on one engine would take each other's), then
# tagged after their ids.
serve_base
trap 'docker rmi -f "guilds-serve:build-$$" "guilds-sandbox-deploy:build-$$" >/dev/null 2>&1 || true' EXIT
PYTHONPATH="$ROOT/src" "$PYTHON" -m guilds.fronts.cli serve image --base "$BASE" --no-install \
  --tag "guilds-serve:build-$$" >/dev/null
PYTHONPATH="$ROOT/src" "$PYTHON" -m guilds.fronts.cli sandbox image --base guilds-base:local --no-install \
  --tag "guilds-sandbox-deploy:build-$$" >/dev/null
into_cluster "guilds-serve:build-$$"
into_cluster "guilds-sandbox-deploy:build-$$"
