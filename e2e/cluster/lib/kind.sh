# The kind provider: the same commands, driven through kind (needs Docker and kind). Sourced by ../cluster.
# Deliberately thin: everything it does is one kind command, so nearly all the tested logic is shared.
KIND_NODE_IMAGE=${ISTHMUS_KIND_NODE_IMAGE:-}

kind_up() { # NODES CONTROL_PLANE_ONLY
  local nodes=$1 cp_only=$2 t i
  t=$(date +%s.%N)
  command -v kind >/dev/null || die "kind is not installed (go install sigs.k8s.io/kind@<version>)"
  mkdir -p "$CLUSTER_DIR"
  # One control-plane node, plus one worker per requested node: the local provider's nodes are all workers.
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "nodes:"
    echo "- role: control-plane"
    if [ -z "$cp_only" ]; then for ((i = 1; i <= nodes; i++)); do echo "- role: worker"; done; fi
  } >"$CLUSTER_DIR/kind.yaml"
  local image=()
  [ -z "$KIND_NODE_IMAGE" ] || image=(--image "$KIND_NODE_IMAGE")
  kind create cluster --name "$CLUSTER_NAME" --config "$CLUSTER_DIR/kind.yaml" "${image[@]}" \
    --kubeconfig "$CLUSTER_DIR/kubeconfig" --wait 180s
  if [ -n "$cp_only" ]; then echo control-plane; else echo "full $nodes"; fi >"$CLUSTER_DIR/mode"
  log "kind cluster '$CLUSTER_NAME' up in $(elapsed "$t") s; KUBECONFIG=$CLUSTER_DIR/kubeconfig"
}

kind_down() {
  kind delete cluster --name "$CLUSTER_NAME"
  rm -rf "$CLUSTER_DIR"
}

kind_load_image() { kind load image-archive --name "$CLUSTER_NAME" "$1"; }

kind_status() {
  kind get nodes --name "$CLUSTER_NAME" | grep -q . || { echo "cluster '$CLUSTER_NAME' (kind): down"; return 1; }
  echo "cluster '$CLUSTER_NAME' (kind): $CLUSTER_DIR"
  kc get nodes -o wide
}
