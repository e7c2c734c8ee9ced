#!/usr/bin/env bash
# A Docker engine of our own for the docker backend's tests, and the sandbox image in it.
#
#   eval "$(bash scripts/docker-test-env.sh)"     # prints: export DOCKER_HOST=unix://...
#   bash scripts/docker-test-env.sh --stop         # stops that engine
#   bash scripts/docker-test-env.sh --packages     # the Debian packages it needs (.ci/run installs them early)
#
# Idempotent: installs docker.io only if dockerd is missing, starts dockerd only
# if its socket does not answer, imports the base image only if it is missing.
# The engine is root's, with its own --data-root, --exec-root, pidfile and socket
# under $GUILDS_DOCKERD_DIR (default /tmp/guilds-dockerd), and no iptables and
# no bridge: containers run with network "none".
#
# No registry is reachable here, so the base image is a root filesystem made
# from this machine's own Debian packages (python3, bash, git, ripgrep,
# coreutils, tar, procps and what they depend on), `docker import`ed; then the
# helpers go on top with `docker build`, from the Dockerfile and context that
# `guilds sandbox image --no-install` uses (made with the standard library
# only: no virtualenv needed). Progress goes to stderr; stdout is only the
# export line.
set -euo pipefail

DIR=${GUILDS_DOCKERD_DIR:-/tmp/guilds-dockerd}
SOCK="$DIR/docker.sock"
export DOCKER_HOST="unix://$SOCK"
BASE=${GUILDS_BASE_IMAGE:-guilds-base:local}
IMAGE=${GUILDS_SANDBOX_IMAGE:-guilds-sandbox:latest}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PACKAGES=(python3-minimal libpython3.11-stdlib bash dash coreutils git ripgrep grep sed libc-bin
          findutils tar procps util-linux gzip base-files base-passwd)

log() { echo "docker-test-env: $*" >&2; }
engine_up() { docker -H "$DOCKER_HOST" version >/dev/null 2>&1; }

stop_engine() {
  [ -f "$DIR/dockerd.pid" ] || { log "no engine of ours to stop"; return 0; }
  pid=$(cat "$DIR/dockerd.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  log "engine $pid stopped"
}

packages() {  # the engine (when dockerd is missing) and the base image's packages
  command -v dockerd >/dev/null || echo docker.io
  printf '%s\n' "${PACKAGES[@]}"
}
install_packages() {
  mapfile -t wanted < <(packages)
  bash "$ROOT/scripts/apt-missing.sh" docker-test-env "${wanted[@]}"
}

start_engine() {
  engine_up && return 0
  mkdir -p "$DIR/data" "$DIR/exec"
  log "starting dockerd ($DIR)"
  setsid dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
    -H "$DOCKER_HOST" --iptables=false --ip-masq=false --ip-forward=false --bridge=none \
    </dev/null >"$DIR/dockerd.log" 2>&1 &
  for _ in $(seq 150); do engine_up && return 0; sleep 0.2; done
  log "dockerd did not answer in 30 s:"; tail -5 "$DIR/dockerd.log" >&2; exit 1
}

# The files of PACKAGES and everything they depend on, as this machine has them.
package_files() {
  apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${PACKAGES[@]}" 2>/dev/null \
    | grep -v '^ ' | grep -v '<' | sort -u \
    | while read -r p; do
        dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed && dpkg -L "$p"
      done
}

# dpkg's paths resolved through this machine's merged-/usr links, folders and docs left out.
CANON='
import os, sys
skip = tuple("usr/share/" + d + "/" for d in ("doc", "man", "info", "locale", "lintian", "bug"))
seen = set()
for line in sys.stdin:
    p = line.rstrip("\n")
    if not p.startswith("/") or p == "/.":
        continue
    parent, base = os.path.split(p)
    real = os.path.join(os.path.realpath(parent), base)
    rel = real.lstrip("/")
    if os.path.lexists(real) and not (os.path.isdir(real) and not os.path.islink(real)) \
            and not rel.startswith(skip) and rel not in sys.argv[1:]:
        seen.add(rel)
print("\n".join(sorted(seen)))
'

# The build context of `guilds sandbox image --no-install` on BASE, as a tar on stdout, with
# the loader's cache made first: the base is files copied from this machine's packages, which
# hold no /etc/ld.so.cache (ldconfig makes it when a package is installed), and without one
# every program started in the container looks for each library in some 20 folders first.
CONTEXT='
import sys
from guilds.sandbox._container import helper_files
from guilds.sandbox.image import build_context, dockerfile
files = helper_files()
text = dockerfile(sys.argv[1], [n for n, _ in files], install=False).replace("\n", "\nRUN ldconfig\n", 1)
sys.stdout.buffer.write(build_context(text, files))
'

build_base() {
  docker image inspect "$BASE" >/dev/null 2>&1 && return 0
  log "making the base image $BASE from this machine's packages"
  local work="$DIR/rootfs" skel="$DIR/rootfs/skel"
  rm -rf "$work"; mkdir -p "$skel"
  (cd "$skel" && mkdir -p etc tmp var/tmp root run home proc sys dev usr/local/bin \
     && chmod 1777 tmp var/tmp && chmod 700 root \
     && for l in bin lib lib64 sbin; do ln -s "usr/$l" "$l"; done)
  printf 'root:x:0:0:root:/root:/bin/bash\nguilds:x:65532:65532:guilds agent:/nonexistent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' \
    >"$skel/etc/passwd"
  printf 'root:x:0:\nguilds:x:65532:\nnogroup:x:65534:\n' >"$skel/etc/group"
  (cd "$skel" && find . -mindepth 1 | sed 's|^\./||' | sort) >"$work/skel.txt"
  package_files | python3 -c "$CANON" $(cat "$work/skel.txt") >"$work/files.txt"
  tar -C / --no-recursion -cf "$work/base.tar" -T "$work/files.txt"
  tar -C "$skel" --owner=0 --group=0 --no-recursion -rf "$work/base.tar" -T "$work/skel.txt"
  docker import "$work/base.tar" "$BASE" >/dev/null
  rm -rf "$work"
}

if [ "${1:-}" = "--stop" ]; then stop_engine; exit 0; fi
if [ "${1:-}" = "--packages" ]; then packages; exit 0; fi
began=$SECONDS
install_packages
start_engine
build_base
log "building $IMAGE"
PYTHONPATH="$ROOT/src" python3 -c "$CONTEXT" "$BASE" | DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" - >&2
log "ready in $((SECONDS - began)) s"
echo "export DOCKER_HOST=$DOCKER_HOST"
