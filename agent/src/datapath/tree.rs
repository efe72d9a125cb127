//! Desired state → the tc objects that implement it, in kernel-dump units, with handles from [`super::handles`].
//!
//! The tree on the interface:
//! ```text
//! htb 1570: (default 1)
//! ├── class 1570:1      rate = ceil = 100 Gbit/s            ← catch-all filter (protocol all, lowest priority)
//! └── class 1570:1000+s rate = ceil = 100 Gbit/s            ← u32 filter on the destination address
//!     └── tbf 2000+s:   (only with a rate)
//!         └── netem 3000+s:  (only when the impairment needs netem; parent 2000+s:1 or the class)
//! ```
//! Classification: host destinations (/32, /128) sit in one u32 hash table per family, bucketed on the last
//! address byte, so a packet visits one bucket instead of every filter. CIDR destinations are linear u32
//! entries, one filter priority per prefix length, longest first, all after the host tables: a host entry wins
//! over a covering CIDR and a longer prefix over a shorter one.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use isthmus_agent_api::{Correlated, Impairment, ImpairmentError, ImpairmentFields, Loss, Percent, Reorder};

use super::error::DatapathError;
use super::handles::{self, DEFAULT_CLASS, IPV4_HASH_TABLE, IPV6_HASH_TABLE, MAX_DESTINATIONS, ROOT_QDISC, Slot};
use super::model::*;
use super::netlink::psched::{self, PSCHED_SHIFT};

/// Ceiling for classes that must not limit: far above any NIC or veth (a 10 Gbit/s ceiling was measured to
/// cut a veth's unimpaired TCP to a quarter).
pub const UNLIMITED_BYTES_PER_SEC: u64 = 100_000_000_000 / 8;
/// HTB class bucket: 1 ms at the class rate (psched ticks are 64 ns).
pub const HTB_BUFFER_TICKS: u32 = 1_000_000 >> PSCHED_SHIFT;
/// Explicit HTB quantum, so the kernel never derives one from the huge rate (and never warns about it).
pub const HTB_QUANTUM: u32 = 65_536;
pub const HTB_RATE2QUANTUM: u32 = 10;
pub const HTB_DIRECT_QLEN: u32 = 1000;

/// Default TBF bucket: what the rate delivers in this time, but never less than [`MIN_BURST_BYTES`].
pub const DEFAULT_BURST_TIME: Duration = Duration::from_millis(5);
pub const MIN_BURST_BYTES: u64 = 3200;
/// TBF's own queue (rate-only destinations): the bucket plus this much time at the rate.
pub const DEFAULT_TBF_QUEUE_TIME: Duration = Duration::from_millis(100);
/// Frame size used to turn bytes into packet counts (Ethernet MTU + header).
pub const FRAME_BYTES: u64 = 1514;
/// netem's queue never goes below the kernel's and tc's default.
pub const MIN_NETEM_LIMIT: u64 = 1000;
/// For netem without a rate, the queue is sized as if the link ran at this speed.
pub const ASSUMED_LINE_BYTES_PER_SEC: u64 = 10_000_000_000 / 8;

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

/// Desired state for one interface: destinations (host addresses or CIDRs, IPv4 and IPv6) → impairment, sorted
/// by destination. Impairments are shared (`Arc`): a node's plan holds many destinations with the same one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DesiredState {
    destinations: Vec<(IpNet, Arc<Impairment>)>,
}

impl DesiredState {
    /// Rejects duplicate destinations (after masking host bits), impairments beyond the kernel's fields and more
    /// destinations than the handle space allows; errors name the destination and field. The impairments
    /// themselves are valid by their type.
    pub fn new<I: Into<Arc<Impairment>>>(
        destinations: impl IntoIterator<Item = (IpNet, I)>,
    ) -> Result<Self, DatapathError> {
        let mut map = BTreeMap::new();
        for (dst, impairment) in destinations {
            let net = dst.trunc();
            let impairment = impairment.into();
            check_representable(net, impairment.fields())?;
            if map.insert(net, impairment).is_some() {
                return Err(DatapathError::invalid(
                    Some(net),
                    "destination",
                    if net == dst { "listed twice".to_owned() } else { format!("{dst} duplicates another entry") },
                ));
            }
            if map.len() > MAX_DESTINATIONS {
                return Err(DatapathError::invalid(
                    None,
                    "destinations",
                    format!("more than {MAX_DESTINATIONS} destinations on one interface"),
                ));
            }
        }
        Ok(DesiredState { destinations: map.into_iter().collect() })
    }

    pub fn empty() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.destinations.is_empty()
    }

    pub fn len(&self) -> usize {
        self.destinations.len()
    }

    pub fn destinations(&self) -> impl Iterator<Item = (&IpNet, &Impairment)> {
        self.destinations.iter().map(|(destination, impairment)| (destination, impairment.as_ref()))
    }

    pub fn get(&self, destination: &IpNet) -> Option<&Impairment> {
        let index = self.destinations.binary_search_by(|(d, _)| d.cmp(destination)).ok()?;
        Some(&self.destinations[index].1)
    }
}

/// Limits of the kernel's fields that an [`Impairment`]'s own checks do not know about.
fn check_representable(dst: IpNet, imp: &ImpairmentFields) -> Result<(), DatapathError> {
    // The kernel keeps TBF's bucket as 32-bit psched ticks (at most 275 s of sending at the rate).
    if let Some(rate) = imp.rate_bps
        && tbf_buffer_ticks((rate / 8).max(1), burst_bytes(imp)) > u64::from(u32::MAX)
    {
        let burst = burst_bytes(imp);
        let field = if imp.burst_bytes.is_some() { "burst" } else { "rate" };
        return Err(DatapathError::invalid(
            Some(dst),
            field,
            format!("{burst} bytes of burst take longer than the kernel's 275 s bucket limit to send at {rate} bit/s"),
        ));
    }
    Ok(())
}

/// The objects implementing `desired` with `slots` (one per destination), parents before children.
pub fn build(desired: &DesiredState, slots: &BTreeMap<IpNet, Slot>) -> Vec<TcObject> {
    if desired.is_empty() {
        return Vec::new();
    }
    let mut objects = vec![
        TcObject::Qdisc(Qdisc {
            handle: ROOT_QDISC,
            parent: Handle::ROOT,
            kind: QdiscKind::Htb(HtbQdisc {
                default_class: u32::from(handles::DEFAULT_CLASS_MINOR),
                rate2quantum: HTB_RATE2QUANTUM,
                direct_qlen: HTB_DIRECT_QLEN,
            }),
        }),
        TcObject::Class(unlimited_class(DEFAULT_CLASS)),
    ];
    let mut by_slot: Vec<(Slot, &IpNet, &Impairment)> = desired.destinations().map(|(d, i)| (slots[d], d, i)).collect();
    by_slot.sort_by_key(|(s, _, _)| *s);

    for &(slot, _, imp) in &by_slot {
        let imp = imp.fields();
        objects.push(TcObject::Class(unlimited_class(slot.class())));
        let mut netem_parent = slot.class();
        if let Some(tbf) = tbf_for(imp) {
            objects.push(TcObject::Qdisc(Qdisc {
                handle: slot.tbf(),
                parent: slot.class(),
                kind: QdiscKind::Tbf(tbf),
            }));
            netem_parent = slot.tbf_inner();
        }
        if imp.needs_netem() {
            objects.push(TcObject::Qdisc(Qdisc {
                handle: slot.netem(),
                parent: netem_parent,
                kind: QdiscKind::Netem(netem_for(imp)),
            }));
        }
    }

    let hosts_v4: Vec<_> =
        by_slot.iter().filter(|(_, d, _)| matches!(d, IpNet::V4(n) if n.prefix_len() == 32)).collect();
    let hosts_v6: Vec<_> =
        by_slot.iter().filter(|(_, d, _)| matches!(d, IpNet::V6(n) if n.prefix_len() == 128)).collect();
    for (family_hosts, table, priority, protocol, hash_offset) in [
        (&hosts_v4, IPV4_HASH_TABLE, HOST_V4_PRIORITY, ETH_P_IP, IPV4_DST_OFFSET),
        (&hosts_v6, IPV6_HASH_TABLE, HOST_V6_PRIORITY, ETH_P_IPV6, IPV6_DST_OFFSET + 12),
    ] {
        if family_hosts.is_empty() {
            continue;
        }
        let filter =
            |u32f| TcObject::Filter(Filter { parent: ROOT_QDISC, priority, protocol, kind: FilterKind::U32(u32f) });
        objects.push(filter(U32Filter {
            handle: table << 20,
            divisor: Some(256),
            link: None,
            hash_table: None,
            selector: None,
            class_id: None,
        }));
        for (slot, dst, _) in family_hosts.iter() {
            let bucket = u32::from(last_byte(dst.addr()));
            let bucket_id = (table << 20) | (bucket << 12);
            objects.push(filter(U32Filter {
                handle: bucket_id | slot.u32_node(),
                divisor: None,
                link: None,
                hash_table: Some(bucket_id),
                selector: Some(U32Selector { terminal: true, hash_mask: 0, hash_offset: 0, keys: match_keys(**dst) }),
                class_id: Some(slot.class()),
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

    let mut cidrs: Vec<_> = by_slot
        .iter()
        .filter(|(_, d, _)| d.prefix_len() < d.max_prefix_len())
        .map(|(slot, dst, _)| {
            let (base, protocol) = match dst {
                IpNet::V4(_) => (CIDR_V4_PRIORITY_BASE, ETH_P_IP),
                IpNet::V6(_) => (CIDR_V6_PRIORITY_BASE, ETH_P_IPV6),
            };
            let priority = base + u16::from(dst.max_prefix_len() - dst.prefix_len());
            (priority, protocol, *slot, **dst)
        })
        .collect();
    cidrs.sort_by_key(|&(priority, _, slot, _)| (priority, slot));
    for (priority, protocol, slot, dst) in cidrs {
        objects.push(TcObject::Filter(Filter {
            parent: ROOT_QDISC,
            priority,
            protocol,
            kind: FilterKind::U32(U32Filter {
                handle: slot.u32_node(),
                divisor: None,
                link: None,
                hash_table: None,
                selector: Some(U32Selector { terminal: true, hash_mask: 0, hash_offset: 0, keys: match_keys(dst) }),
                class_id: Some(slot.class()),
            }),
        }));
    }

    objects.push(TcObject::Filter(Filter {
        parent: ROOT_QDISC,
        priority: CATCH_ALL_PRIORITY,
        protocol: ETH_P_ALL,
        kind: FilterKind::U32(U32Filter {
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
        }),
    }));
    objects
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

/// The TBF for an impairment with a rate.
pub fn tbf_for(imp: &ImpairmentFields) -> Option<Tbf> {
    let rate_bps = imp.rate_bps?;
    let rate = (rate_bps / 8).max(1);
    let burst = burst_bytes(imp);
    let limit = match imp.queue_limit_packets {
        Some(packets) if !imp.needs_netem() => u64::from(packets) * FRAME_BYTES,
        _ => burst + bytes_in(rate, DEFAULT_TBF_QUEUE_TIME),
    };
    Some(Tbf {
        rate_bytes_per_sec: rate,
        buffer_ticks: tbf_buffer_ticks(rate, burst) as u32,
        limit_bytes: limit.min(u64::from(u32::MAX)) as u32,
    })
}

/// The bucket in bytes: the user's, or [`DEFAULT_BURST_TIME`] at the rate (at least [`MIN_BURST_BYTES`]).
pub fn burst_bytes(imp: &ImpairmentFields) -> u64 {
    match (imp.burst_bytes, imp.rate_bps) {
        (Some(b), _) => u64::from(b),
        (None, Some(rate_bps)) => bytes_in((rate_bps / 8).max(1), DEFAULT_BURST_TIME).max(MIN_BURST_BYTES),
        (None, None) => 0,
    }
}

fn bytes_in(rate_bytes_per_sec: u64, time: Duration) -> u64 {
    (u128::from(rate_bytes_per_sec) * time.as_nanos() / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}

/// What the kernel dumps as TBF's `buffer` when given `TCA_TBF_BURST = burst`: the time to send `burst` bytes
/// at `rate` (kernel `psched_ratecfg_precompute` + `psched_l2t_ns`), in 64 ns psched ticks.
pub fn tbf_buffer_ticks(rate_bytes_per_sec: u64, burst: u64) -> u64 {
    // The codec's replica of the kernel arithmetic, widened: a default burst is computed in u64 before the
    // representability check.
    let (mult, shift) = psched::rate_mult_shift(rate_bytes_per_sec);
    ((u128::from(burst) * u128::from(mult)) >> shift) as u64 >> PSCHED_SHIFT
}

/// Bytes the kernel's TBF bucket holds for `ticks` at `rate` (inverse of [`tbf_buffer_ticks`], rounded).
pub fn tbf_burst_bytes(rate_bytes_per_sec: u64, ticks: u32) -> u64 {
    (u128::from(ticks) * 64 * u128::from(rate_bytes_per_sec)).div_ceil(1_000_000_000) as u64
}

/// netem's queue: the user's limit, or the bandwidth-delay product in frames with 50 % margin, at least 1,000.
pub fn netem_limit(imp: &ImpairmentFields) -> u32 {
    if let Some(packets) = imp.queue_limit_packets {
        return packets;
    }
    let rate = imp.rate_bps.map(|r| (r / 8).max(1)).unwrap_or(ASSUMED_LINE_BYTES_PER_SEC);
    let delay = imp.latency.unwrap_or_default() + imp.jitter.unwrap_or_default();
    let packets = (bytes_in(rate, delay) * 3 / 2).div_ceil(FRAME_BYTES);
    packets.max(MIN_NETEM_LIMIT).min(u64::from(u32::MAX)) as u32
}

/// The netem for an impairment, canonical so that it equals what the kernel dumps back: probabilities whose
/// event is off carry no correlation, reordering without a gap gets gap 1 (as tc does; with gap 0 the kernel
/// never reorders).
pub fn netem_for(imp: &ImpairmentFields) -> Netem {
    let jitter = imp.jitter.filter(|j| !j.is_zero());
    let correlated = |c: Option<Correlated>| match c {
        Some(c) if !c.percent.is_zero() => (c.percent.to_kernel(), c.correlation.to_kernel()),
        _ => (0, 0),
    };
    let (duplicate, duplicate_correlation) = correlated(imp.duplicate);
    let (corrupt, corrupt_correlation) = correlated(imp.corrupt);
    let (reorder, reorder_correlation, gap) = match imp.reorder {
        Some(r) if !r.percent.is_zero() => (r.percent.to_kernel(), r.correlation.to_kernel(), r.gap.max(1)),
        _ => (0, 0, 0),
    };
    let loss = match imp.loss {
        Some(Loss::Random(c)) if !c.percent.is_zero() => {
            NetemLoss::Random { probability: c.percent.to_kernel(), correlation: c.correlation.to_kernel() }
        }
        Some(Loss::Random(_)) | None => NetemLoss::None,
        // Kernel (sch_netem.c loss_gilb_ell): in the bad state a packet is lost when random > h, so h is the
        // delivery probability there; in the good state lost when random < k1, so k1 is the loss probability.
        Some(Loss::GilbertElliott { p, r, loss_in_bad, loss_in_good }) => NetemLoss::GilbertElliott {
            p: p.to_kernel(),
            r: r.to_kernel(),
            h: u32::MAX - loss_in_bad.to_kernel(),
            k1: loss_in_good.to_kernel(),
        },
    };
    Netem {
        latency_ns: imp.latency.map(|d| d.as_nanos() as i64).unwrap_or(0),
        jitter_ns: jitter.map(|d| d.as_nanos() as i64).unwrap_or(0),
        limit_packets: netem_limit(imp),
        gap,
        duplicate,
        delay_correlation: if jitter.is_some() { imp.jitter_correlation.unwrap_or_default().to_kernel() } else { 0 },
        loss,
        duplicate_correlation,
        reorder,
        reorder_correlation,
        corrupt,
        corrupt_correlation,
    }
}

fn percent_from_kernel(v: u32) -> Percent {
    // Round to 1e-6 % so values written by `Percent::to_kernel` read back as the number the user gave.
    let p = (f64::from(v) / f64::from(u32::MAX) * 100.0 * 1e6).round() / 1e6;
    Percent::new("percent", p.clamp(0.0, 100.0)).unwrap_or(Percent::ZERO)
}

/// The impairment an installed TBF/netem pair implements, as far as the kernel's units allow (rates are
/// whole bytes per second; an explicit burst equal to the default reads back as the default). An error when
/// what is installed is not a valid impairment.
pub fn impairment_of(tbf: Option<&Tbf>, netem: Option<&Netem>) -> Result<Impairment, ImpairmentError> {
    let mut imp = ImpairmentFields::default();
    if let Some(t) = tbf {
        imp.rate_bps = Some(t.rate_bytes_per_sec * 8);
        let burst = tbf_burst_bytes(t.rate_bytes_per_sec, t.buffer_ticks);
        let default_ticks = tbf_buffer_ticks(t.rate_bytes_per_sec, burst_bytes(&imp));
        if u64::from(t.buffer_ticks) != default_ticks {
            imp.burst_bytes = Some(burst.min(u64::from(u32::MAX)) as u32);
        }
    }
    if let Some(n) = netem {
        let ns = |v: i64| (v > 0).then(|| Duration::from_nanos(v as u64));
        imp.latency = ns(n.latency_ns);
        imp.jitter = ns(n.jitter_ns);
        if imp.jitter.is_some() && n.delay_correlation != 0 {
            imp.jitter_correlation = Some(percent_from_kernel(n.delay_correlation));
        }
        let corr = |p: u32, c: u32| {
            (p != 0).then(|| Correlated { percent: percent_from_kernel(p), correlation: percent_from_kernel(c) })
        };
        imp.duplicate = corr(n.duplicate, n.duplicate_correlation);
        imp.corrupt = corr(n.corrupt, n.corrupt_correlation);
        imp.reorder = (n.reorder != 0).then(|| Reorder {
            percent: percent_from_kernel(n.reorder),
            correlation: percent_from_kernel(n.reorder_correlation),
            gap: if n.gap <= 1 { 0 } else { n.gap },
        });
        imp.loss = match n.loss {
            NetemLoss::None => None,
            NetemLoss::Random { probability, correlation } => Some(Loss::Random(Correlated {
                percent: percent_from_kernel(probability),
                correlation: percent_from_kernel(correlation),
            })),
            NetemLoss::GilbertElliott { p, r, h, k1 } => Some(Loss::GilbertElliott {
                p: percent_from_kernel(p),
                r: percent_from_kernel(r),
                loss_in_bad: percent_from_kernel(u32::MAX - h),
                loss_in_good: percent_from_kernel(k1),
            }),
        };
        if netem_limit(&ImpairmentFields { queue_limit_packets: None, ..imp.clone() }) != n.limit_packets {
            imp.queue_limit_packets = Some(n.limit_packets);
        }
    } else if let Some(t) = tbf {
        let default_limit = tbf_for(&imp).map(|d| d.limit_bytes);
        if default_limit != Some(t.limit_bytes) {
            imp.queue_limit_packets = Some((u64::from(t.limit_bytes) / FRAME_BYTES).max(1) as u32);
        }
    }
    Impairment::try_from(imp)
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::test_util::{impairment, rate};

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
    fn desired_state_rejects_bad_input_naming_destination_and_field() {
        // An impairment that is invalid in itself cannot be built; the agent's plan decoding reports one
        // (node::plan's tests). What is left here are the datapath's own limits.
        let dup = DesiredState::new([
            (net("10.0.0.0/24"), Impairment::default()),
            (net("10.0.0.7/24"), Impairment::default()),
        ]);
        let text = dup.unwrap_err().to_string();
        assert!(text.contains("10.0.0.0/24") && text.contains("duplicates"), "{text}");

        let crawl = DesiredState::new([(net("10.0.0.1/32"), rate(64))]);
        let text = crawl.unwrap_err().to_string();
        assert!(text.contains("rate") && text.contains("275 s"), "{text}");

        let too_many = DesiredState::new(
            (0..=MAX_DESTINATIONS as u32)
                .map(|i| (IpNet::from(IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i))), Impairment::default())),
        );
        assert!(too_many.unwrap_err().to_string().contains("more than 4095 destinations"));
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
        assert!(qdiscs.contains(&(s6.netem(), s6.class(), "netem")), "netem hangs on the class without a rate");

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

    #[test]
    fn tbf_buffer_matches_kernel_arithmetic() {
        // 10 Mbit/s = 1,250,000 B/s; 15,000 bytes take 12 ms = 187,500 ticks (kernel rounds down via mult/shift).
        let ticks = tbf_buffer_ticks(1_250_000, 15_000);
        assert!((187_490..=187_500).contains(&ticks), "{ticks}");
        assert!(tbf_burst_bytes(1_250_000, ticks as u32).abs_diff(15_000) <= 1);
        let imp = ImpairmentFields { rate_bps: Some(10_000_000), ..Default::default() };
        assert_eq!(burst_bytes(&imp), 6250);
        let slow = ImpairmentFields { rate_bps: Some(64_000), ..Default::default() };
        assert_eq!(burst_bytes(&slow), MIN_BURST_BYTES);
        let tbf = tbf_for(&imp).unwrap();
        assert_eq!(tbf.rate_bytes_per_sec, 1_250_000);
        assert_eq!(tbf.limit_bytes, 6250 + 125_000);
    }

    #[test]
    fn netem_limit_follows_bandwidth_delay_product() {
        let fast_long = ImpairmentFields { rate_bps: Some(1_000_000_000), latency: ms(100), ..Default::default() };
        // 125 MB/s × 100 ms = 12.5 MB, × 1.5 margin = 18.75 MB = 12,385 frames of 1,514 bytes.
        assert_eq!(netem_limit(&fast_long), 12_385);
        let short = ImpairmentFields { rate_bps: Some(1_000_000), latency: ms(1), ..Default::default() };
        assert_eq!(netem_limit(&short), 1000);
        let explicit = ImpairmentFields { latency: ms(100), queue_limit_packets: Some(50), ..Default::default() };
        assert_eq!(netem_limit(&explicit), 50);
        let no_rate = ImpairmentFields { latency: ms(100), jitter: ms(20), ..Default::default() };
        assert_eq!(netem_limit(&no_rate), (1_250_000_000u64 * 120 / 1000 * 3 / 2).div_ceil(FRAME_BYTES) as u32);
    }

    #[test]
    fn netem_is_canonical_and_reads_back() {
        let p = |v| Percent::new("p", v).unwrap();
        let imp = ImpairmentFields {
            latency: ms(50),
            jitter: ms(5),
            jitter_correlation: Some(p(25.0)),
            loss: Some(Loss::GilbertElliott { p: p(1.0), r: p(10.0), loss_in_bad: p(70.0), loss_in_good: p(0.5) }),
            duplicate: Some(Correlated { percent: p(0.0), correlation: p(30.0) }),
            corrupt: Some(Correlated { percent: p(0.1), correlation: p(0.0) }),
            reorder: Some(Reorder { percent: p(25.0), correlation: p(50.0), gap: 0 }),
            rate_bps: Some(100_000_000),
            burst_bytes: Some(64_000),
            queue_limit_packets: None,
        };
        let n = netem_for(&imp);
        assert_eq!(n.latency_ns, 50_000_000);
        assert_eq!((n.duplicate, n.duplicate_correlation), (0, 0), "no correlation without duplication");
        assert_eq!(n.gap, 1, "reorder without gap is gap 1, as tc sends");
        let NetemLoss::GilbertElliott { h, k1, .. } = n.loss else { panic!() };
        assert_eq!(h, u32::MAX - p(70.0).to_kernel());
        assert_eq!(k1, p(0.5).to_kernel());
        let back = impairment_of(tbf_for(&imp).as_ref(), Some(&n)).unwrap();
        let expected = ImpairmentFields { duplicate: None, ..imp };
        assert_eq!(back.fields(), &expected);
        assert_eq!(netem_for(back.fields()), n);
    }
}
