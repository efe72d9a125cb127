# The address plan and the host side of the network, shared by the local and vm providers. Sourced by
# ../cluster.
#
# Every address is in 198.18.0.0/15 (RFC 2544, reserved for benchmark tests), on a bridge and in network
# namespaces (or guests) this rig creates; the host gets an unreachable route for the whole range, so nothing of
# the cluster's can follow the default route out.
#
#   host netns   isthbr0 198.18.0.1/24   kube-apiserver :6443; etcd, controller-manager, scheduler on 127.0.0.1
#                route 198.18.0.0/15 unreachable; route <node i pod /24> via 198.18.0.(1+i)
#   node i       198.18.0.(1+i)/24 on the bridge, no default route; a route for the service range via the bridge
#                (what a real node's default route gives host-network pods: kube-proxy's DNAT needs a route
#                to the ClusterIP before it rewrites it; the isthmus agent reaches the API server that way)
#   pods         198.19.0.0/16, a /24 per node        services 198.18.16.0/20 (kubernetes = 198.18.16.1)
RESERVED_RANGE=198.18.0.0/15
NODE_NET=198.18.0
BRIDGE=isthbr0
BRIDGE_IP=$NODE_NET.1
API_PORT=6443
SERVICE_CIDR=198.18.16.0/20
KUBERNETES_SERVICE_IP=198.18.16.1
CLUSTER_CIDR=198.19.0.0/16
PAUSE_IMAGE=localhost/isthmus-pause:$K8S_VERSION
CNI_BIN_DIR=/usr/lib/cni
PKI=$CLUSTER_DIR/pki

node_ip() { echo "$NODE_NET.$((1 + $1))"; }
node_name() { echo "$CLUSTER_NAME-node$1"; }
node_dir() { echo "$CLUSTER_DIR/node$1"; }
node_indices() { local d; for d in "$CLUSTER_DIR"/node[0-9]*; do [ -d "$d" ] && echo "${d##*/node}"; done | sort -n; }

network_up() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Longest prefix wins: the bridge's /24 and the pod /24s (added per node) are reachable, everything else in
  # the range is refused here instead of following the default route.
  ip route add unreachable "$RESERVED_RANGE"
}

# Routes to each node's pod /24 from this machine and from every other node, once the controller-manager
# allocated them; EXEC runs a command on a node (the provider's <provider>_node_exec).
pod_routes_up() { # EXEC
  local exec=$1 i j cidr
  for i in $(node_indices); do
    cidr=$(kc get node "$(node_name "$i")" -o jsonpath='{.spec.podCIDR}')
    [ -n "$cidr" ] || die "$(node_name "$i") has no pod CIDR"
    ip route replace "$cidr" via "$(node_ip "$i")" dev "$BRIDGE"
    for j in $(node_indices); do
      [ "$i" = "$j" ] || "$exec" "$j" ip route replace "$cidr" via "$(node_ip "$i")" dev eth0 >/dev/null ||
        die "node $j: no route to $cidr"
    done
    "$exec" "$i" ip route replace "$SERVICE_CIDR" via "$BRIDGE_IP" dev eth0 >/dev/null ||
      die "node $i: no route to the service range $SERVICE_CIDR"
  done
}

node_has_pod_cidr() { [ -n "$(kc get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null)" ]; }

# Once the nodes are started: their pod CIDRs, the routes to them, every node Ready, the default ServiceAccount.
# EXEC runs a command on a node; PROC names the process per node whose death ends the wait early
# (<node>-PROC); the timeouts are the provider's.
wait_nodes_ready() { # EXEC PROC CIDR_TIMEOUT READY_TIMEOUT
  local exec=$1 proc=$2 i
  for i in $(node_indices); do
    wait_for "$(node_name "$i") pod CIDR" "$3" "$(node_name "$i")-$proc" node_has_pod_cidr "$(node_name "$i")"
  done
  pod_routes_up "$exec"
  for i in $(node_indices); do
    wait_for "$(node_name "$i") Ready" "$4" "$(node_name "$i")-$proc" \
      kc wait --for=condition=Ready "node/$(node_name "$i")" --timeout=2s
  done
  wait_for "default ServiceAccount" 60 kube-controller-manager kc -n default get serviceaccount default
}

# The pod sandbox's pause image, an archive every node imports (images cannot be pulled here).
build_pause_image() { # OUT
  "$CLUSTER_HOME/build-image" "$PAUSE_IMAGE" "$1" --file "$K8S_BIN/isthmus-pause:/pause" --entrypoint /pause \
    --user 65535:65535 >/dev/null
}

# The EXIT trap of a provider's `up`: a failed `up` leaves nothing running (DOWN is the provider's down); the logs
# stay for the post-mortem.
up_failed() { # DOWN
  local rc=$?
  [ $rc -ne 0 ] || return 0
  log "up failed (exit $rc); tearing down what was started (logs: $CLUSTER_DIR/logs)"
  "$1"
  exit $rc
}
