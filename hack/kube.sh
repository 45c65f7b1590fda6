#!/usr/bin/env bash
# A real single-node Kubernetes v1.37.0 on this machine, for make e2e-kube:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubelet
# (built by make tools into bin/kubernetes), with Debian's containerd, runc and
# CNI plugins. Everything listens on 127.0.0.1; pods get addresses on a bridge
# (10.244.0.0/24) with no masquerade and no default route, so nothing they
# send leaves the machine.
#
#   hack/kube.sh up IMAGE.tar...   start it, import the images, wait for the node
#   hack/kube.sh down              stop every process by its PID and undo every
#                                  change to the host
#   hack/kube.sh env               print KUBECONFIG=... for a shell
#
# State lives in $KUBE_DIR (default /tmp/etcd-manager-kube); logs in its logs/.
# Facts that make this work on these machines (from the project's recipe):
# - containerd restrict_oom_score_adj: root lacks CAP_SYS_RESOURCE here;
# - kubelet failCgroupV1: false (cgroup v1 hosts) and makeIPTablesUtilChains:
#   false (its chains would drop traffic to 127/8 from other sources);
# - the API server reaches the kubelet by host name, which resolves to 127.0.0.1;
# - a CNI config is needed for the node to be Ready.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
W=${KUBE_DIR:-/tmp/etcd-manager-kube}
BIN=${KUBE_BIN:-$root/bin/kubernetes}
ETCD=${KUBE_ETCD:-$root/bin/etcd-v3.6.16/etcd}
P=$W/pki
L=$W/logs
SOCK=$W/containerd/containerd.sock
PAUSE_IMAGE=${KUBE_PAUSE_IMAGE:-localhost/pause:e2e}
BRIDGE=emk0
SUBNET=10.244.0.0/24
PVS=${KUBE_PVS:-40}
NODE=$(hostname)

log() { echo "[kube $(date +%T)] $*"; }
kc() { "$BIN/kubectl" --kubeconfig="$P/admin.kubeconfig" "$@"; }
ctr_() { ctr -a "$SOCK" -n k8s.io "$@"; }

waitfor() { # seconds what cmd...
  local t=$1 what=$2 i
  shift 2
  for ((i = 0; i < t * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "timed out after ${t}s waiting for $what; logs in $L"
  return 1
}

start() { # name cmd...: in its own session, its PID recorded
  local name=$1
  shift
  setsid "$@" >"$L/$name.log" 2>&1 </dev/null &
  echo $! >"$W/$name.pid"
}

stop() { # name: TERM, then KILL after 10 s
  local f=$W/$1.pid p i
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  kill "$p" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$f"
}

need() {
  local missing=() b c
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    [ -x "$BIN/$b" ] || missing+=("$BIN/$b (make tools)")
  done
  [ -x "$ETCD" ] || missing+=("$ETCD (make tools)")
  for c in containerd ctr runc openssl curl; do command -v "$c" >/dev/null || missing+=("$c (apt-get install containerd runc openssl curl)"); done
  for c in bridge host-local loopback; do [ -x "/usr/lib/cni/$c" ] || missing+=("/usr/lib/cni/$c (apt-get install containernetworking-plugins)"); done
  if ((${#missing[@]})); then
    printf 'kube: missing %s\n' "${missing[@]}" >&2
    exit 1
  fi
}

pki() {
  mkdir -p "$P"
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 7 -subj "/CN=etcd-manager-e2e-ca" 2>/dev/null
    sign() { # name subject [subjectAltName]
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      if [ -n "${3:-}" ]; then
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$1.ext"
      else
        printf 'extendedKeyUsage=clientAuth\n' >"$1.ext"
      fi
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 7 -extfile "$1.ext" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:$NODE,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    sign admin "/O=system:masters/CN=e2e-admin"
    sign kubelet "/O=system:nodes/CN=system:node:$NODE" "IP:127.0.0.1,DNS:$NODE,DNS:localhost"
    sign kcm "/CN=system:kube-controller-manager"
    sign scheduler "/CN=system:kube-scheduler"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    local u
    for u in admin kubelet kcm scheduler; do
      printf '%s\n' "apiVersion: v1" "kind: Config" \
        "clusters: [{name: e2e, cluster: {server: \"https://127.0.0.1:6443\", certificate-authority: $P/ca.crt}}]" \
        "users: [{name: $u, user: {client-certificate: $P/$u.crt, client-key: $P/$u.key}}]" \
        "contexts: [{name: e2e, context: {cluster: e2e, user: $u}}]" \
        "current-context: e2e" >"$u.kubeconfig"
    done
  )
}

configs() {
  mkdir -p "$W/containerd" "$W/cni/net.d" "$W/cni/ipam" "$W/pod-logs" "$W/kubelet"
  cat >"$W/containerd/config.toml" <<CONF
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
CONF
  cat >"$W/cni/net.d/10-e2e.conflist" <<CONF
{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": false, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$W/cni/ipam", "ranges": [[{"subnet": "$SUBNET"}]]}}]}
CONF
  cat >"$W/kubelet.yaml" <<CONF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $P/kubelet.crt
tlsPrivateKeyFile: $P/kubelet.key
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
podLogsDir: $W/pod-logs
volumePluginDir: $W/kubelet/volume-plugins
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
CONF
}

storage() { # a StorageClass of pre-made local PersistentVolumes
  local i out=$W/pvs.yaml
  printf '%s\n' "apiVersion: storage.k8s.io/v1" "kind: StorageClass" "metadata: {name: local}" \
    "provisioner: kubernetes.io/no-provisioner" "volumeBindingMode: WaitForFirstConsumer" >"$out"
  for ((i = 0; i < PVS; i++)); do
    mkdir -p "$W/pv/pv-$i"
    printf '%s\n' "---" "apiVersion: v1" "kind: PersistentVolume" "metadata: {name: e2e-pv-$i}" "spec:" \
      "  capacity: {storage: 1Gi}" "  accessModes: [ReadWriteOnce]" "  persistentVolumeReclaimPolicy: Retain" \
      "  storageClassName: local" "  local: {path: $W/pv/pv-$i}" \
      "  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]}]}}" >>"$out"
  done
  kc apply -f "$out" >/dev/null
}

up() {
  need
  if [ -f "$W/kubelet.pid" ] && kill -0 "$(cat "$W/kubelet.pid")" 2>/dev/null; then
    echo "kube: already up in $W; run hack/kube.sh down first" >&2
    exit 1
  fi
  local t0=$SECONDS img
  rm -rf "$W"
  mkdir -p "$W" "$L"
  sysctl vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward >"$W/sysctl.orig"
  # Fixed paths outside $W that containerd 1.6 and the kubelet write: down
  # removes only those that did not exist before.
  local p
  : >"$W/host-created"
  for p in /run/containerd /run/netns /var/lib/kubelet /var/log/containers /var/log/pods $(ls -d /sys/fs/cgroup/*/ 2>/dev/null | sed 's|/$|/kubepods|'); do
    [ -e "$p" ] || echo "$p" >>"$W/host-created"
  done
  pki
  configs
  start containerd containerd --config "$W/containerd/config.toml"
  waitfor 30 containerd ctr -a "$SOCK" version
  for img in "$@"; do
    ctr_ images import "$img" >/dev/null
  done
  start etcd "$ETCD" --name e2e --data-dir "$W/etcd" \
    --listen-client-urls http://127.0.0.1:32379 --advertise-client-urls http://127.0.0.1:32379 \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster e2e=http://127.0.0.1:32380 --listen-metrics-urls http://127.0.0.1:32381 --unsafe-no-fsync
  waitfor 30 etcd curl -sf http://127.0.0.1:32379/health
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:32379 \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 \
    --endpoint-reconciler-type=none --cert-dir="$W/apiserver-certs" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$P/admin.crt" --kubelet-client-key="$P/admin.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=Hostname \
    --profiling=false --v=1
  waitfor 120 kube-apiserver curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" https://127.0.0.1:6443/readyz
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$P/kcm.kubeconfig" --authentication-kubeconfig="$P/kcm.kubeconfig" --authorization-kubeconfig="$P/kcm.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --cert-dir="$W/kcm-certs" \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --leader-elect=false --profiling=false --v=1
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$P/scheduler.kubeconfig" --authentication-kubeconfig="$P/scheduler.kubeconfig" --authorization-kubeconfig="$P/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false --v=1
  start kubelet "$BIN/kubelet" --config="$W/kubelet.yaml" --kubeconfig="$P/kubelet.kubeconfig" \
    --root-dir="$W/kubelet" --cert-dir="$W/kubelet/pki" --hostname-override="$NODE" --v=1
  waitfor 60 "the node to register" kc get node "$NODE"
  kc wait --for=condition=Ready "node/$NODE" --timeout=120s >/dev/null
  waitfor 60 "the default ServiceAccount" kc get serviceaccount default
  storage
  log "up in $((SECONDS - t0))s: KUBECONFIG=$P/admin.kubeconfig"
}

down() {
  local p
  if [ -f "$W/kubelet.pid" ] && kill -0 "$(cat "$W/kubelet.pid")" 2>/dev/null; then
    kc delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
  fi
  stop kubelet
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  if [ -f "$W/containerd.pid" ]; then
    local t c
    for t in $(ctr_ task ls -q 2>/dev/null); do ctr_ task kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr_ task ls -q 2>/dev/null); do ctr_ task delete -f "$t" >/dev/null 2>&1 || true; done
    for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  stop etcd
  created() { [ -f "$W/host-created" ] && grep -qxF "$1" "$W/host-created"; }
  # Mounts the kubelet and containerd made, deepest first: under $W, and
  # under the fixed paths only when this script created them.
  local roots=("$W") h
  created /run/containerd && roots+=(/run/containerd)
  created /run/netns && roots+=(/run/netns)
  awk '{print $2}' /proc/mounts | sort -r | while read -r m; do
    for r in "${roots[@]}"; do
      if [ "${m#"$r"}" != "$m" ]; then umount -l "$m" 2>/dev/null || true; fi
    done
  done
  for h in /sys/fs/cgroup/*/kubepods; do
    if [ -d "$h" ] && created "$h"; then find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  local tbl ch
  for tbl in mangle filter nat; do
    for ch in KUBE-FIREWALL KUBE-IPTABLES-HINT KUBE-KUBELET-CANARY; do
      if iptables -t "$tbl" -F "$ch" 2>/dev/null; then iptables -t "$tbl" -X "$ch" 2>/dev/null || true; fi
    done
  done
  if [ -f "$W/sysctl.orig" ]; then sysctl -q -p "$W/sysctl.orig" || true; fi
  # Fixed paths outside $W, each only if this script's run created it.
  if created /run/containerd; then rm -rf /run/containerd; fi
  if created /var/lib/kubelet; then rm -rf /var/lib/kubelet; fi
  for p in /var/log/containers /var/log/pods /run/netns; do
    if created "$p"; then rm -rf "$p"; fi
  done
  if [ -z "${KUBE_KEEP:-}" ]; then rm -rf "$W"; fi
  log "down"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  env) echo "KUBECONFIG=$P/admin.kubeconfig" ;;
  *) echo "usage: hack/kube.sh up IMAGE.tar... | down | env" >&2; exit 2 ;;
esac
