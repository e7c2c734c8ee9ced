#!/usr/bin/env bash
# Builds the binaries of a single-node Kubernetes from Go modules and prints the
# folder that holds them: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl and etcd, and kube-router (its network-policy
# controller enforces NetworkPolicy objects on the test cluster).
#
# k8s.io/kubernetes' module zip leaves its staging/ tree out, so a small wrapper
# module requires it and replaces each staging module with its published
# v0.<minor>.<patch> release; etcd comes from go.etcd.io/etcd/server/v3 through
# etcdmain.Main in the same module (one set of shared dependencies).
#
# kube-router is its own module with no replace directives: `go install` of its
# cmd at the pinned version, kept beside the Kubernetes binaries. So is
# kubernetes-sigs/agent-sandbox (sigs.k8s.io/agent-sandbox): its controller's
# main package (cmd/agent-sandbox-controller; with --extensions it also runs the
# SandboxClaim, SandboxTemplate and SandboxWarmPool controllers), and beside it
# the module's k8s/ folder, which holds the CRDs (k8s/crds) and the RBAC
# (k8s/rbac.generated.yaml, k8s/extensions-rbac.generated.yaml) that
# scripts/kube-test-env.sh applies. Build only those with `--agent-sandbox`
# (it needs only go: CI starts it first, beside the other setup).
#
# `--snapshot-crds` fetches only kubernetes-csi's external-snapshotter client module
# (github.com/kubernetes-csi/external-snapshotter/client/v8) and keeps its
# config/crd folder: the VolumeSnapshot API's CRDs, which scripts/kube-test-env.sh
# --snapshots applies (no program is built: the test cluster has no CSI driver that
# takes snapshots, and serves only the API).
#
# The binaries are kept in $GUILDS_KUBE_CACHE (default /var/cache/guilds-kube)
# under their versions, so a later run on the same machine builds nothing; runs at
# once take turns (a lock in the cache).
set -euo pipefail
version=${GUILDS_KUBE_VERSION:-1.36.3}
router_version=${GUILDS_KUBE_ROUTER_VERSION:-2.1.0}
sandbox_version=${GUILDS_AGENT_SANDBOX_VERSION:-1.0.1}
snapshotter_version=${GUILDS_SNAPSHOTTER_VERSION:-8.7.0}
cache=${GUILDS_KUBE_CACHE:-/var/cache/guilds-kube}
out="$cache/v$version/bin"
router="$cache/kube-router-v$router_version/kube-router"
programs=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd)

have_all() {
  for p in "${programs[@]}"; do [ -x "$out/$p" ] || return 1; done
}
have_router() { [ -x "$router" ] && [ "$(readlink "$out/kube-router")" = "$router" ]; }
sandbox_dir="$cache/agent-sandbox-v$sandbox_version"
have_sandbox() { [ -x "$sandbox_dir/agent-sandbox-controller" ] && [ -f "$sandbox_dir/k8s/crds/extensions.agents.x-k8s.io_sandboxclaims.yaml" ]; }
link_sandbox() { mkdir -p "$out" && ln -sfn "$sandbox_dir" "$out/agent-sandbox"; }

# The VolumeSnapshot CRDs, in $crds_dir/crd: copied into a folder of this run's own, then
# renamed into place (a run that finds it there already drops its copy).
crds_dir="$cache/external-snapshotter-v$snapshotter_version"
fetch_snapshot_crds() {
  [ -f "$crds_dir/crd/snapshot.storage.k8s.io_volumesnapshotclasses.yaml" ] && return 0
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  local module="github.com/kubernetes-csi/external-snapshotter/client/v8" part src
  src=$(GOFLAGS= go mod download -json "$module@v$snapshotter_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$cache" && part=$(mktemp -d "$crds_dir.part.XXXXXX") && mkdir "$part/crd"
  cp "$src"/config/crd/snapshot.storage.k8s.io_*.yaml "$part/crd/" && chmod -R u+w,go+rX "$part"
  mv -T "$part" "$crds_dir" 2>/dev/null || rm -rf "$part"
}
if [ "${1:-}" = "--snapshot-crds" ]; then fetch_snapshot_crds; echo "$crds_dir/crd"; exit 0; fi
if have_all && have_router && have_sandbox; then link_sandbox; echo "$out"; exit 0; fi

# One build at a time in the cache: a second run waits for the first (which removes
# and remakes the build folder), then finds what it built.
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
if have_all && have_router && have_sandbox; then link_sandbox; echo "$out"; exit 0; fi

command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "kube-build: no go on PATH (Go 1.26 builds Kubernetes 1.36)" >&2; exit 1; }
export GOWORK=off CGO_ENABLED=0

# The agent-sandbox controller and its manifests, in $sandbox_dir (reached from $out
# as agent-sandbox/). Built in a folder of its own, then renamed: a build cut off
# leaves nothing that looks whole.
build_sandbox() {
  have_sandbox && return 0
  local module="sigs.k8s.io/agent-sandbox" part="$sandbox_dir.part" src
  rm -rf "$part" && mkdir -p "$part"
  GOFLAGS= GOBIN="$part" go install -trimpath -ldflags "-s -w" \
    "$module/cmd/agent-sandbox-controller@v$sandbox_version" >&2
  src=$(GOFLAGS= go mod download -json "$module@v$sandbox_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  cp -r "$src/k8s" "$part/k8s" && chmod -R u+w "$part/k8s"
  rm -rf "$sandbox_dir" && mv "$part" "$sandbox_dir"
}
if [ "${1:-}" = "--agent-sandbox" ]; then build_sandbox; echo "$sandbox_dir"; exit 0; fi

if have_all && have_router; then build_sandbox; link_sandbox; echo "$out"; exit 0; fi

build_router() {  # only its network-policy controller runs here, but the cmd is one binary
  mkdir -p "${router%/*}"
  [ -x "$router" ] || GOFLAGS= GOBIN="${router%/*}" go install -trimpath \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v$router_version" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v$router_version" >&2
  ln -sfn "$router" "$out/kube-router"
}
if have_all; then build_router; build_sandbox; link_sandbox; echo "$out"; exit 0; fi
export GOFLAGS=-mod=mod
work="$cache/v$version/module"
rm -rf "$work" && mkdir -p "$work/etcd" "$out"
here=$(cd "$(dirname "$0")" && pwd)
cp "$here/kube/etcd.go" "$work/etcd/main.go"

staging_minor="v0.${version#1.}"
{
  echo "module guilds.local/kubebuild"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  echo "replace ("
  go mod download -json "k8s.io/kubernetes@v$version" >/dev/null
  modfile=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$version.mod
  sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_minor"'#p' "$modfile"
  echo ")"
} >"$work/go.mod"

cd "$work"
cat >tools.go <<'GO'
//go:build tools

package kubebuild

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
go mod tidy >&2
flags=(-trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${version#1.}")
for p in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
  go build "${flags[@]}" -o "$out/$p" "k8s.io/kubernetes/cmd/$p" >&2
done
go build -trimpath -ldflags "-s -w" -o "$out/etcd" ./etcd >&2
build_router
build_sandbox
link_sandbox
have_all && have_router && have_sandbox
echo "$out"
