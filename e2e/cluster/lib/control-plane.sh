# The control plane on this machine: etcd, kube-apiserver, kube-controller-manager, kube-scheduler. Sourced by
# ../cluster.
control_plane_up() { # API_HOST [--no-scheduler]
  local api_host=$1 scheduler=${2:-} ec ep
  ec=$(free_port); ep=$(free_port)
  start_bg etcd "$K8S_BIN/etcd" --name "$CLUSTER_NAME" --data-dir "$CLUSTER_DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ec" --advertise-client-urls "http://127.0.0.1:$ec" \
    --listen-peer-urls "http://127.0.0.1:$ep" --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
    --initial-cluster "$CLUSTER_NAME=http://127.0.0.1:$ep"
  wait_for "etcd health" 30 etcd curl -sf "http://127.0.0.1:$ec/health"
  local extra=()
  # On loopback the apiserver cannot publish itself as the `kubernetes` endpoint (it refuses loopback addresses).
  [ "$api_host" != 127.0.0.1 ] || extra+=(--endpoint-reconciler-type=none)
  # --enable-aggregator-routing: the API server calls admission webhooks (isthmus's NetworkTopology webhook) at
  # their endpoints' pod IPs, which this host routes to, not at their Service IPs, which only the nodes' kube-proxy
  # rules reach (a control plane inside the cluster network, as kind's, reaches both).
  start_bg kube-apiserver "$K8S_BIN/kube-apiserver" \
    --bind-address="$api_host" --advertise-address="$api_host" --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$ec" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --profiling=false --enable-aggregator-routing=true "${extra[@]}"
  mv "$CLUSTER_DIR/kubeconfig.tmp" "$CLUSTER_DIR/kubeconfig"
  wait_for "kube-apiserver /readyz" 90 kube-apiserver kc get --raw /readyz
  log "kube-apiserver ready on https://$api_host:$API_PORT"
  local cm=$CLUSTER_DIR/controller-manager.kubeconfig node_cidrs=() controllers='*'
  [ -n "$scheduler" ] || node_cidrs=(--allocate-node-cidrs=true --cluster-cidr="$CLUSTER_CIDR" --node-cidr-mask-size=24)
  # Without nodes (control-plane-only), tests make pod objects as a DaemonSet would on the nodes they name; the
  # DaemonSet controller would delete those (their nodes do not exist) and the pod garbage collector remove them,
  # at a moment of their choosing, under a test reading them.
  [ -z "$scheduler" ] || controllers='*,-daemonset,-podgc'
  # --secure-port=0: neither controller-manager nor scheduler opens a listening socket.
  start_bg kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$cm" --authentication-kubeconfig="$cm" --authorization-kubeconfig="$cm" \
    --secure-port=0 --leader-elect=false --controllers="$controllers" \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" "${node_cidrs[@]}"
  if [ -z "$scheduler" ]; then
    local sc=$CLUSTER_DIR/scheduler.kubeconfig
    start_bg kube-scheduler "$K8S_BIN/kube-scheduler" \
      --kubeconfig="$sc" --authentication-kubeconfig="$sc" --authorization-kubeconfig="$sc" \
      --secure-port=0 --leader-elect=false
  fi
}
