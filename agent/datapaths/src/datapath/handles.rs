//! Handle allocation: every object isthmus installs gets its handle from a disjoint range, indexed by the
//! destination's slot, so no two objects can collide for any number of destinations up to [`MAX_DESTINATIONS`].
//!
//! | object | handle | range |
//! |---|---|---|
//! | HTB root qdisc | `1570:` | one major that marks the tree as isthmus's |
//! | default class | `1570:1` | |
//! | destination class | `1570:(1000 + slot)` | minors 0x1000–0x1ffe |
//! | TBF | `(2000 + slot):` | majors 0x2000–0x2ffe |
//! | netem | `(3000 + slot):` | majors 0x3000–0x3ffe |
//! | u32 hash tables | `100:` (IPv4), `101:` (IPv6) | below the kernel's generated 0x800–0xfff |
//! | u32 node ids | `slot + 1` | 1–0xfff, the u32 node field's 12 bits |
//!
//! The kernel allocates automatic qdisc handles from majors 0x8000 upward, so it never lands in these ranges.
//! The u32 node id (12 bits) is the narrowest field and sets the capacity.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::model::Handle;

/// Major of the HTB root: a root qdisc with this major was installed by isthmus, any other is foreign.
pub const ROOT_MAJOR: u16 = 0x1570;
pub const ROOT_QDISC: Handle = Handle::new(ROOT_MAJOR, 0);
/// Minor of the class that carries everything no destination filter claims.
pub const DEFAULT_CLASS_MINOR: u16 = 0x1;
pub const DEFAULT_CLASS: Handle = Handle::new(ROOT_MAJOR, DEFAULT_CLASS_MINOR);

/// u32 tables the kernel creates for each filter priority get htids from 0x800 up; their entries dump with
/// that htid and are addressed by the node id alone when added.
pub const GENERATED_HTID_MIN: u32 = 0x800;

const CLASS_MINOR_BASE: u16 = 0x1000;
const TBF_MAJOR_BASE: u16 = 0x2000;
const NETEM_MAJOR_BASE: u16 = 0x3000;

/// u32 hash table ids (the 12-bit `htid`), for host destinations of each family.
pub const IPV4_HASH_TABLE: u32 = 0x100;
pub const IPV6_HASH_TABLE: u32 = 0x101;

/// One slot per destination; node ids are `slot + 1` and must fit the u32 node field (1..=0xfff).
pub const MAX_DESTINATIONS: usize = isthmus_agent_api::MAX_DESTINATIONS_PER_INTERFACE;
const _: () = assert!(MAX_DESTINATIONS <= 0xfff);

// Our tables must stay below the htids the kernel generates for each filter priority (0x800 and up).
const _: () = assert!(IPV4_HASH_TABLE < 0x800 && IPV6_HASH_TABLE < 0x800);

/// A destination's position in every handle range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(u16);

impl Slot {
    pub fn new(index: usize) -> Option<Slot> {
        (index < MAX_DESTINATIONS).then_some(Slot(index as u16))
    }
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
    pub fn class(self) -> Handle {
        Handle::new(ROOT_MAJOR, CLASS_MINOR_BASE + self.0)
    }
    pub fn tbf(self) -> Handle {
        Handle::new(TBF_MAJOR_BASE + self.0, 0)
    }
    /// TBF's single inner class, where its child qdisc hangs.
    pub fn tbf_inner(self) -> Handle {
        Handle::new(TBF_MAJOR_BASE + self.0, 1)
    }
    pub fn netem(self) -> Handle {
        Handle::new(NETEM_MAJOR_BASE + self.0, 0)
    }
    /// The u32 node id (low 12 bits of a u32 filter handle).
    pub fn u32_node(self) -> u32 {
        u32::from(self.0) + 1
    }

    /// The slot whose destination class is `class`, if `class` is one.
    pub fn from_class(class: Handle) -> Option<Slot> {
        if class.major() != ROOT_MAJOR || class.minor() < CLASS_MINOR_BASE {
            return None;
        }
        Slot::new(usize::from(class.minor() - CLASS_MINOR_BASE))
    }
}

/// True for the qdisc majors isthmus owns below its root (TBF and netem ranges) and the root itself.
pub fn is_isthmus_qdisc_major(major: u16) -> bool {
    major == ROOT_MAJOR
        || (TBF_MAJOR_BASE..TBF_MAJOR_BASE + MAX_DESTINATIONS as u16).contains(&major)
        || (NETEM_MAJOR_BASE..NETEM_MAJOR_BASE + MAX_DESTINATIONS as u16).contains(&major)
}

/// Too many destinations for the handle space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotsExhausted {
    pub requested: usize,
}

/// Destination → slot for one reconcile. Destinations already installed keep their slot; new ones take the
/// lowest slot no installed destination holds, and only when none is left a slot being vacated in this same
/// reconcile (so a removed destination's class is not silently repurposed while a free one exists).
pub fn assign_slots<'a>(
    desired: impl IntoIterator<Item = &'a IpNet>,
    installed: &BTreeMap<IpNet, Slot>,
) -> Result<BTreeMap<IpNet, Slot>, SlotsExhausted> {
    let mut desired: Vec<IpNet> = desired.into_iter().copied().collect();
    desired.sort_unstable();
    desired.dedup();
    if desired.len() > MAX_DESTINATIONS {
        return Err(SlotsExhausted { requested: desired.len() });
    }
    // Slots as flags, which an update at a thousand destinations reads and writes a few thousand times.
    let mut held = vec![false; MAX_DESTINATIONS];
    for slot in installed.values() {
        held[slot.index()] = true;
    }
    // An installed destination keeps its slot, the first in order if two claim one; both lists are sorted.
    let mut taken = vec![false; MAX_DESTINATIONS];
    let mut before = installed.iter().peekable();
    let mut slots: Vec<Option<Slot>> = desired
        .iter()
        .map(|dst| {
            while before.next_if(|(d, _)| *d < dst).is_some() {}
            let (_, &slot) = before.next_if(|(d, _)| *d == dst)?;
            (!std::mem::replace(&mut taken[slot.index()], true)).then_some(slot)
        })
        .collect();
    let mut fresh = (0..MAX_DESTINATIONS).filter(|&i| !held[i] && !taken[i]).filter_map(Slot::new);
    let mut vacated = (0..MAX_DESTINATIONS).filter(|&i| held[i] && !taken[i]).filter_map(Slot::new);
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = Some(fresh.next().or_else(|| vacated.next()).ok_or(SlotsExhausted { requested: desired.len() })?);
    }
    Ok(desired.into_iter().zip(slots.into_iter().flatten()).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_are_disjoint_for_every_slot() {
        let mut qdisc_majors = BTreeSet::from([ROOT_MAJOR]);
        let mut class_minors = BTreeSet::from([DEFAULT_CLASS_MINOR]);
        let mut nodes = BTreeSet::new();
        for slot in (0..MAX_DESTINATIONS).map(|i| Slot::new(i).unwrap()) {
            assert!(qdisc_majors.insert(slot.tbf().major()));
            assert!(qdisc_majors.insert(slot.netem().major()));
            assert!(class_minors.insert(slot.class().minor()));
            assert!(nodes.insert(slot.u32_node()));
            assert!((1..=0xfff).contains(&slot.u32_node()));
            assert_eq!(Slot::from_class(slot.class()), Some(slot));
            assert!(is_isthmus_qdisc_major(slot.tbf().major()) && is_isthmus_qdisc_major(slot.netem().major()));
        }
        // Kernel-generated qdisc handles start at major 0x8000; generated u32 tables at 0x800.
        assert!(qdisc_majors.iter().all(|&m| m < 0x8000 && m != 0 && m != 0xffff));
        assert_eq!(Slot::new(MAX_DESTINATIONS), None);
        assert_eq!(Slot::from_class(DEFAULT_CLASS), None);
    }

    #[test]
    fn installed_destinations_keep_their_slot_and_new_ones_avoid_vacated_slots() {
        let installed = BTreeMap::from([
            (net("10.0.0.1/32"), Slot::new(0).unwrap()),
            (net("10.0.0.2/32"), Slot::new(1).unwrap()),
            (net("10.0.0.3/32"), Slot::new(5).unwrap()),
        ]);
        let desired = [net("10.0.0.3/32"), net("10.0.0.9/32"), net("10.0.0.1/32"), net("10.0.0.8/32")];
        let slots = assign_slots(&desired, &installed).unwrap();
        assert_eq!(slots[&net("10.0.0.1/32")], Slot::new(0).unwrap());
        assert_eq!(slots[&net("10.0.0.3/32")], Slot::new(5).unwrap());
        // 10.0.0.2's slot 1 is being vacated: new destinations take 2 and 3 instead.
        assert_eq!(slots[&net("10.0.0.8/32")], Slot::new(2).unwrap());
        assert_eq!(slots[&net("10.0.0.9/32")], Slot::new(3).unwrap());
    }

    #[test]
    fn vacated_slots_are_reused_only_when_nothing_else_is_free() {
        let all: Vec<IpNet> = (0..MAX_DESTINATIONS as u32)
            .map(|i| IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))))
            .collect();
        let installed: BTreeMap<IpNet, Slot> =
            all.iter().enumerate().map(|(i, d)| (*d, Slot::new(i).unwrap())).collect();
        let mut desired = all.clone();
        let gone = desired.remove(7);
        desired.push(net("192.0.2.1/32"));
        let slots = assign_slots(&desired, &installed).unwrap();
        assert_eq!(slots[&net("192.0.2.1/32")], installed[&gone]);
        desired.push(gone);
        assert_eq!(assign_slots(&desired, &installed).unwrap_err().requested, MAX_DESTINATIONS + 1);
    }

    /// The rules stated plainly, over sets: what `assign_slots` computes with flags and a merge.
    fn reference(desired: &[IpNet], installed: &BTreeMap<IpNet, Slot>) -> BTreeMap<IpNet, Slot> {
        let desired: BTreeSet<IpNet> = desired.iter().copied().collect();
        let mut assigned = BTreeMap::new();
        let mut taken = BTreeSet::new();
        for dst in &desired {
            if let Some(&slot) = installed.get(dst)
                && taken.insert(slot)
            {
                assigned.insert(*dst, slot);
            }
        }
        let held: BTreeSet<Slot> = installed.values().copied().collect();
        let mut fresh = (0..MAX_DESTINATIONS).filter_map(Slot::new).filter(|s| !held.contains(s) && !taken.contains(s));
        let mut vacated = held.iter().copied().filter(|s| !taken.contains(s));
        for dst in &desired {
            if !assigned.contains_key(dst) {
                assigned.insert(*dst, fresh.next().or_else(|| vacated.next()).unwrap());
            }
        }
        assigned
    }

    proptest::proptest! {
        /// Destinations from a small pool, installed ones on a few slots (two may claim one, as a damaged dump
        /// could say), repeated desired ones: the same slots as the rules say.
        #[test]
        fn assigns_what_the_rules_say(
            desired in proptest::collection::vec(0u8..48, 0..40),
            installed in proptest::collection::btree_map(0u8..48, 0usize..24, 0..30),
        ) {
            let net = |i: u8| IpNet::from(std::net::IpAddr::from([10, 0, 0, i]));
            let desired: Vec<IpNet> = desired.into_iter().map(net).collect();
            let installed: BTreeMap<IpNet, Slot> =
                installed.into_iter().map(|(d, s)| (net(d), Slot::new(s).unwrap())).collect();
            proptest::prop_assert_eq!(assign_slots(&desired, &installed).unwrap(), reference(&desired, &installed));
        }
    }
}
