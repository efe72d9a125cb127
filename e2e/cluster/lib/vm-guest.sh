#!/bin/bash
# PID 1 of a vm-provider node (see vm.sh): runs inside the guest, with this machine's files as its read-only
# root under a tmpfs. Brings up the node's kernel side (modules, cgroups, network), then containerd, kubelet
# and kube-proxy, and then serves commands from the io directory until the guest is killed.
set -u
# shellcheck source=/dev/null
. "$ISTHMUS_VM_NODE_ENV"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LOGS=$IO/logs
say() { echo "[guest $(date -u +%T.%N | cut -c1-12)] $*" >>"$LOGS/init.log"; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# kubelet (cAdvisor) refuses to start without a clock speed, which UML's /proc/cpuinfo does not give
if ! grep -q '^cpu MHz' /proc/cpuinfo; then
  sed '/^bogomips/i cpu MHz\t\t: 1000.000' /proc/cpuinfo >/run/cpuinfo
  mount --bind /run/cpuinfo /proc/cpuinfo
fi
# containerd's overlay snapshots and kubelet's volumes need a filesystem that is not itself an overlay
for d in /var/lib/containerd /var/lib/kubelet /var/lib/cni /var/log/pods /var/log/containers /etc/cni/net.d; do
  mkdir -p "$d"; mount -t tmpfs tmpfs "$d"
done
mkdir -p "/lib/modules/$RELEASE"
mount --bind "$MODULES" "/lib/modules/$RELEASE"
say "kernel $(uname -r), $(nproc) cpu, $(awk '/MemTotal/ {print $2}' /proc/meminfo) kB"
# Loaded up front: iptables-nft's first TABLE_ADD fails with "Operation not supported" instead of waiting for
# nf_tables to be loaded on demand, and kubelet and kube-proxy only retry every 30 s.
for m in overlay br_netfilter bridge veth nf_conntrack nf_nat nf_tables nft_compat nft_chain_nat \
         xt_conntrack xt_comment xt_mark xt_MASQUERADE xt_addrtype xt_statistic xt_nat xt_tcpudp ipt_REJECT \
         sch_netem sch_htb sch_tbf cls_u32 ifb; do
  modprobe "$m" 2>>"$LOGS/init.log" || say "modprobe $m failed"
done

# no udev here: the network card's driver (QEMU's virtio; UML's is built in) is loaded by hand
modprobe -q virtio_net 2>/dev/null
hostname "$NODE_NAME"
ip link set lo up
link=$(ip -o link show | awk -F': ' '$2 != "lo" {print $2; exit}')
[ "$link" = eth0 ] || ip link set "$link" name eth0
ip addr add "$NODE_IP/$NODE_PREFIX" dev eth0
ip link set eth0 up
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# The clock: stepped to this machine's before anything reads it (it starts from the emulated RTC's whole
# seconds), then kept there, as NTP keeps a real node's (vm.sh, vm_time_server).
mkdir -p -m 0750 /run/chrony
chronyd -q -t 20 -u root "server $NTP_SERVER port $NTP_PORT iburst minpoll -4 maxpoll -4" >>"$LOGS/chronyd.log" 2>&1 ||
  say "chronyd could not set the clock from $NTP_SERVER:$NTP_PORT"
printf 'server %s port %s minpoll 0 maxpoll 4\nmakestep 0.1 -1\n' "$NTP_SERVER" "$NTP_PORT" >/run/chrony.conf

start() { # NAME CMD...
  local name=$1; shift
  setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  echo $! >"/run/$name.pid"
}
start chronyd chronyd -d -u root -f /run/chrony.conf
start containerd containerd --config "$NODE_DIR/containerd.toml"
for _ in $(seq 1 300); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
for f in "$IO"/images/*.tar; do ctr -n k8s.io images import "$f" >/dev/null 2>>"$LOGS/init.log" || say "import $f failed"; done
# Container statistics every minute instead of every 10 s: under emulation each collection costs real CPU that
# the node's traffic timing would feel, and nothing here reads them.
start kubelet "$K8S_BIN/kubelet" --config="$NODE_DIR/kubelet.yaml" --kubeconfig="$NODE_DIR/kubelet.kubeconfig" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --housekeeping-interval=1m --v=1
start kube-proxy "$K8S_BIN/kube-proxy" --config="$NODE_DIR/kube-proxy.yaml" --v=1
say "containerd, kubelet and kube-proxy started"

# Commands from the host (vm_exec): IO/cmd/ID.sh -> ID.out and ID.rc. Children are reaped by this shell.
# The wait between looks is a read that times out on a pipe nobody writes, not a `sleep`: under emulation a
# process started ten times a second kept the node's CPU a third busy when idle, and every probe that arrived
# meanwhile waited for it.
mkfifo /run/vm-exec-idle
exec 9<>/run/vm-exec-idle
while :; do
  for f in "$IO"/cmd/*.sh; do
    [ -e "$f" ] || continue
    id=${f%.sh}
    bash "$f" >"$id.out" 2>&1
    echo $? >"$id.rc.tmp"
    mv "$id.rc.tmp" "$id.rc"
    rm -f "$f"
  done
  read -r -t 0.1 -u 9 _
done
