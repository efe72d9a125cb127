//! Desired state → the tc objects that implement it, in kernel-dump units, with handles from [`super::handles`].
//!
//! The tree on the interface:
//! ```text
//! htb 1570: (default 1)
//! ├── class 1570:1      rate = ceil = 100 Gbit/s            ← catch-all filter (protocol all, lowest priority)
//! └── class 1570:1000+s rate = ceil = 100 Gbit/s            ← u32 filter on the destination address
//!     └── tbf 2000+s:   (with a rate; with netem below it, a peak bucket of one frame; without a rate but
//!         │                with netem, 100 Gbit/s and a bucket of one frame: it cuts GSO packets into frames)
//!         └── netem 3000+s:  (only when the impairment needs netem; parent 2000+s:1)
//! ```
//! Classification: host destinations (/32, /128) sit in one u32 hash table per family, bucketed on the last
//! address byte, so a packet visits one bucket instead of every filter. CIDR destinations are linear u32
//! entries, one filter priority per prefix length, longest first, all after the host tables: a host entry wins
//! over a covering CIDR and a longer prefix over a shorter one.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use isthmus_agent_api::Impairment;

use super::desired::DesiredState;
use super::handles::{self, DEFAULT_CLASS, IPV4_HASH_TABLE, IPV6_HASH_TABLE, ROOT_QDISC, Slot};
use super::model::*;
use super::psched::PSCHED_SHIFT;
use super::queue::QueueBound;
use super::units::{netem_for, tbf_buffer_ticks, tbf_for};

/// Ceiling for classes that must not limit: far above any NIC or veth (a 10 Gbit/s ceiling was measured to
/// cut a veth's unimpaired TCP to a quarter).
pub const UNLIMITED_BYTES_PER_SEC: u64 = 100_000_000_000 / 8;
/// HTB class bucket: 1 ms at the class rate (psched ticks are 64 ns).
pub const HTB_BUFFER_TICKS: u32 = 1_000_000 >> PSCHED_SHIFT;
/// Explicit HTB quantum, so the kernel never derives one from the huge rate (and never warns about it).
pub const HTB_QUANTUM: u32 = 65_536;
pub const HTB_RATE2QUANTUM: u32 = 10;
pub const HTB_DIRECT_QLEN: u32 = 1000;

pub const HOST_V4_PRIORITY: u16 = 1;
pub const HOST_V6_PRIORITY: u16 = 2;
/// CIDR filters: priority base + (address bits − prefix length), so longer prefixes come first.
pub const CIDR_V4_PRIORITY_BASE: u16 = 0x100;
pub const CIDR_V6_PRIORITY_BASE: u16 = 0x200;
pub const CATCH_ALL_PRIORITY: u16 = 0xffff;
/// Node id of the link (v4/v6 tables) and of the catch-all entry, each alone in its filter priority's root table.
pub const LINK_NODE: u32 = 1;

const IPV4_DST_OFFSET: i32 = 16;
const IPV6_DST_OFFSET: i32 = 24;

/// The objects implementing `desired` with `slots` (one per destination), parents before children.
pub fn build(desired: &DesiredState, slots: &BTreeMap<IpNet, Slot>) -> Vec<TcObject> {
    if desired.is_empty() {
        return Vec::new();
    }
    let mut by_slot: Vec<(Slot, IpNet, &Impairment)> = desired.destinations().map(|(d, i)| (slots[d], *d, i)).collect();
    by_slot.sort_by_key(|(s, _, _)| *s);
    let mut objects = root();
    for &(slot, _, impairment) in &by_slot {
        destination_chain(&mut objects, slot, impairment, desired.queue_bound());
    }
    let hosts = |is_host: fn(&IpNet) -> bool| -> Vec<(Slot, IpNet)> {
        by_slot.iter().filter(|(_, d, _)| is_host(d)).map(|&(slot, d, _)| (slot, d)).collect()
    };
    let v4_hosts = hosts(|d| matches!(d, IpNet::V4(n) if n.prefix_len() == 32));
    let v6_hosts = hosts(|d| matches!(d, IpNet::V6(n) if n.prefix_len() == 128));
    host_table(&mut objects, &v4_hosts, HostTable::V4);
    host_table(&mut objects, &v6_hosts, HostTable::V6);
    cidr_filters(&mut objects, &by_slot);
    objects.push(root_filter(CATCH_ALL_PRIORITY, ETH_P_ALL, catch_all()));
    objects
}

/// The HTB root and its default class.
fn root() -> Vec<TcObject> {
    let htb = HtbQdisc {
        default_class: u32::from(handles::DEFAULT_CLASS_MINOR),
        rate2quantum: HTB_RATE2QUANTUM,
        direct_qlen: HTB_DIRECT_QLEN,
    };
    vec![
        TcObject::Qdisc(Qdisc { handle: ROOT_QDISC, parent: Handle::ROOT, kind: QdiscKind::Htb(htb) }),
        TcObject::Class(unlimited_class(DEFAULT_CLASS)),
    ]
}

/// A destination's class, its TBF when it has a rate, its netem when it needs one; their queues held to `bound`.
fn destination_chain(objects: &mut Vec<TcObject>, slot: Slot, impairment: &Impairment, bound: QueueBound) {
    let imp = impairment.fields();
    objects.push(TcObject::Class(unlimited_class(slot.class())));
    let mut netem_parent = slot.class();
    // netem counts packets: a TBF ahead of it whose largest packet is a frame cuts GSO packets (up to 64 KiB
    // each) into frames first (`tbf_segment`), so that netem's limit bounds bytes (queue.rs).
    let tbf = match (tbf_for(imp, bound), imp.needs_netem()) {
        (Some(tbf), true) => Some(Tbf { peak: Some(frame_peak(tbf.rate_bytes_per_sec, bound.frame())), ..tbf }),
        (None, true) => Some(segmenting_tbf(bound)),
        (tbf, false) => tbf,
    };
    if let Some(tbf) = tbf {
        objects.push(TcObject::Qdisc(Qdisc { handle: slot.tbf(), parent: slot.class(), kind: QdiscKind::Tbf(tbf) }));
        netem_parent = slot.tbf_inner();
    }
    if imp.needs_netem() {
        let netem = QdiscKind::Netem(netem_for(imp, bound));
        objects.push(TcObject::Qdisc(Qdisc { handle: slot.netem(), parent: netem_parent, kind: netem }));
    }
}

/// The TBF ahead of a netem on a link without a rate: unlimited, its bucket one frame, so that its largest
/// packet is a frame.
pub fn segmenting_tbf(bound: QueueBound) -> Tbf {
    Tbf {
        rate_bytes_per_sec: UNLIMITED_BYTES_PER_SEC,
        buffer_ticks: frame_ticks(UNLIMITED_BYTES_PER_SEC, bound.frame()),
        limit_bytes: bound.bytes().min(u64::from(u32::MAX)) as u32,
        peak: None,
    }
}

/// Whether `tbf` is [`segmenting_tbf`]'s: no rate of the link's (a link's own bucket is at least 1,600 bytes, more
/// than one tick at this rate holds).
pub fn is_segmenting(tbf: &Tbf, bound: QueueBound) -> bool {
    tbf.peak.is_none()
        && tbf.rate_bytes_per_sec == UNLIMITED_BYTES_PER_SEC
        && tbf.buffer_ticks == frame_ticks(UNLIMITED_BYTES_PER_SEC, bound.frame())
}

/// A peak bucket of one frame that caps the largest packet of a rate's TBF at a frame, at a peak rate no
/// shaping notices: [`UNLIMITED_BYTES_PER_SEC`], or twice the rate above half of it (the kernel wants the peak
/// above the rate).
pub fn frame_peak(rate_bytes_per_sec: u64, frame: u64) -> TbfPeak {
    let rate = UNLIMITED_BYTES_PER_SEC.max(rate_bytes_per_sec.saturating_mul(2));
    TbfPeak { rate_bytes_per_sec: rate, mtu_ticks: frame_ticks(rate, frame) }
}

/// The ticks of a bucket of one frame at `rate`: the kernel's largest packet is the largest byte count with
/// these ticks (`tbf_burst_for_ticks`), at least the frame.
fn frame_ticks(rate_bytes_per_sec: u64, frame: u64) -> u32 {
    u32::try_from(tbf_buffer_ticks(rate_bytes_per_sec, frame)).unwrap_or(u32::MAX)
}

/// One address family's host destinations: its hash table and the filter priority and offsets it uses.
#[derive(Clone, Copy)]
enum HostTable {
    V4,
    V6,
}

impl HostTable {
    /// (table, filter priority, protocol, offset of the destination address's last word).
    fn parameters(self) -> (u32, u16, u16, i32) {
        match self {
            HostTable::V4 => (IPV4_HASH_TABLE, HOST_V4_PRIORITY, ETH_P_IP, IPV4_DST_OFFSET),
            HostTable::V6 => (IPV6_HASH_TABLE, HOST_V6_PRIORITY, ETH_P_IPV6, IPV6_DST_OFFSET + 12),
        }
    }
}

/// The family's hash table, an entry per host in the bucket of its last address byte, and the link from the
/// priority's root table into the hash table.
fn host_table(objects: &mut Vec<TcObject>, hosts: &[(Slot, IpNet)], family: HostTable) {
    if hosts.is_empty() {
        return;
    }
    let (table, priority, protocol, hash_offset) = family.parameters();
    let filter = |u32f| root_filter(priority, protocol, u32f);
    objects.push(filter(U32Filter {
        handle: table << 20,
        divisor: Some(256),
        link: None,
        hash_table: None,
        selector: None,
        class_id: None,
    }));
    for (slot, dst) in hosts {
        let bucket = u32::from(last_byte(dst.addr()));
        let bucket_id = (table << 20) | (bucket << 12);
        objects.push(filter(U32Filter {
            handle: bucket_id | slot.u32_node(),
            hash_table: Some(bucket_id),
            ..entry(*slot, *dst)
        }));
    }
    objects.push(filter(U32Filter {
        handle: LINK_NODE,
        divisor: None,
        link: Some(table << 20),
        hash_table: None,
        selector: Some(U32Selector {
            terminal: false,
            hash_mask: 0xff,
            hash_offset: hash_offset as i16,
            keys: vec![U32Key { mask: 0, value: 0, offset: hash_offset }],
        }),
        class_id: None,
    }));
}

/// The CIDR destinations: linear entries, one filter priority per prefix length, longest first.
fn cidr_filters(objects: &mut Vec<TcObject>, by_slot: &[(Slot, IpNet, &Impairment)]) {
    let mut cidrs: Vec<(u16, u16, Slot, IpNet)> = by_slot
        .iter()
        .filter(|(_, d, _)| d.prefix_len() < d.max_prefix_len())
        .map(|&(slot, dst, _)| {
            let (base, protocol) = match dst {
                IpNet::V4(_) => (CIDR_V4_PRIORITY_BASE, ETH_P_IP),
                IpNet::V6(_) => (CIDR_V6_PRIORITY_BASE, ETH_P_IPV6),
            };
            let priority = base + u16::from(dst.max_prefix_len() - dst.prefix_len());
            (priority, protocol, slot, dst)
        })
        .collect();
    cidrs.sort_by_key(|&(priority, _, slot, _)| (priority, slot));
    for (priority, protocol, slot, dst) in cidrs {
        objects.push(root_filter(priority, protocol, entry(slot, dst)));
    }
}

/// The entry that sends packets to `dst` into the slot's class (node id = slot; the table is the caller's).
fn entry(slot: Slot, dst: IpNet) -> U32Filter {
    U32Filter {
        handle: slot.u32_node(),
        divisor: None,
        link: None,
        hash_table: None,
        selector: Some(U32Selector { terminal: true, hash_mask: 0, hash_offset: 0, keys: match_keys(dst) }),
        class_id: Some(slot.class()),
    }
}

/// Everything no destination claims (ARP, ND, other destinations) goes to the default class.
fn catch_all() -> U32Filter {
    U32Filter {
        handle: LINK_NODE,
        divisor: None,
        link: None,
        hash_table: None,
        selector: Some(U32Selector {
            terminal: true,
            hash_mask: 0,
            hash_offset: 0,
            keys: vec![U32Key { mask: 0, value: 0, offset: 0 }],
        }),
        class_id: Some(DEFAULT_CLASS),
    }
}

fn root_filter(priority: u16, protocol: u16, filter: U32Filter) -> TcObject {
    TcObject::Filter(Filter { parent: ROOT_QDISC, priority, protocol, kind: FilterKind::U32(filter) })
}

fn unlimited_class(handle: Handle) -> Class {
    Class {
        handle,
        // Top-level HTB classes dump with parent TC_H_ROOT.
        parent: Handle::ROOT,
        kind: ClassKind::Htb(HtbClass {
            rate_bytes_per_sec: UNLIMITED_BYTES_PER_SEC,
            ceil_bytes_per_sec: UNLIMITED_BYTES_PER_SEC,
            buffer_ticks: HTB_BUFFER_TICKS,
            cbuffer_ticks: HTB_BUFFER_TICKS,
            quantum: HTB_QUANTUM,
            prio: 0,
        }),
    }
}

fn last_byte(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    }
}

/// u32 keys matching the destination address against `dst` (host or prefix).
pub fn match_keys(dst: IpNet) -> Vec<U32Key> {
    match dst {
        IpNet::V4(n) => {
            vec![U32Key { mask: u32::from(n.netmask()), value: u32::from(n.network()), offset: IPV4_DST_OFFSET }]
        }
        IpNet::V6(n) => {
            let mask = u128::from(n.netmask());
            let value = u128::from(n.network());
            let keys: Vec<U32Key> = (0..4)
                .map(|word| {
                    let shift = 96 - 32 * word;
                    U32Key {
                        mask: (mask >> shift) as u32,
                        value: (value >> shift) as u32,
                        offset: IPV6_DST_OFFSET + 4 * word,
                    }
                })
                .filter(|k| k.mask != 0)
                .collect();
            if keys.is_empty() { vec![U32Key { mask: 0, value: 0, offset: IPV6_DST_OFFSET }] } else { keys }
        }
    }
}

/// The destination a u32 entry matches, if its keys are ones [`match_keys`] writes.
pub fn destination_of_keys(protocol: u16, keys: &[U32Key]) -> Option<IpNet> {
    match protocol {
        ETH_P_IP => match keys {
            [k] if k.offset == IPV4_DST_OFFSET && k.value & !k.mask == 0 => {
                let len = k.mask.leading_ones() as u8;
                (k.mask.checked_shl(u32::from(len)).unwrap_or(0) == 0)
                    .then(|| Ipv4Net::new(Ipv4Addr::from(k.value), len).ok().map(IpNet::V4))
                    .flatten()
            }
            _ => None,
        },
        ETH_P_IPV6 => {
            let (mut mask, mut value) = (0u128, 0u128);
            for k in keys {
                let word = (k.offset - IPV6_DST_OFFSET) / 4;
                if !(0..4).contains(&word) || (k.offset - IPV6_DST_OFFSET) % 4 != 0 {
                    return None;
                }
                let shift = 96 - 32 * word as u32;
                mask |= u128::from(k.mask) << shift;
                value |= u128::from(k.value) << shift;
            }
            let len = mask.leading_ones() as u8;
            let net = Ipv6Net::new(Ipv6Addr::from(value), len).ok()?;
            (u128::from(net.netmask()) == mask && value & !mask == 0).then_some(IpNet::V6(net))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use isthmus_agent_api::ImpairmentFields;
    use isthmus_agent_api::test_util::impairment;
    use proptest::prelude::*;

    use crate::datapath::QueueBudget;
    use crate::datapath::psched;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ms(v: u64) -> Option<Duration> {
        Some(Duration::from_millis(v))
    }
    fn state(entries: &[(&str, ImpairmentFields)]) -> DesiredState {
        DesiredState::new(entries.iter().map(|(d, i)| (net(d), impairment(i.clone())))).unwrap()
    }
    fn slots_for(d: &DesiredState) -> BTreeMap<IpNet, Slot> {
        handles::assign_slots(d.destinations().map(|(n, _)| n), &BTreeMap::new()).unwrap()
    }

    #[test]
    fn tree_has_root_default_class_and_per_destination_chain_in_add_order() {
        let d = state(&[
            ("10.0.0.1/32", ImpairmentFields { rate_bps: Some(10_000_000), latency: ms(20), ..Default::default() }),
            ("10.0.0.2/32", ImpairmentFields { rate_bps: Some(5_000_000), ..Default::default() }),
            ("fd00::5/128", ImpairmentFields { latency: ms(1), ..Default::default() }),
            ("10.1.0.0/16", ImpairmentFields { latency: ms(2), ..Default::default() }),
        ]);
        let slots = slots_for(&d);
        let objects = build(&d, &slots);
        let s1 = slots[&net("10.0.0.1/32")];
        let s2 = slots[&net("10.0.0.2/32")];
        let s6 = slots[&net("fd00::5/128")];

        let qdiscs: Vec<(Handle, Handle, &str)> = objects
            .iter()
            .filter_map(|o| match o {
                TcObject::Qdisc(q) => Some((
                    q.handle,
                    q.parent,
                    match q.kind {
                        QdiscKind::Htb(_) => "htb",
                        QdiscKind::Tbf(_) => "tbf",
                        QdiscKind::Netem(_) => "netem",
                        QdiscKind::Foreign(_) => "?",
                    },
                )),
                _ => None,
            })
            .collect();
        assert!(qdiscs.contains(&(ROOT_QDISC, Handle::ROOT, "htb")));
        assert!(qdiscs.contains(&(s1.tbf(), s1.class(), "tbf")));
        assert!(qdiscs.contains(&(s1.netem(), s1.tbf_inner(), "netem")));
        assert!(qdiscs.contains(&(s2.tbf(), s2.class(), "tbf")));
        assert!(!qdiscs.iter().any(|q| q.0 == s2.netem()), "rate-only needs no netem");
        assert!(qdiscs.contains(&(s6.tbf(), s6.class(), "tbf")), "a TBF cuts GSO packets ahead of netem");
        assert!(qdiscs.contains(&(s6.netem(), s6.tbf_inner(), "netem")));
        let tbf_of = |s: Slot| {
            objects.iter().find_map(|o| match o {
                TcObject::Qdisc(Qdisc { handle, kind: QdiscKind::Tbf(t), .. }) if *handle == s.tbf() => Some(t.clone()),
                _ => None,
            })
        };
        let bound = d.queue_bound();
        assert!(tbf_of(s1).unwrap().peak.is_some(), "a rate's TBF ahead of netem gets a peak bucket of one frame");
        assert!(tbf_of(s2).unwrap().peak.is_none(), "without netem a TBF's queue counts bytes");
        assert!(is_segmenting(&tbf_of(s6).unwrap(), bound));
        assert!(!is_segmenting(&tbf_of(s1).unwrap(), bound) && !is_segmenting(&tbf_of(s2).unwrap(), bound));

        // Every parent appears before its child.
        let position = |h: Handle| {
            objects.iter().position(|o| match o {
                TcObject::Qdisc(q) => {
                    q.handle == h || (h.minor() != 0 && q.handle == Handle::new(h.major(), 0) && q.handle != ROOT_QDISC)
                }
                TcObject::Class(c) => c.handle == h,
                _ => false,
            })
        };
        for (i, o) in objects.iter().enumerate() {
            let parent = match o {
                TcObject::Qdisc(q) => q.parent,
                TcObject::Class(_) => ROOT_QDISC,
                TcObject::Filter(f) => f.parent,
            };
            if parent != Handle::ROOT {
                assert!(position(parent).unwrap() < i, "{o:?} before its parent");
            }
        }
        assert!(
            matches!(objects.last(), Some(TcObject::Filter(f)) if f.priority == CATCH_ALL_PRIORITY && f.protocol == ETH_P_ALL)
        );
    }

    proptest! {
        /// The largest packet the kernel lets through a TBF ahead of netem (its bucket's byte count, or the
        /// peak's when smaller: `tbf_change`) holds a frame and at most one tick of the rate more (800 bytes at
        /// 100 Gbit/s), so full frames pass whole and GSO packets are cut into frames.
        #[test]
        fn the_tbf_ahead_of_netem_passes_one_frame_and_cuts_the_rest(
            mtu in 576u32..=9216,
            rate_bps in prop::option::of(100u64..=1_000_000_000_000),
        ) {
            let bound = QueueBudget::DEFAULT.bound(1).with_mtu(mtu);
            let frame = bound.frame();
            let (rate, ticks) = match rate_bps {
                None => {
                    let t = segmenting_tbf(bound);
                    (t.rate_bytes_per_sec, t.buffer_ticks)
                }
                Some(bps) => {
                    let rate = (bps / 8).max(1);
                    let peak = frame_peak(rate, frame);
                    prop_assert!(peak.rate_bytes_per_sec > rate, "the kernel refuses a peak not above the rate");
                    (peak.rate_bytes_per_sec, peak.mtu_ticks)
                }
            };
            let largest = u64::from(psched::tbf_burst_for_ticks(rate, ticks).unwrap());
            let tick = (u128::from(rate) * 64).div_ceil(1_000_000_000) as u64;
            prop_assert!(largest >= frame, "a full frame of {frame} bytes would be dropped: largest {largest}");
            prop_assert!(largest <= frame + tick, "{largest} bytes pass whole: more than a frame ({frame}) and a tick ({tick})");
        }
    }

    #[test]
    fn host_filters_are_hashed_on_the_last_byte_and_cidrs_come_after_longest_first() {
        let d = state(&[
            ("10.0.0.7/32", ImpairmentFields::default()),
            ("10.0.0.0/24", ImpairmentFields::default()),
            ("10.0.0.0/8", ImpairmentFields::default()),
            ("fd00::1:2ff/128", ImpairmentFields::default()),
        ]);
        let slots = slots_for(&d);
        let objects = build(&d, &slots);
        let filters: Vec<&Filter> =
            objects.iter().filter_map(|o| if let TcObject::Filter(f) = o { Some(f) } else { None }).collect();
        let entry = |dst: &str| {
            filters
                .iter()
                .find(|f| matches!(&f.kind, FilterKind::U32(u) if u.class_id == Some(slots[&net(dst)].class())))
                .unwrap()
        };
        let host = entry("10.0.0.7/32");
        let FilterKind::U32(u) = &host.kind else { unreachable!() };
        assert_eq!(host.priority, HOST_V4_PRIORITY);
        assert_eq!(u.hash_table, Some((IPV4_HASH_TABLE << 20) | (7 << 12)));
        assert_eq!(u.selector.as_ref().unwrap().keys, vec![U32Key { mask: !0, value: 0x0a00_0007, offset: 16 }]);
        let v6 = entry("fd00::1:2ff/128");
        let FilterKind::U32(u6) = &v6.kind else { unreachable!() };
        assert_eq!(u6.hash_table, Some((IPV6_HASH_TABLE << 20) | (0xff << 12)));
        assert_eq!(u6.selector.as_ref().unwrap().keys.len(), 4);
        assert_eq!(destination_of_keys(ETH_P_IPV6, &u6.selector.as_ref().unwrap().keys), Some(net("fd00::1:2ff/128")));

        let (p24, p8) = (entry("10.0.0.0/24").priority, entry("10.0.0.0/8").priority);
        assert!(HOST_V4_PRIORITY < p24 && p24 < p8 && p8 < CATCH_ALL_PRIORITY, "host < /24 < /8 < catch-all");
        let links: Vec<_> =
            filters.iter().filter(|f| matches!(&f.kind, FilterKind::U32(u) if u.link.is_some())).collect();
        assert_eq!(links.len(), 2);
        for l in links {
            let FilterKind::U32(u) = &l.kind else { unreachable!() };
            let sel = u.selector.as_ref().unwrap();
            assert_eq!(sel.hash_mask, 0xff);
            assert_eq!(i32::from(sel.hash_offset), if l.protocol == ETH_P_IP { 16 } else { 36 });
            assert!(!sel.terminal);
        }
    }

    #[test]
    fn match_keys_round_trip_for_hosts_and_prefixes() {
        for s in [
            "10.1.2.3/32",
            "10.1.0.0/16",
            "0.0.0.0/0",
            "fd00::/8",
            "2001:db8::1/128",
            "::/0",
            "2001:db8:1:2::/64",
            "2001:db8::/33",
        ] {
            let n = net(s);
            let proto = if n.addr().is_ipv4() { ETH_P_IP } else { ETH_P_IPV6 };
            assert_eq!(destination_of_keys(proto, &match_keys(n)), Some(n), "{s}");
        }
    }
}
