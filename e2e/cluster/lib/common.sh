# Shared by the providers: names, paths, logging, process control. Sourced by ../cluster.
CLUSTER_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ISTHMUS_CACHE=${ISTHMUS_CACHE:-$HOME/.cache/isthmus}
CLUSTER_NAME=${ISTHMUS_CLUSTER_NAME:-isthmus}
case $CLUSTER_NAME in
  *[!a-z0-9-]*|''|-*) echo "cluster: ISTHMUS_CLUSTER_NAME must be lower-case letters, digits and '-' (got '$CLUSTER_NAME')" >&2; exit 2 ;;
esac
# Everything a cluster writes at run time lives here (configs, PKI, logs, etcd and containerd data).
CLUSTER_DIR=${ISTHMUS_CLUSTER_DIR:-/tmp/isthmus-cluster/$CLUSTER_NAME}
# The default version runs everything; ISTHMUS_K8S_VERSION=v1.32.13 (the oldest supported) only a
# control-plane-only cluster (lib/install-k8s.sh builds no nodes' binaries of it). A running cluster records
# its version, so `kubectl` and `down` of that cluster use its binaries without being told again.
DEFAULT_K8S_VERSION=v1.34.12
K8S_VERSION=${ISTHMUS_K8S_VERSION:-$(cat "$CLUSTER_DIR/k8s-version" 2>/dev/null || echo "$DEFAULT_K8S_VERSION")}
export ISTHMUS_K8S_VERSION=$K8S_VERSION
K8S_BIN=$ISTHMUS_CACHE/k8s/$K8S_VERSION/bin

T0=$(date +%s.%N)
log() { printf '[%s +%6.2fs] %s\n' "$(date -u +%T)" "$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# A free TCP port on 127.0.0.1. The kernel picks it; another process could take it before we bind,
# which the caller notices as a start failure.
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# start_bg NAME CMD...: runs CMD detached from our session (a later Ctrl-C elsewhere does not reach it),
# logs to $CLUSTER_DIR/logs/NAME.log, records its pid in $CLUSTER_DIR/pids/NAME.
start_bg() {
  local name=$1; shift
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids"
  setsid "$@" </dev/null >"$CLUSTER_DIR/logs/$name.log" 2>&1 &
  echo $! >"$CLUSTER_DIR/pids/$name"
}

# A process is running unless gone or a zombie: our daemons' parent is PID 1 once `up` returned, and it may
# take seconds to reap them.
pid_running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
alive() { [ -f "$CLUSTER_DIR/pids/$1" ] && pid_running "$(cat "$CLUSTER_DIR/pids/$1")"; }

# stop_pids SIGNAL NAME...: signals the pids we recorded under these names (nothing else), waits up to 10 s for
# them to go, then SIGKILLs what is left.
stop_pids() {
  local sig=$1 n p i pids=(); shift
  for n in "$@"; do
    [ -f "$CLUSTER_DIR/pids/$n" ] || continue
    p=$(cat "$CLUSTER_DIR/pids/$n")
    kill -s "$sig" "$p" 2>/dev/null && pids+=("$p") && STOPPED_PIDS+=("$p")
    rm -f "$CLUSTER_DIR/pids/$n"
  done
  for ((i = 0; i < 100 && ${#pids[@]} > 0; i++)); do
    for p in "${!pids[@]}"; do pid_running "${pids[$p]}" || unset "pids[$p]"; done
    [ ${#pids[@]} -eq 0 ] || sleep 0.05
  done
  [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
}
STOPPED_PIDS=()

# Waits (up to 10 s) until the processes stop_pids ended are reaped: they are PID 1's children once `up` has
# returned, and this machine's PID 1 reaps only every second or two. Until then `ps` lists them as zombies.
wait_reaped() {
  local p i stat
  for p in "${STOPPED_PIDS[@]}"; do
    for ((i = 0; i < 200; i++)); do
      stat=$(cat "/proc/$p/stat" 2>/dev/null) || break
      stat=${stat##*) }
      [ "${stat%% *}" = Z ] || break
      sleep 0.05
    done
  done
  STOPPED_PIDS=()
}

# wait_for DESCRIPTION TIMEOUT_S PROCESS_NAME CMD...: polls CMD until it succeeds; fails early when the
# named process died, showing its log.
wait_for() {
  local what=$1 timeout=$2 proc=$3 deadline; shift 3
  deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$proc" ] && ! alive "$proc"; then
      tail -n 30 "$CLUSTER_DIR/logs/$proc.log" >&2 || true
      die "$proc exited while waiting for $what (log: $CLUSTER_DIR/logs/$proc.log)"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${timeout}s waiting for $what"
    sleep 0.2
  done
}

kubectl_bin() {
  if [ -x "$K8S_BIN/kubectl" ]; then echo "$K8S_BIN/kubectl"
  elif command -v kubectl >/dev/null; then command -v kubectl
  else die "no kubectl: run 'cluster install' (builds $K8S_VERSION) or put one on PATH"; fi
}
kc() { "$(kubectl_bin)" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }

# The provider: the one a running cluster of this name was made with, else kind where a Docker daemon answers
# and kind is installed, local otherwise. With `new`, the one a cluster started now would get: a running cluster
# is no guide there, since make test takes the demo's cluster down before starting its own.
choose_provider() { # [new]
  local p=${ISTHMUS_CLUSTER_PROVIDER:-}
  [ -n "$p" ] || [ "${1:-}" = new ] || p=$(cat "$CLUSTER_DIR/provider" 2>/dev/null || true)
  if [ -z "$p" ]; then
    if command -v kind >/dev/null && command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
      p=kind
    else
      p=local
    fi
  fi
  case $p in local|vm|kind) echo "$p" ;; *) die "ISTHMUS_CLUSTER_PROVIDER must be 'local', 'vm' or 'kind' (got '$p')" ;; esac
}
