# The vm provider: the local provider's control plane on this machine, and each node a guest running a stock
# distribution kernel with sch_netem, so that latency, loss and the rest can be measured between real pods
# here. Sourced by ../cluster after net.sh, pki.sh, control-plane.sh and local.sh (the control-plane-only mode
# and the install step are the local provider's).
#
#   host netns   isthbr0 198.18.0.1/24, kube-apiserver :6443 (as the local provider); tap isth-t<i> per node
#   node i       a guest: Debian bookworm's stock kernel under QEMU's emulation (ISTHMUS_VM_KERNEL=bookworm,
#                default) or sid's User-Mode Linux (sid: 4-5x faster, but Debian builds it without IPv4 nftables
#                or legacy iptables, so kube-proxy cannot program Services there); eth0 198.18.0.(1+i)/24 on the
#                tap; containerd, kubelet, kube-proxy, CNI bridge; its root is this machine's / read-only with a
#                tmpfs over it (overlay)
#
# The guest sees this machine's files read-only, so it runs exactly the binaries the local provider runs; what
# it writes stays in its own memory. One directory per node is shared writable (`io/`): logs, image archives
# to import, and commands to run in the guest (vm_exec), answered by the guest's init (vm-guest.sh).
VM_KERNEL=${ISTHMUS_VM_KERNEL:-bookworm}
VM_MEM_MIB=${ISTHMUS_VM_MEM_MIB:-2560}
VM_GUEST=$CLUSTER_HOME/lib/vm-guest.sh
REPO_ROOT=$(cd "$CLUSTER_HOME/../.." && pwd)
# The rig prepares the nodes' kernels, writes their first stage and boots them (its Rust, tested with the rig).
RIG=$REPO_ROOT/e2e/kernel/rig

# The guests' clocks follow this machine's through NTP (chrony): a guest's kernel starts from the emulated RTC,
# which holds whole seconds, and two bookworm nodes booted together read 1.35 s and 0.82 s behind this machine
# (2026-11-29, `chronyd -Q` in each), so a schedule's phases changed half a second apart on the two. Real nodes
# run NTP; so do these, against a server on the bridge that never sets this machine's clock (-x).
VM_NTP_PORT=10123

vm_tap() { echo "isth-t$1"; }
# Locally administered and distinct per node (QEMU would give every guest the same default address).
vm_mac() { printf '52:54:00:18:00:%02x' "$1"; }
vm_io() { echo "$(node_dir "$1")/io"; }

# The nodes are guests with their own kernel and cgroups, so this machine's cgroup layout does not matter here;
# what `up` would otherwise find out only after installing and building for minutes is checked first.
vm_preflight() {
  [ "$(id -u)" = 0 ] || die "preflight: the vm provider needs root (taps, a bridge and routes of this machine)"
  case $VM_KERNEL in
    sid|bookworm) ;;
    *) die "preflight: ISTHMUS_VM_KERNEL must be sid or bookworm (got '$VM_KERNEL')" ;;
  esac
  log "preflight: vm: a full cluster can run here (root; $VM_KERNEL guests bring their own kernel and cgroups)"
}

vm_install() {
  local_install
  case $VM_KERNEL in
    sid) ;;
    bookworm) command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing (the rig installs it)" ;;
    *) die "ISTHMUS_VM_KERNEL must be sid or bookworm (got '$VM_KERNEL')" ;;
  esac
  # The rig resolves, downloads and prepares the kernel (cached): vmlinux or linux.uml and its modules.
  VM_ENTRY=$("$RIG" entry "$VM_KERNEL" | tail -n 1)
  VM_RELEASE=$(cat "$VM_ENTRY/release")
}

# The guest's first stage (e2e/kernel/src/bin/isthmus-rig/node.rs): busybox, the modules that reach this
# machine's files, and an /init that mounts them read-only under a tmpfs and hands over to vm-guest.sh.
vm_initramfs() { "$RIG" node-initramfs "$VM_KERNEL" "$VM_ENTRY" "$1"; }

# The node's configuration, written before it boots (the guest reads it through its read-only view).
vm_node_config() { # I
  local i=$1 d name ip
  d=$(node_dir "$i"); name=$(node_name "$i"); ip=$(node_ip "$i")
  cert "$name-client" "system:node:$name" system:nodes
  cert "$name-serving" "$name" system:nodes "IP:$ip,DNS:$name"
  kubeconfig_for "$d/kubelet.kubeconfig" "$name-client" "https://$BRIDGE_IP:$API_PORT"
  cat >"$d/node.env" <<EOF
NODE_NAME=$name
NODE_IP=$ip
NODE_PREFIX=24
NODE_DIR=$d
IO=$(vm_io "$i")
CLUSTER_DIR=$CLUSTER_DIR
K8S_BIN=$K8S_BIN
MODULES=$VM_ENTRY/lib/modules/$VM_RELEASE
RELEASE=$VM_RELEASE
NTP_SERVER=$BRIDGE_IP
NTP_PORT=$VM_NTP_PORT
EOF
  cat >"$d/cni-template.json" <<EOF
{"cniVersion": "1.0.0", "name": "isthmus", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "{{.PodCIDR}}"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  # Inside the guest the standard paths are its own: nothing of this machine's is written.
  cat >"$d/containerd.toml" <<EOF
version = 2
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "/etc/cni/net.d"
    conf_template = "$d/cni-template.json"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOF
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/$name-serving.crt"
tlsPrivateKeyFile: "$PKI/$name-serving.key"
resolvConf: "$CLUSTER_DIR/resolv.conf"
clusterDomain: cluster.local
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
# Images cannot be pulled here: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  cat >"$d/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$CLUSTER_DIR/kube-proxy.kubeconfig"}
hostnameOverride: $name
bindAddress: $ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
mode: iptables
clusterCIDR: $CLUSTER_CIDR
nodePortAddresses: ["$NODE_NET.0/24"]
EOF
}

# The nodes' time source: chronyd serving this machine's clock on the bridge only, without touching it.
vm_time_server() {
  cat >"$CLUSTER_DIR/chrony-server.conf" <<EOF
local stratum 8
allow $NODE_NET.0/24
bindaddress $BRIDGE_IP
port $VM_NTP_PORT
cmdport 0
pidfile $CLUSTER_DIR/chronyd.pid
EOF
  start_bg chronyd chronyd -x -d -u root -f "$CLUSTER_DIR/chrony-server.conf"
}

vm_boot() { # I: starts the guest, detached; its console goes to logs/<node>-vm.log
  local i=$1 name tap io d
  name=$(node_name "$i"); tap=$(vm_tap "$i"); io=$(vm_io "$i"); d=$(node_dir "$i")
  ip tuntap add "$tap" mode tap
  ip link set "$tap" master "$BRIDGE" up
  # The rig's boot becomes the guest (exec): the pid start_bg records is the guest's.
  start_bg "$name-vm" "$RIG" node-boot "$VM_KERNEL" "$VM_ENTRY" --initramfs "$CLUSTER_DIR/initramfs.cpio" \
    --mem "$VM_MEM_MIB" --tap "$tap" --mac "$(vm_mac "$i")" --io "$io" --uml-dir "$d/uml" --umid "$CLUSTER_NAME-$i" \
    --guest "$VM_GUEST" --node-env "$d/node.env"
}

# vm_exec I CMD [ARG...]: runs the command inside node I's guest and prints its output and exit status; the
# guest's init picks it up from the io directory within 0.1 s.
vm_exec() {
  local i=$1 io id rc; shift
  io=$(vm_io "$i"); id=$(date +%s%N).$$.$RANDOM
  printf '%q ' "$@" >"$io/cmd/$id.tmp"
  mv "$io/cmd/$id.tmp" "$io/cmd/$id.sh"
  for _ in $(seq 1 600); do
    [ -f "$io/cmd/$id.rc" ] && break
    alive "$(node_name "$i")-vm" || die "node $i's guest is not running"
    sleep 0.1
  done
  [ -f "$io/cmd/$id.rc" ] || die "node $i did not answer a command in 60 s: $*"
  cat "$io/cmd/$id.out"
  rc=$(cat "$io/cmd/$id.rc")
  rm -f "$io/cmd/$id".*
  return "$rc"
}

vm_node_exec() { vm_exec "$@"; }

vm_up() { # NODES CONTROL_PLANE_ONLY
  local nodes=$1 cp_only=$2 t i
  [ -z "$cp_only" ] || { local_up "$nodes" "$cp_only"; return; }
  t=$(date +%s.%N)
  [ ! -e "$CLUSTER_DIR/mode" ] || die "cluster '$CLUSTER_NAME' is already up ($CLUSTER_DIR); run 'cluster down' first"
  vm_preflight
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || die "another full cluster is up (bridge $BRIDGE exists); only one can run at a time"
  vm_install
  rm -rf "$CLUSTER_DIR"
  mkdir -p "$CLUSTER_DIR"/{logs,pids}
  echo "full $nodes" >"$CLUSTER_DIR/mode"
  echo vm >"$CLUSTER_DIR/provider"
  trap "up_failed vm_down" EXIT
  network_up
  pki_up "$BRIDGE_IP"
  echo "nameserver 127.0.0.1" >"$CLUSTER_DIR/resolv.conf"
  mkdir -p "$CLUSTER_DIR/images"
  build_pause_image "$CLUSTER_DIR/images/pause.tar"
  vm_initramfs "$CLUSTER_DIR/initramfs.cpio"
  for ((i = 1; i <= nodes; i++)); do
    mkdir -p "$(vm_io "$i")"/{cmd,logs,images}
    cp "$CLUSTER_DIR/images/pause.tar" "$(vm_io "$i")/images/"
    vm_node_config "$i"
  done
  control_plane_up "$BRIDGE_IP"
  vm_time_server
  for ((i = 1; i <= nodes; i++)); do vm_boot "$i"; done
  log "booted $nodes $VM_KERNEL guest(s) ($VM_RELEASE); waiting for their kubelets"
  wait_nodes_ready vm_node_exec vm 180 180
  trap - EXIT
  log "cluster up in $(elapsed "$t") s: $nodes $VM_KERNEL node(s) Ready; KUBECONFIG=$CLUSTER_DIR/kubeconfig"
}

vm_down() {
  set +e
  local t i
  t=$(date +%s.%N)
  if [ ! -f "$CLUSTER_DIR/mode" ]; then log "cluster '$CLUSTER_NAME' is not up"; return 0; fi
  if [ "$(cat "$CLUSTER_DIR/mode")" = control-plane ]; then local_down; return; fi
  # A guest takes everything that ran in it along: killing it is the whole node's teardown.
  local vms=()
  for i in $(node_indices); do vms+=("$(node_name "$i")-vm"); done
  stop_pids KILL "${vms[@]}"
  stop_pids KILL kube-scheduler kube-controller-manager kube-apiserver etcd chronyd
  for i in $(node_indices); do ip link del "$(vm_tap "$i")" 2>/dev/null; done
  ip route show | awk '/^198\.19\./ {print $1}' | while read -r r; do ip route del "$r"; done
  ip route del unreachable "$RESERVED_RANGE" 2>/dev/null
  ip link del "$BRIDGE" 2>/dev/null
  conntrack -D -s 198.18.0.0 --mask-src 255.254.0.0 >/dev/null 2>&1
  conntrack -D -d 198.18.0.0 --mask-dst 255.254.0.0 >/dev/null 2>&1
  wait_reaped
  # The guests' consoles and logs stay for a post-mortem; the rest (etcd, keys, images) goes.
  for i in $(node_indices); do
    cp -r "$(vm_io "$i")/logs" "$CLUSTER_DIR/logs/$(node_name "$i")" 2>/dev/null
  done
  find "$CLUSTER_DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} + 2>/dev/null
  log "down in $(elapsed "$t") s"
  set -e
}

# An archive is named by its content: one a node imported before (the demo's, then the suite's) is not imported
# again, which on an emulated node costs tens of seconds.
vm_load_image() { # ARCHIVE
  local archive=$1 i n=0 had=0 name
  [ -f "$archive" ] || die "no such image archive: $archive"
  [ -f "$CLUSTER_DIR/mode" ] || die "cluster '$CLUSTER_NAME' is not up"
  name=$(sha256sum "$archive" | cut -c1-16).tar
  for i in $(node_indices); do
    if [ -f "$(vm_io "$i")/images/$name.imported" ]; then had=$((had + 1)); continue; fi
    cp "$archive" "$(vm_io "$i")/images/$name"
    vm_exec "$i" ctr -n k8s.io images import "$(vm_io "$i")/images/$name" >/dev/null ||
      die "node $i could not import $archive"
    touch "$(vm_io "$i")/images/$name.imported"
    n=$((n + 1))
  done
  log "loaded $archive into $n node(s)$([ "$had" = 0 ] || echo "; $had had it already")"
}

vm_status() {
  [ -f "$CLUSTER_DIR/mode" ] || { echo "cluster '$CLUSTER_NAME' (vm): down"; return 1; }
  echo "cluster '$CLUSTER_NAME' (vm, $(cat "$CLUSTER_DIR/mode")): $CLUSTER_DIR"
  local f bad=0
  for f in "$CLUSTER_DIR"/pids/*; do
    [ -e "$f" ] || continue
    if alive "${f##*/}"; then echo "  running  ${f##*/} (pid $(cat "$f"))"; else echo "  DEAD     ${f##*/}"; bad=1; fi
  done
  kc get nodes -o wide 2>/dev/null || { echo "  API server not answering"; bad=1; }
  return $bad
}
