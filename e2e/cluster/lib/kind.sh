# The kind provider: the same commands, driven through kind (needs Docker and kind). Sourced by ../cluster.
# Deliberately thin: everything it does is one kind command, so nearly all the tested logic is shared.
#
# Where no container image can be pulled (this project's machines), it runs on what ../kind makes:
#   - Docker: where no daemon answers, `up` starts the project's own (../kind/docker: no NAT, no forwarding)
#     and `down` stops it again once it has no container left; a daemon it did not start is never stopped;
#   - node image: ISTHMUS_KIND_NODE_IMAGE if set (`local`: the one ../kind/node-image assembles, built once);
#     else that assembled image when the daemon is the project's own, else the kindest/node image below;
#   - kind: the one on PATH, else the version pinned in ../tools/go.mod (built once by install-tool.sh).
# With the assembled image a cluster is one node by default (2 cores here): ISTHMUS_KIND_WORKERS sets the
# number of workers beside the control-plane node whatever the image (default: one per requested node).
KIND_NODE_IMAGE=${ISTHMUS_KIND_NODE_IMAGE:-}
# The Kubernetes v1.34 image published with kind v0.33.0 (its release notes); v1.34.12 is built here.
KIND_STOCK_IMAGE=kindest/node:v1.34.11@sha256:44e222ee2132dab25ff87301682f89eb82c7880ea3a1bf543bfe9708fd08d67d
KIND_DOCKER=$CLUSTER_HOME/kind/docker

# `kind`: where none is on PATH and this provider was asked for, the pinned build (made on first use).
if [ "${ISTHMUS_CLUSTER_PROVIDER:-}" = kind ] && ! command -v kind >/dev/null; then
  kind() { local k; k=$("$CLUSTER_HOME/lib/install-tool.sh" kind) && "$k" "$@"; }
fi

kind_docker_ours() { "$KIND_DOCKER" status 2>/dev/null | grep -q '^docker: ours'; }

# The node image for `up`; builds the assembled one when that is the one.
kind_node_image() {
  local image=$KIND_NODE_IMAGE
  if [ -z "$image" ]; then
    if kind_docker_ours; then image=local; else image=$KIND_STOCK_IMAGE; fi
  fi
  if [ "$image" = local ]; then
    image=$("$CLUSTER_HOME/kind/node-image" | tail -n 1) || die "assembling the kind node image failed"
  fi
  echo "$image"
}

# A run directory of this name that another provider's cluster holds is not ours to write or delete.
kind_owns_dir() {
  local p
  p=$(cat "$CLUSTER_DIR/provider" 2>/dev/null) || return 0
  [ "$p" = kind ] || die "$CLUSTER_DIR belongs to a '$p' cluster named '$CLUSTER_NAME': use another ISTHMUS_CLUSTER_NAME"
}

# Nothing cheap to check ahead: where there are none, `up` starts a Docker daemon, builds kind and assembles its
# node image itself, and what else it needs only Docker and kind can tell.
kind_preflight() { log "preflight: kind: nothing to check ahead (up brings Docker, kind and the node image)"; }

kind_up() { # NODES CONTROL_PLANE_ONLY
  local nodes=$1 cp_only=$2 t i image workers etcd_tag
  t=$(date +%s.%N)
  command -v kind >/dev/null || die "kind is not installed (go install sigs.k8s.io/kind@<version>)"
  kind_owns_dir
  [ ! -e "$CLUSTER_DIR/kubeconfig" ] || die "cluster '$CLUSTER_NAME' is up already ($CLUSTER_DIR)"
  mkdir -p "$CLUSTER_DIR"
  echo kind >"$CLUSTER_DIR/provider"
  if ! timeout 10 docker info >/dev/null 2>&1; then
    "$KIND_DOCKER" start || die "no Docker daemon answers and ../kind/docker could not start one"
  fi
  image=$(kind_node_image) || { "$KIND_DOCKER" stop-if-idle; die "no kind node image"; }
  # One control-plane node, plus one worker per requested node: the local provider's nodes are all workers.
  workers=$nodes
  if docker image inspect -f '{{index .Config.Labels "dev.isthmus.kind.etcd-image-tag"}}' "$image" 2>/dev/null |
      grep -q .; then
    workers=0  # the assembled image: one node on this 2-core machine
    etcd_tag=$(docker image inspect -f '{{index .Config.Labels "dev.isthmus.kind.etcd-image-tag"}}' "$image")
  fi
  workers=${ISTHMUS_KIND_WORKERS:-$workers}
  [ -z "$cp_only" ] || workers=0
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "nodes:"
    echo "- role: control-plane"
    for ((i = 1; i <= workers; i++)); do echo "- role: worker"; done
    if [ -n "${etcd_tag:-}" ]; then
      # The assembled image carries the etcd that e2e/cluster/k8s builds, not kubeadm's default tag.
      printf 'kubeadmConfigPatches:\n- |\n  kind: ClusterConfiguration\n  etcd:\n    local:\n      imageTag: %s\n' "$etcd_tag"
    fi
  } >"$CLUSTER_DIR/kind.yaml"
  log "kind create cluster '$CLUSTER_NAME': $((workers + 1)) node(s), image $image"
  if ! kind create cluster --name "$CLUSTER_NAME" --config "$CLUSTER_DIR/kind.yaml" --image "$image" \
      --kubeconfig "$CLUSTER_DIR/kubeconfig" --wait 180s; then
    kind_down >/dev/null 2>&1 || true
    die "kind create cluster failed"
  fi
  if [ -n "$cp_only" ]; then echo control-plane; else echo "full $nodes"; fi >"$CLUSTER_DIR/mode"
  log "kind cluster '$CLUSTER_NAME' up in $(elapsed "$t") s; KUBECONFIG=$CLUSTER_DIR/kubeconfig"
}

kind_down() {
  kind_owns_dir
  if timeout 10 docker info >/dev/null 2>&1; then
    kind delete cluster --name "$CLUSTER_NAME"
    # kind's network outlives its clusters (a bridge on this machine): it goes with the last node on it.
    if [ "$(docker network inspect -f '{{len .Containers}}' kind 2>/dev/null)" = 0 ]; then
      docker network rm kind >/dev/null
    fi
    "$KIND_DOCKER" stop-if-idle
  fi
  rm -rf "$CLUSTER_DIR"
}

kind_load_image() { kind load image-archive --name "$CLUSTER_NAME" "$1"; }

kind_status() {
  timeout 10 docker info >/dev/null 2>&1 || { echo "cluster '$CLUSTER_NAME' (kind): down (no Docker daemon)"; return 1; }
  kind get nodes --name "$CLUSTER_NAME" | grep -q . || { echo "cluster '$CLUSTER_NAME' (kind): down"; return 1; }
  echo "cluster '$CLUSTER_NAME' (kind): $CLUSTER_DIR"
  kc get nodes -o wide
}
