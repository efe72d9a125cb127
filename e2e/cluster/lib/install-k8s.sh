#!/usr/bin/env bash
# Builds the cluster's binaries from the Go module proxy into the cache (a no-op when they are there):
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl v1.34.12 and
# etcd 3.6.4 (the version Kubernetes v1.34.12 pins), all from the module in ../k8s with its committed go.sum,
# and the pod sandbox's pause process (../k8s/pause).
# ISTHMUS_K8S_VERSION=v1.32.13 builds the oldest supported version instead, for control-plane-only clusters
# (make min-k8s): kube-apiserver, kube-controller-manager, kubectl and etcd 3.5.16 from ../k8s-1.32.
# Usage: install-k8s.sh [kubeadm]  prints the bin directory on its last line; `kubeadm` also builds kubeadm
#                                  (the kind node image needs it; the local cluster does not)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=${ISTHMUS_K8S_VERSION:-v1.34.12}
CACHE=${ISTHMUS_CACHE:-$HOME/.cache/isthmus}
BIN=$CACHE/k8s/$K8S_VERSION/bin
case $K8S_VERSION in
  v1.34.12)
    MODULE=$HERE/k8s
    K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
    OTHER=(etcd isthmus-pause) ;;
  v1.32.13)
    # Only what a control-plane-only cluster runs: the minimum version is checked against its API server,
    # and a full cluster of it would double the cold build for nothing the checks read.
    MODULE=$HERE/k8s-1.32
    K8S_CMDS=(kube-apiserver kube-controller-manager kubectl)
    OTHER=(etcd) ;;
  *) echo "install-k8s: ISTHMUS_K8S_VERSION=$K8S_VERSION: only v1.34.12 and v1.32.13 have a module here" >&2; exit 2 ;;
esac
for extra in "$@"; do
  case $extra in
    kubeadm) K8S_CMDS+=(kubeadm) ;;
    *) echo "usage: $0 [kubeadm]" >&2; exit 2 ;;
  esac
done

all_present() {
  local b
  for b in "${K8S_CMDS[@]}" "${OTHER[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

if ! all_present; then
  mkdir -p "$BIN"
  # Concurrent callers (a smoke test and an integration test) wait for one build instead of running two.
  exec 9>"$BIN/../install.lock"
  flock 9
fi
if ! all_present; then
  command -v go >/dev/null || { echo "install-k8s: Go >= 1.25 is needed to build the Kubernetes binaries" >&2; exit 1; }
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
  export GOMODCACHE=${GOMODCACHE_ISTHMUS:-$CACHE/go/mod} GOCACHE=${GOCACHE_ISTHMUS:-$CACHE/go/build}
  mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"
  stage=$(mktemp -d "$BIN/../stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  cd "$MODULE"
  v=k8s.io/component-base/version minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  ldx="-X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
  pkgs=()
  for b in "${K8S_CMDS[@]}"; do [ -x "$BIN/$b" ] || pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  start=$(date +%s)
  echo "install-k8s: building into $BIN what is missing of: ${K8S_CMDS[*]} ${OTHER[*]}" \
    "(a fresh machine takes 7-11 min; v1.32.13's four binaries 13-14 min on a loaded 2-core one)" >&2
  # One invocation for all commands: their shared packages compile once, in parallel.
  [ ${#pkgs[@]} -eq 0 ] || nice -n 10 go build -ldflags "-s -w $ldx" -o "$stage/" "${pkgs[@]}"
  # etcd's main package is its module root, so `go build -o dir/` would call it "v3".
  [ -x "$BIN/etcd" ] || nice -n 10 go build -ldflags "-s -w" -o "$stage/etcd" go.etcd.io/etcd/server/v3
  if [[ " ${OTHER[*]} " == *" isthmus-pause "* ]] && [ ! -x "$BIN/isthmus-pause" ]; then
    CGO_ENABLED=0 nice -n 10 go build -ldflags "-s -w" -o "$stage/isthmus-pause" ./pause
  fi
  # Only what is missing: a rebuild never replaces a binary a running cluster uses.
  for f in "$stage"/*; do [ -e "$BIN/${f##*/}" ] || mv "$f" "$BIN/"; done
  echo "install-k8s: built in $(( $(date +%s) - start )) s; caches: $(du -sh "$GOMODCACHE" | cut -f1) modules, $(du -sh "$GOCACHE" | cut -f1) build" >&2
fi
echo "$BIN"
