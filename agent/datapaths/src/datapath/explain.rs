//! What an interface's isthmus tree does with one destination address, for `isthmus-agent explain`: the entry
//! whose prefix is the longest that holds the address (the filters' order: host tables first, then CIDRs
//! longest first), its filter, class, TBF and netem with their counters. Selection is pure; the dump is
//! [`Datapath::dump_isthmus_tree`]'s.

use std::net::IpAddr;

use isthmus_agent_api::Counters;
use isthmus_agent_api::explain::{InstalledPath, KernelObject};

use super::error::DatapathError;
use super::handles::{DEFAULT_CLASS, ROOT_QDISC};
use super::installed::{self, RootState};
use super::model::*;
use super::queue::QueueBudget;
use super::reconcile::Datapath;
use super::units;

impl Datapath {
    /// The tree's path for `destination` on `interface`; `None` when no isthmus tree is there (then
    /// [`installed::root_state`] of a plain dump tells default from foreign, see [`Datapath::root_kind`]).
    pub async fn explain(&self, interface: &str, destination: IpAddr) -> Result<Option<InstalledPath>, DatapathError> {
        let Some((_, dump, ours)) = self.dump_isthmus_tree(interface).await? else { return Ok(None) };
        let (_, mtu) = self.link(interface).await?;
        Ok(Some(select(&ours, &dump.counters, destination, mtu)))
    }

    /// The kind of a foreign root qdisc on `interface`, if there is one.
    pub async fn root_kind(&self, interface: &str) -> Result<Option<String>, DatapathError> {
        let place = self.place(interface);
        let ifindex = self.ifindex(interface).await?;
        let dump = self.dump(&place, ifindex).await?;
        Ok(match installed::root_state(&dump.objects) {
            RootState::Foreign { kind, .. } => Some(kind),
            RootState::Default | RootState::Isthmus => None,
        })
    }
}

/// The path of `destination` through an isthmus tree (`ours`, as [`installed::owned`] keeps it) on an interface
/// whose MTU is `mtu`.
pub fn select(ours: &[TcObject], counters: &[(Handle, Counters)], destination: IpAddr, mtu: u32) -> InstalledPath {
    let entries = installed::installed_destinations(ours);
    let counters_of = |h: Handle| counters.iter().find(|(x, _)| *x == h).map(|(_, c)| *c);
    let describe = |o: &TcObject| describe(o, counters_of);
    let Some((dst, slot)) =
        entries.iter().filter(|(d, _)| d.contains(&destination)).max_by_key(|(d, _)| d.prefix_len())
    else {
        let objects = ours
            .iter()
            .filter(|o| match o {
                TcObject::Qdisc(q) => q.handle == ROOT_QDISC,
                TcObject::Class(c) => c.handle == DEFAULT_CLASS,
                TcObject::Filter(f) => matches!(&f.kind, FilterKind::U32(u) if u.class_id == Some(DEFAULT_CLASS)),
            })
            .map(describe)
            .collect();
        return InstalledPath::TcDefault { objects };
    };
    let filter = ours.iter().find(|o| match o {
        TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) => u.class_id == Some(slot.class()),
        _ => false,
    });
    let qdisc = |h: Handle| ours.iter().find(|o| matches!(o, TcObject::Qdisc(q) if q.handle == h));
    let class = ours.iter().find(|o| matches!(o, TcObject::Class(c) if c.handle == slot.class()));
    let (tbf, netem) = (qdisc(slot.tbf()), qdisc(slot.netem()));
    let tbf_params = match tbf {
        Some(TcObject::Qdisc(Qdisc { kind: QdiscKind::Tbf(t), .. })) => Some(t),
        _ => None,
    };
    let netem_params = match netem {
        Some(TcObject::Qdisc(Qdisc { kind: QdiscKind::Netem(n), .. })) => Some(n),
        _ => None,
    };
    // The running agent's queue budget is not known here; the default's bound only decides whether the netem
    // limit reads back as an explicit `queueLimit`, and the netem object below states the limit either way.
    let bound = QueueBudget::DEFAULT.bound(entries.len()).with_mtu(mtu);
    let impairment = units::impairment_of(tbf_params, netem_params, bound).ok().map(Box::new);
    let objects = [filter, class, tbf, netem].into_iter().flatten().map(describe).collect();
    InstalledPath::Tc { destination: *dst, impairment, objects }
}

fn describe(o: &TcObject, counters_of: impl Fn(Handle) -> Option<Counters>) -> KernelObject {
    let rate = |bytes_per_sec: u64| format!("{}bit/s", bytes_per_sec * 8);
    match o {
        TcObject::Qdisc(q) => KernelObject {
            kind: format!("{} qdisc", q.kind.name()),
            handle: q.handle.to_string(),
            parent: q.parent.to_string(),
            detail: match &q.kind {
                QdiscKind::Tbf(t) => {
                    let peak = t.peak.map_or(String::new(), |p| {
                        format!(" peak {} mtu {} ticks", rate(p.rate_bytes_per_sec), p.mtu_ticks)
                    });
                    format!("rate {} buffer {} ticks{peak}", rate(t.rate_bytes_per_sec), t.buffer_ticks)
                }
                QdiscKind::Netem(n) => netem_detail(n),
                QdiscKind::Htb(h) => format!("default {:x}", h.default_class),
                QdiscKind::Foreign(_) => String::new(),
            },
            counters: counters_of(q.handle),
        },
        TcObject::Class(c) => KernelObject {
            kind: format!("{} class", c.kind.name()),
            handle: c.handle.to_string(),
            parent: c.parent.to_string(),
            detail: match &c.kind {
                ClassKind::Htb(h) => {
                    format!("rate {} ceil {}", rate(h.rate_bytes_per_sec), rate(h.ceil_bytes_per_sec))
                }
                ClassKind::Foreign(_) => String::new(),
            },
            counters: counters_of(c.handle),
        },
        TcObject::Filter(f) => {
            let (handle, detail) = match &f.kind {
                FilterKind::U32(u) => (
                    format!(
                        "pref {} {:x}:{:x}:{:x}",
                        f.priority,
                        u.handle >> 20,
                        (u.handle >> 12) & 0xff,
                        u.handle & 0xfff
                    ),
                    u.class_id.map(|c| format!("flowid {c}")).unwrap_or_default(),
                ),
                FilterKind::Foreign(_) => (format!("pref {}", f.priority), String::new()),
            };
            KernelObject {
                kind: format!("{} filter", f.kind.name()),
                handle,
                parent: f.parent.to_string(),
                detail,
                counters: None,
            }
        }
    }
}

fn netem_detail(n: &Netem) -> String {
    let pct = |v: u32| f64::from(v) / f64::from(u32::MAX) * 100.0;
    let mut parts = vec![format!("limit {}", n.limit_packets)];
    if n.latency_ns > 0 {
        parts.push(format!("delay {}us", n.latency_ns / 1000));
    }
    if n.jitter_ns > 0 {
        parts.push(format!("jitter {}us", n.jitter_ns / 1000));
    }
    match n.loss {
        NetemLoss::None => {}
        NetemLoss::Random { probability, .. } => parts.push(format!("loss {:.4}%", pct(probability))),
        NetemLoss::GilbertElliott { p, r, .. } => parts.push(format!("loss gemodel p {:.4}% r {:.4}%", pct(p), pct(r))),
    }
    for (name, v) in [("duplicate", n.duplicate), ("corrupt", n.corrupt), ("reorder", n.reorder)] {
        if v != 0 {
            parts.push(format!("{name} {:.4}%", pct(v)));
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use ipnet::IpNet;
    use isthmus_agent_api::{Impairment, ImpairmentFields};

    use super::*;
    use crate::datapath::desired::DesiredState;
    use crate::datapath::{handles, tree};

    fn tree_for(entries: &[(&str, ImpairmentFields)]) -> (Vec<TcObject>, BTreeMap<IpNet, handles::Slot>) {
        let d = DesiredState::new(
            entries.iter().map(|(n, f)| (n.parse::<IpNet>().unwrap(), Impairment::try_from(f.clone()).unwrap())),
        )
        .unwrap();
        let slots = handles::assign_slots(d.destinations().map(|(n, _)| n), &BTreeMap::new()).unwrap();
        (tree::build(&d, &slots), slots)
    }

    fn delay(ms: u64) -> ImpairmentFields {
        ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() }
    }

    #[test]
    fn the_host_entry_wins_over_a_covering_cidr_and_comes_with_its_chain_and_counters() {
        let shaped = ImpairmentFields { rate_bps: Some(10_000_000), ..delay(40) };
        let (objects, slots) = tree_for(&[("10.0.0.9/32", shaped.clone()), ("10.0.0.0/24", delay(5))]);
        let host = slots[&"10.0.0.9/32".parse::<IpNet>().unwrap()];
        let counters = vec![(host.netem(), Counters { packets: 7, drops: 1, ..Default::default() })];
        let InstalledPath::Tc { destination, impairment, objects } =
            select(&objects, &counters, "10.0.0.9".parse().unwrap(), 1500)
        else {
            panic!("expected the tc path")
        };
        assert_eq!(destination.to_string(), "10.0.0.9/32");
        assert_eq!(impairment.unwrap().fields().latency, shaped.latency);
        let kinds: Vec<&str> = objects.iter().map(|o| o.kind.as_str()).collect();
        assert_eq!(kinds, ["u32 filter", "htb class", "tbf qdisc", "netem qdisc"]);
        assert_eq!(objects[1].handle, host.class().to_string());
        assert_eq!(objects[0].detail, format!("flowid {}", host.class()));
        assert!(objects[2].detail.starts_with("rate 10000000bit/s"), "{}", objects[2].detail);
        assert!(objects[2].detail.contains(" peak 100000000000bit/s"), "{}", objects[2].detail);
        assert!(objects[3].detail.contains("delay 40000us"), "{}", objects[3].detail);
        assert_eq!(objects[3].counters.map(|c| (c.packets, c.drops)), Some((7, 1)));

        // Another address of the /24 takes the CIDR entry.
        let InstalledPath::Tc { destination, .. } = select(
            &objects_of(&[("10.0.0.9/32", shaped), ("10.0.0.0/24", delay(5))]),
            &[],
            "10.0.0.77".parse().unwrap(),
            1500,
        ) else {
            panic!("expected the tc path")
        };
        assert_eq!(destination.to_string(), "10.0.0.0/24");

        // A delay alone: its TBF only cuts GSO packets, and reads back as no bandwidth.
        let InstalledPath::Tc { impairment, objects, .. } =
            select(&objects_of(&[("10.0.0.0/24", delay(5))]), &[], "10.0.0.77".parse().unwrap(), 1500)
        else {
            panic!("expected the tc path")
        };
        assert_eq!(impairment.unwrap().fields(), &delay(5));
        assert_eq!(objects.iter().filter(|o| o.kind == "tbf qdisc").count(), 1);
    }

    fn objects_of(entries: &[(&str, ImpairmentFields)]) -> Vec<TcObject> {
        tree_for(entries).0
    }

    #[test]
    fn an_address_no_entry_holds_goes_to_the_default_class() {
        let objects = objects_of(&[("10.0.0.9/32", delay(40))]);
        let InstalledPath::TcDefault { objects } = select(&objects, &[], "192.0.2.1".parse().unwrap(), 1500) else {
            panic!("expected the default path")
        };
        let handles: Vec<(&str, &str)> = objects.iter().map(|o| (o.kind.as_str(), o.handle.as_str())).collect();
        assert!(handles.contains(&("htb qdisc", "1570:0")), "{handles:?}");
        assert!(handles.contains(&("htb class", "1570:1")), "{handles:?}");
    }
}
