#!/usr/bin/env bash
# Machine state a cluster could leave behind, for "down leaves nothing" checks.
#   snapshot.sh take DIR            writes one file per aspect into DIR
# Two snapshots are compared by the cluster smoke's Rust binary (`cluster_smoke leaves-nothing LABEL BASE CUR`,
# e2e/suite/tests/cluster_smoke/; the verdict in e2e/suite/src/snapshot.rs): CUR fails when it differs from BASE
# in anything a cluster makes; differences that are plainly someone else's (other tests share this machine) are
# shown but do not fail.
set -euo pipefail

take() {
  local out=$1 h
  mkdir -p "$out"
  # Processes: command lines only (pids differ run to run), for what a cluster runs.
  # (By executable name: other work on this machine has "kube" in its arguments, e.g. rustc building kube_client.)
  ps -eo comm=,args= \
    | awk '$1 ~ /^(etcd|kube-apiserver|kube-controller|kube-scheduler|kubelet|kube-proxy|containerd|containerd-shim|runc|isthmus-pause|pause|linux\.uml|qemu-system-x86)$/' \
    | sed 's/[0-9]\{4,\}/N/g' | sort >"$out/processes" || true
  awk '{print $5, $9, $10}' /proc/self/mountinfo | sort >"$out/mounts"
  { ip netns list 2>/dev/null || true; } | sort >"$out/netns"
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort >"$out/links"
  { ip -4 route show table all; ip -6 route show table all; } 2>/dev/null | sort >"$out/routes"
  : >"$out/iptables"
  for t in iptables-nft-save ip6tables-nft-save iptables-legacy-save ip6tables-legacy-save; do
    command -v $t >/dev/null || continue
    $t 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' | sed "s/^/$t: /" >>"$out/iptables" || true
  done
  for h in $(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts); do
    find "$h" -mindepth 1 -maxdepth 2 -type d 2>/dev/null
  done | grep -v '/process_api/' | sort >"$out/cgroups"
  sysctl net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables \
    vm.overcommit_memory kernel.panic kernel.panic_on_oops net.netfilter.nf_conntrack_max 2>/dev/null \
    | sort >"$out/sysctls" || true
  for p in /var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/containerd /var/lib/containerd \
           /opt/containerd /etc/cni /opt/cni; do
    [ -e "$p" ] && find "$p" -maxdepth 3 2>/dev/null
  done | sort >"$out/paths" || true
  { conntrack -L 2>/dev/null || true; } | grep -cE '198\.1[89]\.' >"$out/conntrack" || true
  local f
  for f in "$out"/*; do drop_other_clusters "$f"; done
}

# Other clusters of this rig (other names, e.g. an integration test's control plane) may start and stop while a
# snapshot pair is taken: lines naming their run directories are not ours to judge. SNAPSHOT_CLUSTER_DIR is ours.
drop_other_clusters() { # FILE
  local own=${SNAPSHOT_CLUSTER_DIR:-} parent
  [ -n "$own" ] || return 0
  parent=$(dirname "$own")
  sed -e "s#$own/#@OWN@/#g" -e "s#$own\( \|\$\)#@OWN@\1#g" "$1" | grep -v "$parent/" | sed "s#@OWN@#$own#g" >"$1.own" || true
  mv "$1.own" "$1"
}

case ${1:-} in
  take) take "$2" ;;
  *) echo "usage: $0 take DIR" >&2; exit 2 ;;
esac
