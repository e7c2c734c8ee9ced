#!/usr/bin/env bash
# A single-node Kubernetes of our own for the kubernetes backend's tests.
#
#   eval "$(bash scripts/kube-test-env.sh)"    # prints: export KUBECONFIG=... GUILDS_TEST_KUBE_IMAGE=...
#   bash scripts/kube-test-env.sh --stop        # stops the cluster's processes
#   bash scripts/kube-test-env.sh --packages    # the Debian packages it needs (.ci/run installs them early)
#
# Idempotent: a cluster whose API server answers is kept; each stage is skipped
# when its result is there. Everything lives under $GUILDS_KUBE_DIR (default
# /tmp/guilds-kube); the built binaries under $GUILDS_KUBE_CACHE (see
# scripts/kube-build.sh). Progress goes to stderr, with the seconds each stage
# took; stdout is only the export line.
#
# The parts: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a
# kubelet and kube-router's network-policy controller, built from Go modules;
# Debian's containerd, runc, CNI plugins, iptables and ipset
# (a containerd of its own, apart from the Docker engine's); a pause image
# built here from scripts/kube/pause.c; the sandbox image built by the Docker
# engine of scripts/docker-test-env.sh and imported into containerd. The node
# is 127.0.0.1; the API server listens on 127.0.0.1 only.
#
# Pods get a network namespace on a bridge with no gateway and no route out
# (the bridge plugin with isGateway false, no masquerade): nothing reaches
# past the node. The bridge holds the node's side of the pod network,
# NODE_POD_ADDRESS (made here, so no plugin turns on forwarding). NetworkPolicy
# objects are enforced by kube-router run with its network-policy controller
# only (iptables and ipset rules in the host's filter table); --stop removes
# its rules and sets with it.
#
# For the tests: the namespace guilds-test, a Role with what the backend needs
# (docs/sandboxes.md) bound to the user guilds-orchestrator, whose kubeconfig
# is the one exported; local PersistentVolumes of the default StorageClass,
# each a folder, and a few small ones each a sized tmpfs (the full-disk cases);
# a released volume is emptied and offered again (the recycler daemon).
#
# The claim mode ([kubernetes] mode = "claim"): kubernetes-sigs/agent-sandbox's
# CRDs and ClusterRoles as its module ships them (k8s/ beside the controller,
# scripts/kube-build.sh), bound to a user of its own, and its controller with
# --extensions as a host daemon on that user's kubeconfig; the orchestrator's
# user also gets docs/kubernetes-claims-role.yaml. `--agent-sandbox` adds these
# to a cluster already running.
#
# Checkpoints (docs/checkpoints.md): the orchestrator's user reads StorageClasses and
# VolumeSnapshotClasses (docs/kubernetes-checkpoints-role.yaml); `--snapshots` adds
# the VolumeSnapshot API (external-snapshotter's CRDs, no CSI driver) to a cluster
# running.
set -euo pipefail

DIR=${GUILDS_KUBE_DIR:-/tmp/guilds-kube}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NS=guilds-test
PAUSE=registry.k8s.io/pause:3.10
IMAGE=${GUILDS_TEST_KUBE_IMAGE:-guilds-sandbox:kube-test}
CTR_SOCK=$DIR/containerd/containerd.sock
PVS=${GUILDS_KUBE_PVS:-64}
SMALL_PVS=4
SMALL_PV_SIZE=32Mi  # a tmpfs of 32m each
POD_CIDR=10.244.0.0/24
NODE_POD_ADDRESS=10.244.0.1  # on the bridge; pods get addresses from .2
POD_BRIDGE=guildskube0
SERVICE_CIDR=10.96.0.0/24
PACKAGES=(containerd runc containernetworking-plugins openssl gcc libc6-dev iproute2 util-linux mount
          iptables ipset)

log() { echo "kube-test-env: $*" >&2; }
stage() {  # stage NAME COMMAND...: run a stage and say how long it took
  local stage_name=$1 stage_began=$SECONDS
  shift
  "$@"
  log "$stage_name: $((SECONDS - stage_began)) s"
}
admin() { kubectl --kubeconfig "$DIR/pki/admin.kubeconfig" "$@"; }
api_up() { admin get --raw /readyz >/dev/null 2>&1; }

# A daemon's pid file holds its pid and its start time (/proc/PID/stat's 22nd field): a pid
# the kernel has since handed to another process is not the daemon's.
started_at() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }
note_pid() { echo "$2 $(started_at "$2")" >"$DIR/run/$1.pid"; }
daemon_pid() {  # daemon_pid NAME: its pid while that process runs, else nothing
  local pid at
  read -r pid at 2>/dev/null <"$DIR/run/$1.pid" || [ -n "${pid:-}" ] || return 0
  [ -n "${pid:-}" ] || return 0
  if [ -z "${at:-}" ]; then kill -0 "$pid" 2>/dev/null && echo "$pid"; return 0; fi  # a file of an older script
  if [ "$(started_at "$pid")" = "$at" ]; then echo "$pid"; fi
}

stop_all() {
  for name in recycler agent-sandbox kube-router kubelet kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
    [ -f "$DIR/run/$name.pid" ] || continue
    pid=$(daemon_pid "$name")
    if [ -z "$pid" ]; then rm -f "$DIR/run/$name.pid"; continue; fi
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$DIR/run/$name.pid"
  done
  # The pods' shims and processes outlive containerd: stop them too.
  pkill -f "containerd-shim-runc-v2 -namespace k8s.io .*-address $CTR_SOCK" 2>/dev/null || true
  remove_policy_rules
  log "stopped"
}

# kube-router leaves its rules when it stops (a policy outlives a restart): take
# out its jumps from the built-in chains, its chains and its ipsets.
POLICY_CHAINS='(KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)'
remove_policy_rules() {
  command -v iptables >/dev/null || return 0
  local chain jumps rule set
  for chain in INPUT FORWARD OUTPUT; do
    jumps=$(iptables -S "$chain" 2>/dev/null | grep -E -- "-j $POLICY_CHAINS" || true)
    while read -r rule; do [ -n "$rule" ] && eval "iptables -D ${rule#-A }"; done <<<"$jumps"
  done
  for chain in $(iptables -S 2>/dev/null | sed -n 's/^-N //p' | grep -E "^$POLICY_CHAINS"); do
    iptables -F "$chain"
  done
  for chain in $(iptables -S 2>/dev/null | sed -n 's/^-N //p' | grep -E "^$POLICY_CHAINS"); do
    iptables -X "$chain"
  done
  command -v ipset >/dev/null || return 0
  for set in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?KUBE-(SRC|DST)-'); do
    ipset destroy "$set" 2>/dev/null || true
  done
}

install_packages() { bash "$ROOT/scripts/apt-missing.sh" kube-test-env "${PACKAGES[@]}"; }

# --- PKI ------------------------------------------------------------------------------
cert() {  # cert NAME SUBJECT [SAN]: a key and a certificate signed by the cluster's CA
  local name=$1 subject=$2 san=${3:-}
  [ -f "$DIR/pki/$name.crt" ] && return 0
  openssl genrsa -out "$DIR/pki/$name.key" 2048 2>/dev/null
  openssl req -new -key "$DIR/pki/$name.key" -subj "$subject" -out "$DIR/pki/$name.csr" 2>/dev/null
  local ext=$DIR/pki/$name.ext
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [ -n "$san" ] && echo "subjectAltName=$san" >>"$ext"
  openssl x509 -req -in "$DIR/pki/$name.csr" -CA "$DIR/pki/ca.crt" -CAkey "$DIR/pki/ca.key" \
    -CAcreateserial -days 365 -extfile "$ext" -out "$DIR/pki/$name.crt" 2>/dev/null
}

kubeconfig() {  # kubeconfig NAME: a kubeconfig for the certificate NAME
  local name=$1
  cat >"$DIR/pki/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: guilds-test
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $DIR/pki/$name.crt
    client-key: $DIR/pki/$name.key
contexts:
- name: $name
  context: {cluster: guilds-test, user: $name, namespace: $NS}
current-context: $name
EOF
}

make_pki() {
  local name
  mkdir -p "$DIR/pki"
  if [ ! -f "$DIR/pki/ca.crt" ]; then
    openssl genrsa -out "$DIR/pki/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$DIR/pki/ca.key" -subj "/CN=guilds-test-ca" -days 365 \
      -out "$DIR/pki/ca.crt" 2>/dev/null
  fi
  [ -f "$DIR/pki/sa.key" ] || openssl genrsa -out "$DIR/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$DIR/pki/sa.key" -pubout -out "$DIR/pki/sa.pub" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=guilds-test-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kubelet "/O=system:nodes/CN=system:node:127.0.0.1" "IP:127.0.0.1,DNS:localhost"
  cert orchestrator "/CN=guilds-orchestrator"
  cert agent-sandbox "/CN=agent-sandbox-controller"
  for name in admin controller-manager scheduler kubelet orchestrator agent-sandbox; do kubeconfig "$name"; done
}

# --- containerd, the pause image, the sandbox image -----------------------------------------
start_containerd() {
  mkdir -p "$DIR/containerd" "$DIR/cni" "$DIR/run"
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CTR_SOCK"
[ttrpc]
  address = "$CTR_SOCK.ttrpc"
[debug]
  address = "$CTR_SOCK.debug"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE"
  enable_unprivileged_ports = false
  # This machine gives root no CAP_SYS_RESOURCE: no score below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni"
EOF
  cat >"$DIR/cni/10-guilds.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "guilds-test",
 "plugins": [{"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": false, "ipMasq": false,
              "ipam": {"type": "host-local",
                       "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "${NODE_POD_ADDRESS%.*}.2"}]]}},
             {"type": "loopback"}]}
EOF
  ctr_up && return 0
  setsid containerd --config "$DIR/containerd/config.toml" </dev/null >"$DIR/containerd.log" 2>&1 &
  note_pid containerd $!
  for _ in $(seq 100); do ctr_up && return 0; sleep 0.2; done
  log "containerd did not answer:"; tail -5 "$DIR/containerd.log" >&2; exit 1
}
# The bridge the CNI plugin attaches pods to, with the node's address on it: a
# listener there is what a pod reaches of the node (and what the policy closes).
pod_bridge() {
  ip link show "$POD_BRIDGE" >/dev/null 2>&1 || ip link add "$POD_BRIDGE" type bridge
  ip -4 addr show dev "$POD_BRIDGE" | grep -q " $NODE_POD_ADDRESS/" \
    || ip addr add "$NODE_POD_ADDRESS/${POD_CIDR#*/}" dev "$POD_BRIDGE"
  ip link set "$POD_BRIDGE" up
}
ctr_up() { ctr -a "$CTR_SOCK" version >/dev/null 2>&1; }
ctr_k8s() { ctr -a "$CTR_SOCK" -n k8s.io "$@"; }
has_image() { ctr_k8s images ls -q | grep -qx "$1"; }

pause_image() {
  has_image "$PAUSE" && return 0
  local work=$DIR/pause
  rm -rf "$work"; mkdir -p "$work"
  gcc -static -O2 -o "$work/pause" "$ROOT/scripts/kube/pause.c"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$work/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$PAUSE" "$work" >/dev/null 2>"$work/build.log" \
    || { cat "$work/build.log" >&2; exit 1; }
  docker save "$PAUSE" -o "$work/pause.tar"
  ctr_k8s images import "$work/pause.tar" >/dev/null
}

sandbox_image() {
  # Tagged after the helpers' digest: a changed helper gives a new tag, never a stale pull.
  local want
  want=$(docker image inspect -f '{{.Id}}' guilds-sandbox:latest)
  if [ -f "$DIR/image.id" ] && [ "$(cat "$DIR/image.id")" = "$want" ] && has_image "docker.io/library/$IMAGE"; then
    return 0
  fi
  docker tag guilds-sandbox:latest "$IMAGE"
  docker save "$IMAGE" | ctr_k8s images import - >/dev/null
  echo "$want" >"$DIR/image.id"
}

# --- the control plane and the kubelet --------------------------------------------------
daemon() {  # daemon NAME COMMAND...: started in its own session, its pid and log kept
  local name=$1
  shift
  [ -n "$(daemon_pid "$name")" ] && return 0
  setsid "$@" </dev/null >"$DIR/$name.log" 2>&1 &
  note_pid "$name" $!
}

start_control_plane() {
  local bin=$1 pki=$DIR/pki
  daemon etcd "$bin/etcd" --data-dir "$DIR/etcd" --name guilds-test \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster guilds-test=http://127.0.0.1:2380 --quota-backend-bytes 1073741824
  daemon kube-apiserver "$bin/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port 6443 \
    --endpoint-reconciler-type none --kubelet-preferred-address-types Hostname \
    --client-ca-file "$pki/ca.crt" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" --kubelet-certificate-authority "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=false --profiling=false
  for _ in $(seq 300); do api_up && break; sleep 0.2; done
  api_up || { log "the API server did not answer:"; tail -20 "$DIR/kube-apiserver.log" >&2; exit 1; }
  daemon kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$pki/controller-manager.kubeconfig" --bind-address 127.0.0.1 \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false --profiling=false
  daemon kube-scheduler "$bin/kube-scheduler" --kubeconfig "$pki/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --profiling=false
}

start_kubelet() {
  local bin=$1 pki=$DIR/pki
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
readOnlyPort: 0
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CTR_SOCK
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 64
podPidsLimit: 256
protectKernelDefaults: false
makeIPTablesUtilChains: false
EOF
  daemon kubelet "$bin/kubelet" --config "$DIR/kubelet.yaml" --kubeconfig "$pki/kubelet.kubeconfig" \
    --hostname-override 127.0.0.1 --root-dir "$DIR/kubelet" \
    --cert-dir "$DIR/kubelet-pki"
  for _ in $(seq 300); do
    admin get node 127.0.0.1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null \
      | grep -qx True && return 0
    sleep 0.5
  done
  log "the node did not become Ready:"; tail -20 "$DIR/kubelet.log" >&2; exit 1
}

# --- NetworkPolicy: kube-router's policy controller, nothing else of it -----------------
# It finds the node's pods by the node's address (their hostIP) and writes a chain
# per pod; no health or metrics port. Ready once its top-level chain is there.
start_policy_controller() {
  local bin=$1
  daemon kube-router "$bin/kube-router" --kubeconfig "$DIR/pki/admin.kubeconfig" \
    --hostname-override 127.0.0.1 --run-firewall=true --run-router=false --run-service-proxy=false \
    --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0
  [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] \
    || log "warning: bridged traffic skips iptables here (net.bridge.bridge-nf-call-iptables is not 1): policies hold between a pod and the node only"
  for _ in $(seq 150); do iptables -S KUBE-ROUTER-FORWARD >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "the policy controller wrote no rules:"; tail -20 "$DIR/kube-router.log" >&2; exit 1
}

# --- what the tests use: namespace, Role, storage ---------------------------------------
apply_objects() {
  admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: guilds-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  sed -e "s/namespace: guilds$/namespace: $NS/" "$ROOT/docs/kubernetes-role.yaml" | admin apply -f - >/dev/null
  admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: guilds-orchestrator, namespace: $NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: guilds-orchestrator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: guilds-orchestrator}]
EOF
  checkpoints_reader
  for _ in $(seq 100); do admin -n "$NS" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done
}

# --- the claim mode: agent-sandbox's CRDs, ClusterRoles and controller ----------------
SANDBOX_HEALTH=127.0.0.1:18081
sandbox_bindings() {
  local role
  for role in agent-sandbox-controller agent-sandbox-controller-extensions; do
    printf -- '---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: %s}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %s}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: agent-sandbox-controller}]\n' "$role" "$role"
  done
  printf -- '---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: guilds-orchestrator-claims, namespace: %s}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: guilds-orchestrator-claims}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: guilds-orchestrator}]\n' "$NS"
}
sandbox_ready() {
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    "http://$SANDBOX_HEALTH/readyz" 2>/dev/null
}
start_agent_sandbox() {
  local bin=$1 k8s=$1/agent-sandbox/k8s
  # Server-side: the template CRD is larger than the annotation a client-side apply keeps.
  admin apply --server-side --force-conflicts -f "$k8s/crds" >/dev/null
  admin wait --for condition=Established --timeout 60s -f "$k8s/crds" >/dev/null
  admin apply -f "$k8s/rbac.generated.yaml" -f "$k8s/extensions-rbac.generated.yaml" >/dev/null
  sed -e "s/namespace: guilds$/namespace: $NS/" "$ROOT/docs/kubernetes-claims-role.yaml" | admin apply -f - >/dev/null
  sandbox_bindings | admin apply -f - >/dev/null
  daemon agent-sandbox env KUBECONFIG="$DIR/pki/agent-sandbox.kubeconfig" \
    "$bin/agent-sandbox/agent-sandbox-controller" --extensions --leader-elect=false \
    --metrics-bind-address 0 --health-probe-bind-address "$SANDBOX_HEALTH"
  for _ in $(seq 150); do sandbox_ready && return 0; sleep 0.2; done
  log "the agent-sandbox controller did not answer:"; tail -20 "$DIR/agent-sandbox.log" >&2; exit 1
}

# --- VolumeSnapshots: the API only ------------------------------------------------------
# The orchestrator's user reads StorageClasses and VolumeSnapshotClasses (cluster-wide:
# docs/kubernetes-checkpoints-role.yaml) to say what the cluster lacks for a checkpoint of
# a home. `--snapshots` also serves the VolumeSnapshot API (external-snapshotter's CRDs,
# scripts/kube-build.sh --snapshot-crds); no CSI driver here takes snapshots.
checkpoints_reader() {
  admin apply -f "$ROOT/docs/kubernetes-checkpoints-role.yaml" >/dev/null
  printf -- 'apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: guilds-checkpoints-reader}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: guilds-checkpoints-reader}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: guilds-orchestrator}]\n' \
    | admin apply -f - >/dev/null
}
snapshot_api() {
  local crds=$1
  admin apply --server-side --force-conflicts -f "$crds" >/dev/null
  admin wait --for condition=Established --timeout 60s -f "$crds" >/dev/null
  checkpoints_reader
}

pv() {  # pv NAME SIZE PATH
  cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: $1, labels: {guilds-test: "pv"}}
spec:
  capacity: {storage: $2}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: guilds-local
  local: {path: $3}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: ["127.0.0.1"]}]
EOF
}

make_volumes() {
  # Free volumes: PVS folders of 10Gi (the default claim size) and SMALL_PVS sized tmpfs.
  local have i out=""
  have=$(admin get pv -l guilds-test=pv -o name 2>/dev/null | wc -l)
  [ "$have" -ge $((PVS + SMALL_PVS)) ] && return 0
  mkdir -p "$DIR/pv"
  for i in $(seq "$PVS"); do
    mkdir -p "$DIR/pv/pv$i"
    out+=$(pv "guilds-test-pv$i" 10Gi "$DIR/pv/pv$i")$'\n'
  done
  for i in $(seq "$SMALL_PVS"); do
    mkdir -p "$DIR/pv/small$i"
    mountpoint -q "$DIR/pv/small$i" || mount -t tmpfs -o "size=${SMALL_PV_SIZE%i},mode=0755" tmpfs "$DIR/pv/small$i"
    out+=$(pv "guilds-test-small$i" "$SMALL_PV_SIZE" "$DIR/pv/small$i")$'\n'
  done
  admin apply -f - >/dev/null <<<"$out"
}

# A released volume (its claim deleted) is emptied and offered again, as a
# provisioner would: the tests delete every claim they make.
recycle_once() {
  local name path
  admin get pv -l guilds-test=pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name} {.spec.local.path}{"\n"}{end}' 2>/dev/null \
    | while read -r name path; do
        [ -n "$name" ] && [ -d "$path" ] || continue
        find "$path" -mindepth 1 -delete 2>/dev/null || true
        admin patch pv "$name" --type json -p '[{"op": "remove", "path": "/spec/claimRef"}]' >/dev/null 2>&1 || true
      done
}
recycle_loop() { while api_up || sleep 5; do recycle_once; sleep 1; done; }

# A cluster whose processes are gone (a new boot, a stopped session) starts
# empty: its objects, the kubelet's mounts and containerd's task state go; the
# PKI, the images and the built binaries stay.
reset_state() {
  api_up && return 0
  stop_all 2>/dev/null
  { grep -o " $DIR/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do  # none left: no error
    case "$m" in "$DIR/pv/small"*) ;; *) umount -l "$m" 2>/dev/null || true ;; esac
  done
  rm -rf "$DIR/etcd" "$DIR/kubelet" "$DIR/kubelet-pki" "$DIR/containerd/state"
  for p in "$DIR"/pv/*/; do [ -d "$p" ] && find "$p" -mindepth 1 -delete 2>/dev/null; done
  true
}

if [ "${1:-}" = "--stop" ]; then stop_all; exit 0; fi
if [ "${1:-}" = "--packages" ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi
if [ "${1:-}" = "--recycle" ]; then recycle_loop; exit 0; fi
if [ "${1:-}" = "--snapshots" ]; then
  BIN=$(bash "$ROOT/scripts/kube-build.sh"); export PATH="$BIN:$PATH"
  stage snapshots snapshot_api "$(bash "$ROOT/scripts/kube-build.sh" --snapshot-crds)"; exit 0
fi
if [ "${1:-}" = "--agent-sandbox" ]; then
  BIN=$(bash "$ROOT/scripts/kube-build.sh"); export PATH="$BIN:$PATH"
  make_pki; stage agent-sandbox start_agent_sandbox "$BIN"; exit 0
fi
began=$SECONDS
mkdir -p "$DIR/run"
stage packages install_packages
BIN=$(bash "$ROOT/scripts/kube-build.sh")
export PATH="$BIN:$PATH"  # its own kubectl, of the cluster's version
log "binaries: $BIN ($((SECONDS - began)) s so far)"
if [ -f "$DIR/pki/admin.kubeconfig" ]; then stage reset reset_state; fi
[ -n "${DOCKER_HOST:-}" ] || eval "$(bash "$ROOT/scripts/docker-test-env.sh")"
stage pki make_pki
stage pod-bridge pod_bridge
stage containerd start_containerd
stage pause-image pause_image
stage sandbox-image sandbox_image
stage control-plane start_control_plane "$BIN"
stage kubelet start_kubelet "$BIN"
stage policy start_policy_controller "$BIN"
stage objects apply_objects
stage agent-sandbox start_agent_sandbox "$BIN"
stage volumes make_volumes
recycle_once
daemon recycler bash "$ROOT/scripts/kube-test-env.sh" --recycle
log "ready in $((SECONDS - began)) s"
echo "export KUBECONFIG=$DIR/pki/orchestrator.kubeconfig GUILDS_TEST_KUBE_IMAGE=$IMAGE GUILDS_TEST_KUBE_NAMESPACE=$NS PATH=$BIN:\$PATH"
