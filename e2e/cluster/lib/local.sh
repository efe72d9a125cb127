# The local provider: a real cluster from processes on this machine, each node a network namespace on the
# bridge of net.sh, sharing this machine's kernel. Sourced by ../cluster after net.sh, pki.sh and
# control-plane.sh.
#
#   node i       netns file $CLUSTER_DIR/node<i>/netns, veth isth-n<i> <-> eth0 198.18.0.(1+i)/24, no default route
#                containerd, kubelet (:10250), kube-proxy (iptables), CNI bridge cni0 = first address of the pod /24

in_node() { local i=$1; shift; nsenter --net="$(node_netns "$i")" "$@"; }
local_node_exec() { in_node "$@"; }
node_netns() { echo "$(node_dir "$1")/netns"; }
host_veth() { echo "isth-n$1"; }
cgroup_root() { echo "$CLUSTER_NAME-node$1"; }
# Paths kubelet, containerd and libcni use whatever their configuration says; `down` removes what we left there.
HARDCODED_DIRS=(/var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers /var/log/pods
                /var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd/fifo /run/containerd)

local_install() {
  "$CLUSTER_HOME/lib/install-debs.sh"
  "$CLUSTER_HOME/lib/install-k8s.sh" >/dev/null
}

node_network_up() { # I
  local i=$1 ns veth
  ns=$(node_netns "$i"); veth=$(host_veth "$i")
  touch "$ns"
  unshare --net="$ns" true       # a namespace pinned by a bind mount on our file, no /run/netns entry
  # Made inside the node namespace; the peer moves to ours (our pid names our namespace).
  in_node "$i" ip link add eth0 type veth peer name "$veth" netns $$
  ip link set "$veth" master "$BRIDGE" up
  in_node "$i" ip link set lo up
  in_node "$i" ip addr add "$(node_ip "$i")/24" dev eth0
  in_node "$i" ip link set eth0 up
  # No default route in the node: pods reach the node network and the pod ranges, nothing else.
  in_node "$i" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

cgroup_hierarchies() { awk '$3 == "cgroup" {print $2}' /proc/mounts; }
cgroup_hierarchies_all() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts; }

node_cgroups_up() { # I: kubelet's cgroupRoot in every v1 hierarchy (cpuset needs its cpus and mems filled in)
  local root h; root=$(cgroup_root "$1")
  for h in $(cgroup_hierarchies); do mkdir -p "$h/$root"; done
  if [ -d /sys/fs/cgroup/cpuset/"$root" ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/"$root"/cpuset.cpus
    cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/"$root"/cpuset.mems
  fi
}

# ------------------------------------------------------------------------------------------------ preflight
# What a full local cluster needs of this machine, checked before `up` installs, builds or creates anything: a
# cold `up` builds Kubernetes for a quarter of an hour before the first kubelet starts, and make test runs half
# an hour of other stages before its first full cluster, so a machine that cannot run one must be told at once.
#
# The nodes share this machine's cgroup tree: every node's kubelet uses the cgroupfs driver under its own
# cgroupRoot, which node_cgroups_up makes in each cgroup v1 hierarchy. kubelet refuses to start unless cpu,
# cpuacct, cpuset and memory are mounted as v1 hierarchies ("Following Cgroup subsystem not mounted"), and where
# /sys/fs/cgroup is cgroup2 it takes its v2 path, where nothing has made the cgroupRoot or delegated controllers
# to it ("could not read controllers for cgroup"). etcd, kube-apiserver and kube-controller-manager touch no
# cgroup: a control-plane-only cluster needs none of this. ISTHMUS_PROC_MOUNTS replaces /proc/mounts (tests).
LOCAL_CGROUP_V1_CONTROLLERS=(cpu cpuacct cpuset memory)
local_preflight() {
  local mounts=${ISTHMUS_PROC_MOUNTS:-/proc/mounts} top v1 ctl absent=() missing=() list
  [ -r "$mounts" ] || die "preflight: cannot read the mount table $mounts"
  # kubelet tells v1 from v2 by the filesystem at /sys/fs/cgroup; of several mounts there the last is the one seen.
  top=$(awk '$2 == "/sys/fs/cgroup" {t = $3} END {print t}' "$mounts")
  v1=" $(awk '$3 == "cgroup" {gsub(",", " ", $4); printf "%s ", $4}' "$mounts")"
  for ctl in "${LOCAL_CGROUP_V1_CONTROLLERS[@]}"; do
    case $v1 in *" $ctl "*) ;; *) absent+=("$ctl") ;; esac
  done
  list=$(printf '%s, ' "${absent[@]}"); list=${list%, }
  if [ "$top" = cgroup2 ]; then
    missing+=("cgroup v1 or hybrid: /sys/fs/cgroup is cgroup2, i.e. this machine runs cgroup v2 only$(
      [ ${#absent[@]} -eq 0 ] || echo "; no cgroup v1 hierarchy of $list") (read from $mounts)")
  elif [ ${#absent[@]} -gt 0 ]; then
    missing+=("cgroup v1 hierarchies of $list (none mounted with type cgroup in $mounts)")
  fi
  local cgroups_missing=${#missing[@]}
  [ "$(id -u)" = 0 ] ||
    missing+=("root: the nodes are network namespaces, a bridge, mounts and cgroups of this machine")
  if [ ${#missing[@]} -eq 0 ]; then
    log "preflight: local: a full cluster can run here" \
        "(root; cgroup v1 ${LOCAL_CGROUP_V1_CONTROLLERS[*]} in $mounts)"
    return 0
  fi
  {
    echo "cluster: preflight: the local provider cannot run a full cluster (nodes, kubelets) on this machine."
    printf '  missing: %s\n' "${missing[@]}"
    if [ "$cgroups_missing" -gt 0 ]; then
      cat <<EOF
  why: the nodes share this machine's cgroups: each node's kubelet runs with the cgroupfs driver under its own
       cgroupRoot /<cluster>-node<i>, which \`up\` makes in every cgroup v1 hierarchy; kubelet refuses to start
       without v1 hierarchies of cpu, cpuacct, cpuset and memory, and under cgroup v2 only it finds no
       cgroupRoot with controllers.
  ways out (e2e/cluster/README.md#preflight-cgroup-v1-for-the-local-provider):
    ISTHMUS_CLUSTER_PROVIDER=vm    nodes are QEMU guests with a stock kernel and cgroups of their own; make demo
                                   picks it where no Docker and kind answer, make e2e-vm always uses it;
                                   ISTHMUS_CLUSTER_PROVIDER=vm make test runs cluster-smoke and e2e on it too
    ISTHMUS_CLUSTER_PROVIDER=kind  nodes are Docker containers (e2e/cluster/README.md#kind)
    boot with cgroup v1 or hybrid  kernel command line systemd.unified_cgroup_hierarchy=0, with systemd 256
                                   and 257 also SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1 (systemd 258 and later
                                   have no cgroup v1: use vm or kind)
  A control-plane-only cluster (\`up --control-plane-only\`: make operator-it, chart-lint, examples-validate)
  needs none of this.
EOF
    fi
  } >&2
  exit 1
}

# ------------------------------------------------------------------------------------------------ node
node_up() { # I
  local i=$1 d name ip
  d=$(node_dir "$i"); name=$(node_name "$i"); ip=$(node_ip "$i")
  mkdir -p "$d"/{containerd/root,containerd/state,containerd/opt,cni/net.d,cni/ipam,runc,kubelet,pod-logs,volume-plugins}
  node_network_up "$i"
  node_cgroups_up "$i"
  cert "$name-client" "system:node:$name" system:nodes
  cert "$name-serving" "$name" system:nodes "IP:$ip,DNS:$name"
  kubeconfig_for "$d/kubelet.kubeconfig" "$name-client" "https://$BRIDGE_IP:$API_PORT"
  # containerd renders this once kubelet hands it node.spec.podCIDR; until then the node is NotReady.
  cat >"$d/cni-template.json" <<EOF
{"cniVersion": "1.0.0", "name": "isthmus", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "{{.PodCIDR}}"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$d/cni/ipam"}}]}
EOF
  cat >"$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # This machine lacks CAP_SYS_RESOURCE: lowering oom_score_adj (-998 for sandboxes) would fail every pod.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$d/cni/net.d"
    conf_template = "$d/cni-template.json"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$d/runc"
EOF
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$d/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$(cgroup_root "$i")
cgroupsPerQOS: true
failSwapOn: false
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/$name-serving.crt"
tlsPrivateKeyFile: "$PKI/$name-serving.key"
resolvConf: "$CLUSTER_DIR/resolv.conf"
clusterDomain: cluster.local
podLogsDir: "$d/pod-logs"
volumePluginDir: "$d/volume-plugins"
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
# Images cannot be pulled again here: never collect them (the pause image is not pinned by containerd 1.6).
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
# Zero leaves the machine-wide conntrack table size and timeouts alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  # Same mount namespace as ours (kubelet's volume mounts must be visible to it), node's network namespace.
  start_bg "$name-containerd" nsenter --net="$(node_netns "$i")" containerd --config "$d/containerd.toml"
  wait_for "$name containerd" 30 "$name-containerd" ctr --address "$d/containerd.sock" version
  ctr --address "$d/containerd.sock" -n k8s.io images import "$CLUSTER_DIR/images/pause.tar" >/dev/null
  local f
  for f in "$CLUSTER_DIR"/images/loaded/*.tar; do
    [ -e "$f" ] && ctr --address "$d/containerd.sock" -n k8s.io images import "$f" >/dev/null
  done
  # kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops machine-wide; it gets a mount
  # namespace of its own where those files are bind mounts of harmless copies. Its root directory is a shared
  # mount first, so the volumes it mounts there propagate back to the namespace containerd runs in.
  mount --bind "$d/kubelet" "$d/kubelet"
  mount --make-rshared "$d/kubelet"
  start_bg "$name-kubelet" unshare --mount --propagation unchanged sh -c '
    mount --bind "$1/one" /proc/sys/vm/overcommit_memory &&
    mount --bind "$1/ten" /proc/sys/kernel/panic &&
    mount --bind "$1/one" /proc/sys/kernel/panic_on_oops &&
    shift && exec "$@"' sh "$CLUSTER_DIR/fake-sysctl" \
    nsenter --net="$(node_netns "$i")" "$K8S_BIN/kubelet" --config="$d/kubelet.yaml" \
    --kubeconfig="$d/kubelet.kubeconfig" --root-dir="$d/kubelet" --hostname-override="$name" --node-ip="$ip" --v=1
  start_bg "$name-kube-proxy" nsenter --net="$(node_netns "$i")" "$K8S_BIN/kube-proxy" \
    --config="$d/kube-proxy.yaml" --v=1
}

# ------------------------------------------------------------------------------------------------ commands
local_up() { # NODES CONTROL_PLANE_ONLY
  local nodes=$1 cp_only=$2 t i
  t=$(date +%s.%N)
  if [ -e "$CLUSTER_DIR/mode" ]; then
    die "cluster '$CLUSTER_NAME' is already up ($CLUSTER_DIR); run 'cluster down' first"
  fi
  [ "$(id -u)" = 0 ] || die "the local provider needs root"
  [ -n "$cp_only" ] || local_preflight
  if [ -z "$cp_only" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "another full local cluster is up (bridge $BRIDGE exists); only one can run at a time"
  fi
  local_install
  rm -rf "$CLUSTER_DIR"
  mkdir -p "$CLUSTER_DIR"/{logs,pids,images/loaded}
  if [ -n "$cp_only" ]; then
    echo control-plane >"$CLUSTER_DIR/mode"
    echo "$K8S_VERSION" >"$CLUSTER_DIR/k8s-version"
    trap "up_failed local_down" EXIT
    API_PORT=$(free_port)
    echo "$API_PORT" >"$CLUSTER_DIR/api-port"
    pki_up 127.0.0.1
    control_plane_up 127.0.0.1 --no-scheduler
    # Pods (and the operator's tests) need the default ServiceAccount, which the controller-manager makes.
    wait_for "default ServiceAccount" 60 kube-controller-manager kc -n default get serviceaccount default
    trap - EXIT
    log "control plane up in $(elapsed "$t") s; KUBECONFIG=$CLUSTER_DIR/kubeconfig"
    return
  fi
  echo "full $nodes" >"$CLUSTER_DIR/mode"
  trap "up_failed local_down" EXIT
  record_preexisting
  network_up
  pki_up "$BRIDGE_IP"
  mkdir -p "$CLUSTER_DIR/fake-sysctl"
  echo 1 >"$CLUSTER_DIR/fake-sysctl/one"; echo 10 >"$CLUSTER_DIR/fake-sysctl/ten"
  echo "nameserver 127.0.0.1" >"$CLUSTER_DIR/resolv.conf"
  build_pause_image "$CLUSTER_DIR/images/pause.tar"
  control_plane_up "$BRIDGE_IP"
  for ((i = 1; i <= nodes; i++)); do node_up "$i"; done
  log "started $nodes node(s); waiting for pod CIDRs"
  wait_nodes_ready local_node_exec kubelet 60 120
  trap - EXIT
  log "cluster up in $(elapsed "$t") s: $nodes node(s) Ready; KUBECONFIG=$CLUSTER_DIR/kubeconfig"
}


# Which of the hard-coded paths existed before we started: `down` removes only directories we created.
record_preexisting() {
  local p
  for p in "${HARDCODED_DIRS[@]}"; do [ -e "$p" ] && echo "$p"; done >"$CLUSTER_DIR/preexisting" || true
}

# Kills every process left in a node's cgroups (containers of hostPID pods can outlive their task's init).
kill_cgroup_procs() { # ROOT
  local h pids
  for h in $(cgroup_hierarchies_all); do
    [ -d "$h/$1" ] || continue
    pids=$(find "$h/$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [ -z "$pids" ] || { kill -9 $pids 2>/dev/null; STOPPED_PIDS+=($pids); } || true
  done
}

remove_cgroups() { # ROOT
  local h i
  for h in $(cgroup_hierarchies_all); do
    [ -d "$h/$1" ] || continue
    for ((i = 0; i < 50; i++)); do
      find "$h/$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$h/$1" ] || break
      kill_cgroup_procs "$1"; sleep 0.1
    done
    [ ! -d "$h/$1" ] || log "warning: cgroup $h/$1 could not be removed"
  done
}

# The pids of this cluster's containerd shims (they run detached from containerd by design).
shim_pids() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case $cmd in containerd-shim*" -address $CLUSTER_DIR/node"*) echo "${p#/proc/}" ;; esac
  done
}
# Kills the shims that outlived their containerd.
kill_leftover_shims() {
  local p
  for p in $(shim_pids); do kill -9 "$p" 2>/dev/null; STOPPED_PIDS+=("$p"); done
}

node_down() { # I
  local i=$1 d name sock c
  d=$(node_dir "$i"); name=$(node_name "$i"); sock=$d/containerd.sock
  # No graceful pod deletion: every trace of a pod lives in the node's namespaces, cgroups and directory,
  # which go away below; this keeps `down` fast whatever runs in the cluster.
  # Shims exit by themselves once their tasks are deleted; remembered so that `down` waits until they are reaped.
  STOPPED_PIDS+=($(shim_pids))
  if alive "$name-containerd"; then
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -a -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
    kill_cgroup_procs "$(cgroup_root "$i")"
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
    done
  fi
  stop_pids KILL "$name-containerd"
  kill_cgroup_procs "$(cgroup_root "$i")"
}

unmount_under() { # DIR: deepest first
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep "^$1/" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
  done
}

local_down() {
  set +e
  local t i mode
  t=$(date +%s.%N)
  mode=$(cat "$CLUSTER_DIR/mode" 2>/dev/null)
  if [ ! -f "$CLUSTER_DIR/mode" ]; then
    log "cluster '$CLUSTER_NAME' is not up"
    if ip link show "$BRIDGE" >/dev/null 2>&1 && ! grep -qs '^full' "$(dirname "$CLUSTER_DIR")"/*/mode; then
      log "note: bridge $BRIDGE exists but no cluster claims it (run directory lost?); remove it with" \
          "'ip link del $BRIDGE; ip route del unreachable $RESERVED_RANGE'"
    fi
    return 0
  fi
  # SIGKILL throughout: `down` discards all state, so nothing needs a graceful shutdown (that costs seconds).
  local agents=()
  for i in $(node_indices); do agents+=("$(node_name "$i")-kube-proxy" "$(node_name "$i")-kubelet"); done
  stop_pids KILL "${agents[@]}"
  for i in $(node_indices); do node_down "$i"; done
  stop_pids KILL kube-scheduler kube-controller-manager kube-apiserver etcd
  kill_leftover_shims
  unmount_under "$CLUSTER_DIR"
  for i in $(node_indices); do
    ip link del "$(host_veth "$i")" 2>/dev/null
    remove_cgroups "$(cgroup_root "$i")"
  done
  if [ "${mode%% *}" = full ]; then
    ip route show | awk '/^198\.19\./ {print $1}' | while read -r r; do ip route del "$r"; done
    ip route del unreachable "$RESERVED_RANGE" 2>/dev/null
    ip link del "$BRIDGE" 2>/dev/null
    # Flows the host's bridge netfilter tracked for the cluster's addresses.
    conntrack -D -s 198.18.0.0 --mask-src 255.254.0.0 >/dev/null 2>&1
    conntrack -D -d 198.18.0.0 --mask-dst 255.254.0.0 >/dev/null 2>&1
    cleanup_hardcoded_paths
  fi
  wait_reaped
  # Keep the logs for a post-mortem; the rest (etcd, containerd roots, keys) goes.
  find "$CLUSTER_DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} + 2>/dev/null
  [ ! -d "$CLUSTER_DIR" ] || rm -rf "$CLUSTER_DIR/pids"
  log "down in $(elapsed "$t") s"
  set -e
}

cleanup_hardcoded_paths() {
  local p
  # kubelet's device-plugin socket and container log links; libcni's result cache, keyed by network name
  # ("isthmus", and "cni-loopback" for containerd's own loopback set-up) and sandbox id.
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  find /var/log/containers -maxdepth 1 -type l -lname "$CLUSTER_DIR/*" -delete 2>/dev/null
  local i id
  for i in $(node_indices); do
    for id in "$(node_dir "$i")"/containerd/root/io.containerd.grpc.v1.cri/sandboxes/*; do
      [ -e "$id" ] && rm -f /var/lib/cni/results/*-"${id##*/}"-*
    done
  done
  rm -f /var/lib/cni/results/isthmus-* 2>/dev/null
  for p in "${HARDCODED_DIRS[@]}"; do
    grep -qxF "$p" "$CLUSTER_DIR/preexisting" 2>/dev/null || rmdir "$p" 2>/dev/null
  done
}

local_load_image() { # ARCHIVE
  local archive=$1 i d n=0
  [ -f "$archive" ] || die "no such image archive: $archive"
  [ -d "$CLUSTER_DIR/images/loaded" ] || die "cluster '$CLUSTER_NAME' is not up"
  case $(cat "$CLUSTER_DIR/mode") in control-plane) die "a control-plane-only cluster has no nodes to load images into" ;; esac
  # Kept, so a node added later gets it too.
  cp "$archive" "$CLUSTER_DIR/images/loaded/$(sha256sum "$archive" | cut -c1-16).tar"
  for i in $(node_indices); do
    d=$(node_dir "$i")
    ctr --address "$d/containerd.sock" -n k8s.io images import "$archive" >/dev/null
    n=$((n + 1))
  done
  log "loaded $archive into $n node(s)"
}

local_status() {
  [ -f "$CLUSTER_DIR/mode" ] || { echo "cluster '$CLUSTER_NAME' (local): down"; return 1; }
  echo "cluster '$CLUSTER_NAME' (local, $(cat "$CLUSTER_DIR/mode")): $CLUSTER_DIR"
  local f bad=0
  for f in "$CLUSTER_DIR"/pids/*; do
    [ -e "$f" ] || continue
    if alive "${f##*/}"; then echo "  running  ${f##*/} (pid $(cat "$f"))"; else echo "  DEAD     ${f##*/}"; bad=1; fi
  done
  kc get nodes -o wide 2>/dev/null || { echo "  API server not answering"; bad=1; }
  return $bad
}
