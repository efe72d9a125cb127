#!/usr/bin/env bash
# Regenerates the golden netlink requests in this directory from iproute2's `tc`.
# Needs root, strace and iproute2. Each case runs `tc` under strace in a throwaway network namespace with a
# veth and records the bytes of its sendmsg as one hex line: `<name> <hex>` in requests.txt.
# Requests the running kernel rejects (netem on a kernel without sch_netem) are still captured: tc prints the
# request before the kernel answers. The namespace is deleted on exit, also on failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ns="isth-golden-$$"
out="$here/requests.txt"
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip -n "$ns" link add v0 type veth peer name v1
ip -n "$ns" link set v0 up
ip -n "$ns" link set v1 up

capture() { # name, tc arguments...
    local name="$1"; shift
    local hex
    # `-e write=3` hex-dumps every buffer sent on the netlink socket; keep the last sendmsg (the tc request).
    hex="$(ip netns exec "$ns" strace -e trace=sendmsg -e write=3 tc "$@" 2>&1 >/dev/null |
        sed -n -e '/^sendmsg(/s/.*/--/p' -e 's/^ | [0-9a-f]\{5\}  \(.\{48\}\).*/\1/p' |
        tr -d ' ' | tr '\n' ' ' | sed -e 's/.*--//' -e 's/ //g')" || true
    [ -n "$hex" ] || { echo "no sendmsg captured for $name" >&2; exit 1; }
    echo "$name $hex" >>"$out.tmp"
}

rm -f "$out.tmp"
{ echo "# iproute2: $(tc -V)"; echo "# kernel: $(uname -r); psched: $(cat /proc/net/psched)"; } >"$out.tmp"
capture htb_qdisc_add qdisc add dev v0 root handle 1: htb default 0xffff r2q 10 direct_qlen 1000
capture htb_class_add_1g class add dev v0 parent 1: classid 1:10 htb rate 1gbit ceil 1gbit burst 15k cburst 15k quantum 1514 prio 0
capture htb_class_add_40g class add dev v0 parent 1: classid 1:11 htb rate 40gbit ceil 50gbit burst 1m cburst 1m quantum 200000 prio 1
capture htb_class_change class change dev v0 parent 1: classid 1:10 htb rate 100mbit ceil 1gbit burst 15k cburst 15k quantum 1514 prio 0
capture tbf_add_100m qdisc add dev v0 parent 1:10 handle 10: tbf rate 100mbit burst 32k limit 100000
capture tbf_add_40g qdisc add dev v0 parent 1:11 handle 11: tbf rate 40gbit burst 1m limit 1000000
capture tbf_change qdisc change dev v0 parent 1:10 handle 10: tbf rate 200mbit burst 32k limit 100000
capture tbf_add_peak qdisc add dev v0 parent 1:10 handle 10: tbf rate 100mbit burst 32k limit 100000 peakrate 100gbit mtu 1599
capture netem_delay_jitter_corr qdisc add dev v0 parent 10:1 handle 20: netem delay 50ms 5ms 25% limit 1000
capture netem_loss_random qdisc add dev v0 parent 10:1 handle 20: netem loss random 1% 30% limit 1000
capture netem_loss_gemodel qdisc add dev v0 parent 10:1 handle 20: netem loss gemodel 1% 10% 70% 0.1% limit 1000
capture netem_duplicate qdisc add dev v0 parent 10:1 handle 20: netem duplicate 2% 10% limit 1000
capture netem_corrupt qdisc add dev v0 parent 10:1 handle 20: netem corrupt 0.5% 5% limit 1000
capture netem_reorder_gap qdisc add dev v0 parent 10:1 handle 20: netem delay 10ms reorder 25% 50% gap 5 limit 1000
capture netem_limit qdisc add dev v0 parent 10:1 handle 20: netem limit 5000
capture netem_change qdisc change dev v0 parent 10:1 handle 20: netem delay 20ms limit 1000
capture u32_hash_table filter add dev v0 parent 1: prio 1 handle 2: protocol ip u32 divisor 256
capture u32_link_hashkey filter add dev v0 parent 1: prio 1 handle 800::1 protocol ip u32 link 2: hashkey mask 0x000000ff at 16 match u32 0 0
capture u32_v4_host filter add dev v0 parent 1: prio 1 handle 2:1:1 protocol ip u32 ht 2:1: match ip dst 10.0.0.1/32 flowid 1:10
capture u32_v4_cidr filter add dev v0 parent 1: prio 1 handle 800::2 protocol ip u32 ht 800:: match ip dst 10.1.0.0/16 flowid 1:11
capture u32_v6_host filter add dev v0 parent 1: prio 2 handle 800::1 protocol ipv6 u32 ht 800:: match ip6 dst 2001:db8::1/128 flowid 1:12
capture u32_v6_cidr filter add dev v0 parent 1: prio 2 handle 800::2 protocol ipv6 u32 ht 800:: match ip6 dst 2001:db8:1::/48 flowid 1:13
capture u32_catch_all filter add dev v0 parent 1: prio 3 handle 800::1 protocol all u32 match u32 0 0 flowid 1:ffff
capture qdisc_delete qdisc del dev v0 parent 1:10 handle 10:
capture class_delete class del dev v0 parent 1: classid 1:10
capture filter_delete filter del dev v0 parent 1: prio 1 handle 2:1:1 protocol ip u32
mv "$out.tmp" "$out"
echo "wrote $(grep -vc '^#' "$out") requests to $out"
