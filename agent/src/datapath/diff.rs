//! Installed objects vs desired objects → the ordered operations that turn one into the other ([`plan`] from a
//! desired state, [`diff`] from a desired tree). Pure.
//!
//! Ordering follows the kernel's rules: deletions first — filters (entries and links before the hash tables
//! they point into, and before the classes they point to, which the kernel refuses to delete while bound),
//! then qdiscs and classes deepest first; a deletion that the kernel cascades (a class takes its qdiscs, a
//! qdisc its classes, a hash table its entries) is not sent. Then additions and in-place changes in the desired
//! order, which is parents before children.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::desired::DesiredState;
use super::error::{DatapathError, Place};
use super::handles::{self, GENERATED_HTID_MIN};
use super::installed::installed_destinations;
use super::model::*;
use super::tree;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Qdisc(u32),
    Class(u32),
    Filter { priority: u16, protocol: u16, handle: u32 },
}

fn normalized_u32_handle(handle: u32) -> u32 {
    if handle >> 20 >= GENERATED_HTID_MIN { handle & 0xf_ffff } else { handle }
}

fn key(o: &TcObject) -> Key {
    match o {
        TcObject::Qdisc(q) => Key::Qdisc(q.handle.0),
        TcObject::Class(c) => Key::Class(c.handle.0),
        TcObject::Filter(f) => Key::Filter {
            priority: f.priority,
            protocol: f.protocol,
            handle: match &f.kind {
                FilterKind::U32(u) => normalized_u32_handle(u.handle),
                FilterKind::Foreign(_) => 0,
            },
        },
    }
}

/// Equal as far as a dump can tell: u32 entries by node id within generated tables, their table attribute
/// aside (neither is reproduced by a dump). Without cloning: the diff compares every installed object.
fn same(installed: &TcObject, desired: &TcObject) -> bool {
    match (installed, desired) {
        (TcObject::Filter(a), TcObject::Filter(b)) => {
            let Filter { parent, priority, protocol, kind } = a;
            *parent == b.parent
                && *priority == b.priority
                && *protocol == b.protocol
                && match (kind, &b.kind) {
                    (FilterKind::U32(u), FilterKind::U32(v)) => {
                        let U32Filter { handle, divisor, link, hash_table: _, selector, class_id } = u;
                        normalized_u32_handle(*handle) == normalized_u32_handle(v.handle)
                            && *divisor == v.divisor
                            && *link == v.link
                            && *selector == v.selector
                            && *class_id == v.class_id
                    }
                    (x, y) => x == y,
                }
        }
        (a, b) => a == b,
    }
}

/// The object as compared: filters without the fields a dump does not reproduce.
#[cfg(test)]
fn comparable(o: &TcObject) -> TcObject {
    match o {
        TcObject::Filter(f) => {
            let mut f = f.clone();
            if let FilterKind::U32(u) = &mut f.kind {
                u.handle = normalized_u32_handle(u.handle);
                u.hash_table = None;
            }
            TcObject::Filter(f)
        }
        other => other.clone(),
    }
}

/// True when `installed` can become `desired` by an in-place change (same handle, parent and kind).
fn changeable(installed: &TcObject, desired: &TcObject) -> bool {
    match (installed, desired) {
        (TcObject::Qdisc(a), TcObject::Qdisc(b)) => {
            a.parent == b.parent
                && matches!(
                    (&a.kind, &b.kind),
                    (QdiscKind::Tbf(_), QdiscKind::Tbf(_)) | (QdiscKind::Netem(_), QdiscKind::Netem(_))
                )
        }
        (TcObject::Class(a), TcObject::Class(b)) => {
            a.parent == b.parent && matches!((&a.kind, &b.kind), (ClassKind::Htb(_), ClassKind::Htb(_)))
        }
        _ => false,
    }
}

/// Parent/child links among installed objects, as the kernel nests them: a class under its qdisc (or parent
/// class), a qdisc under the class (or qdisc's inner class) it is grafted to, a filter under what it is
/// attached to, a u32 entry under the user hash table that holds it.
struct Tree<'a> {
    objects: BTreeMap<Key, &'a TcObject>,
    parent: HashMap<Key, Key>,
    children: HashMap<Key, Vec<Key>>,
}

impl<'a> Tree<'a> {
    fn new(installed: impl IntoIterator<Item = &'a TcObject>) -> Tree<'a> {
        let objects: BTreeMap<Key, &TcObject> = installed.into_iter().map(|o| (key(o), o)).collect();
        let classes: HashMap<u32, Key> =
            objects.iter().filter_map(|(k, o)| matches!(o, TcObject::Class(_)).then_some((k.handle(), *k))).collect();
        let qdiscs: HashMap<u16, Key> = objects
            .iter()
            .filter_map(|(k, o)| match o {
                TcObject::Qdisc(q) => Some((q.handle.major(), *k)),
                _ => None,
            })
            .collect();
        let tables: HashMap<(u16, u16, u32), Key> = objects
            .iter()
            .filter_map(|(k, o)| match o {
                TcObject::Filter(f) => match &f.kind {
                    FilterKind::U32(u) if u.divisor.is_some() => Some(((f.priority, f.protocol, u.handle >> 20), *k)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        // What a handle used as a parent refers to: a class, else the qdisc of that major (X:0 or X:1 of TBF).
        let attached_to = |h: Handle| classes.get(&h.0).or_else(|| qdiscs.get(&h.major())).copied();
        let mut parent = HashMap::new();
        let mut children: HashMap<Key, Vec<Key>> = HashMap::new();
        for (k, o) in &objects {
            let p = match o {
                TcObject::Qdisc(q) if q.parent == Handle::ROOT => None,
                TcObject::Qdisc(q) => attached_to(q.parent),
                TcObject::Class(c) if c.parent == Handle::ROOT => qdiscs.get(&c.handle.major()).copied(),
                TcObject::Class(c) => attached_to(c.parent),
                TcObject::Filter(f) => match &f.kind {
                    FilterKind::U32(u) if u.divisor.is_none() => {
                        tables.get(&(f.priority, f.protocol, u.handle >> 20)).copied().or_else(|| attached_to(f.parent))
                    }
                    _ => attached_to(f.parent),
                },
            };
            if let Some(p) = p.filter(|p| p != k) {
                parent.insert(*k, p);
                children.entry(p).or_default().push(*k);
            }
        }
        Tree { objects, parent, children }
    }

    /// Everything the kernel removes together with `victim` (itself included).
    fn cascade(&self, victim: Key) -> BTreeSet<Key> {
        let mut removed = BTreeSet::from([victim]);
        let mut frontier = vec![victim];
        while let Some(k) = frontier.pop() {
            for child in self.children.get(&k).into_iter().flatten() {
                if removed.insert(*child) {
                    frontier.push(*child);
                }
            }
        }
        removed
    }

    fn depth(&self, k: Key) -> usize {
        let mut d = 0;
        let mut current = k;
        while let Some(p) = self.parent.get(&current) {
            d += 1;
            current = *p;
            if d > self.objects.len() {
                break;
            }
        }
        d
    }
}

impl Key {
    fn handle(self) -> u32 {
        match self {
            Key::Qdisc(h) | Key::Class(h) => h,
            Key::Filter { handle, .. } => handle,
        }
    }
}

/// Deletion order class: entries and links, then hash tables, then qdiscs and classes.
fn delete_rank(o: &TcObject) -> u8 {
    match o {
        TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) if u.divisor.is_some() => 1,
        TcObject::Filter(_) => 0,
        _ => 2,
    }
}

/// Operations that turn `installed` (the output of [`owned`](super::installed::owned)) into `desired` (the output of
/// [`tree::build`]). Deletions carry the installed object, exactly as dumped, so they address it correctly.
pub fn diff(installed: &[TcObject], desired: &[TcObject]) -> Vec<Operation> {
    let current: HashMap<Key, &TcObject> = installed.iter().map(|o| (key(o), o)).collect();
    let wanted: HashMap<Key, &TcObject> = desired.iter().map(|o| (key(o), o)).collect();

    // Objects that must go: not desired, or desired in a form that cannot be reached in place.
    let doomed: Vec<Key> = current
        .iter()
        .filter(|(k, o)| match wanted.get(k) {
            None => true,
            Some(d) => !same(o, d) && !changeable(o, d),
        })
        .map(|(k, _)| *k)
        .collect();
    let mut gone = BTreeSet::new();
    let mut operations: Vec<Operation> = Vec::new();
    // The parent/child links cost more than the rest of a small diff: only built when something goes.
    if !doomed.is_empty() {
        let tree = Tree::new(installed);
        let mut doomed: Vec<(usize, Key, &TcObject)> =
            doomed.into_iter().map(|k| (tree.depth(k), k, current[&k])).collect();
        // Shallowest first, so an object whose ancestor is doomed too is recognised as cascaded and not sent;
        // a cascade only reaches deeper objects, so no later deletion swallows an earlier one.
        doomed.sort_by_key(|(depth, k, _)| (*depth, *k));
        let mut explicit: Vec<(u8, std::cmp::Reverse<usize>, &TcObject)> = Vec::new();
        for (depth, k, o) in doomed {
            if gone.contains(&k) {
                continue;
            }
            gone.extend(tree.cascade(k));
            explicit.push((delete_rank(o), std::cmp::Reverse(depth), o));
        }
        explicit.sort_by_key(|(rank, depth, _)| (*rank, *depth));
        operations.extend(explicit.into_iter().map(|(_, _, o)| Operation::Delete(o.clone())));
    }
    for d in desired {
        let k = key(d);
        match current.get(&k) {
            Some(o) if !gone.contains(&k) => {
                if !same(o, d) {
                    operations.push(Operation::Change(d.clone()));
                }
            }
            _ => operations.push(Operation::Add(d.clone())),
        }
    }
    operations
}

/// The operations that bring the interface holding the isthmus objects `ours` to `desired` (root ownership
/// already checked).
pub fn plan(place: &Place, ours: &[TcObject], desired: &DesiredState) -> Result<Vec<Operation>, DatapathError> {
    let slots =
        handles::assign_slots(desired.destinations().map(|(d, _)| d), &installed_destinations(ours)).map_err(|e| {
            DatapathError::invalid(
                None,
                "destinations",
                format!("{} destinations do not fit the {} slots of {}", e.requested, handles::MAX_DESTINATIONS, place),
            )
        })?;
    Ok(diff(ours, &tree::build(desired, &slots)))
}

/// What the owned objects are once `operations` (from [`diff`]`(installed, …)`) have all succeeded, in dump
/// units as far as [`diff`] compares them (a later [`diff`] against the result is the diff against a fresh
/// dump). `None` when the kernel picks a handle the result would need: a u32 entry added by node id lands in its
/// priority's generated table, whose number is only known while another entry of that priority is installed.
pub fn after(installed: Vec<TcObject>, operations: &[Operation]) -> Option<Vec<TcObject>> {
    let mut objects = installed;
    // Positions by key, built only for many operations (a few are found faster by a scan than by indexing
    // thousands of objects); generated table per (priority, protocol), built at the first entry added by node id.
    let mut index: Option<HashMap<Key, usize>> = None;
    let mut generated: Option<HashMap<(u16, u16), u32>> = None;
    let indexed = operations.len() > 32;
    let mut i = 0;
    while i < operations.len() {
        if matches!(operations[i], Operation::Delete(_)) {
            // A run of deletions cascades over one parent/child map: removals leave the others' links as they are.
            let run = operations[i..].iter().take_while(|o| matches!(o, Operation::Delete(_))).count();
            let removed: BTreeSet<Key> = {
                let tree = Tree::new(&objects);
                operations[i..i + run]
                    .iter()
                    .flat_map(|o| match o {
                        Operation::Delete(victim) => tree.cascade(key(victim)),
                        _ => BTreeSet::new(),
                    })
                    .collect()
            };
            objects.retain(|o| !removed.contains(&key(o)));
            (index, generated) = (None, None);
            i += run;
            continue;
        }
        if indexed && index.is_none() {
            index = Some(objects.iter().enumerate().map(|(n, o)| (key(o), n)).collect());
        }
        let position = |objects: &[TcObject], index: &Option<HashMap<Key, usize>>, k: Key| match index {
            Some(index) => index.get(&k).copied(),
            None => objects.iter().position(|o| key(o) == k),
        };
        let mut object = match &operations[i] {
            Operation::Add(o) | Operation::Change(o) | Operation::Delete(o) => o.clone(),
        };
        let k = key(&object);
        if let TcObject::Filter(f) = &mut object
            && let FilterKind::U32(u) = &mut f.kind
            && u.handle >> 20 == 0
        {
            // Changed: keep the handle the kernel gave the entry, which deletions address. Added by node id: it
            // lands in its priority's generated table, known while another entry of the priority is there.
            let htid = match position(&objects, &index, k) {
                Some(n) => match &objects[n] {
                    TcObject::Filter(Filter { kind: FilterKind::U32(was), .. }) => was.handle >> 20,
                    _ => return None,
                },
                None => *generated.get_or_insert_with(|| generated_tables(&objects)).get(&(f.priority, f.protocol))?,
            };
            u.handle |= htid << 20;
        }
        match position(&objects, &index, k) {
            Some(n) => objects[n] = object,
            None => {
                if let Some(index) = &mut index {
                    index.insert(k, objects.len());
                }
                objects.push(object);
            }
        }
        i += 1;
    }
    Some(objects)
}

/// The generated table of each u32 priority that holds an entry added by node id.
fn generated_tables(objects: &[TcObject]) -> HashMap<(u16, u16), u32> {
    objects
        .iter()
        .filter_map(|o| match o {
            TcObject::Filter(f) => match &f.kind {
                FilterKind::U32(e) if e.divisor.is_none() && e.handle >> 20 >= GENERATED_HTID_MIN => {
                    Some(((f.priority, f.protocol), e.handle >> 20))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod sim {
    //! An in-memory model of the kernel's tc semantics, enough to check that the diff's operations are valid
    //! in order and produce the desired tree: adds need their parent and a free handle; deletes cascade and are
    //! refused for a class that filters still point to and a hash table that a link still points into; u32
    //! entries added by node id land in the priority's generated table.
    use super::*;
    use crate::datapath::handles::ROOT_QDISC;

    #[derive(Default)]
    pub struct SimKernel {
        pub objects: Vec<TcObject>,
        next_htid: u32,
        tp_htid: BTreeMap<(u16, u16), u32>,
        pub mutations: usize,
    }

    impl SimKernel {
        pub fn dump(&self) -> Vec<TcObject> {
            let mut out = self.objects.clone();
            // The kernel dumps each u32 priority's generated root table (divisor 1) with its entries.
            for ((priority, protocol), htid) in &self.tp_htid {
                // …preceded by a record of the classifier instance (handle 0, no options).
                out.push(TcObject::Filter(Filter {
                    parent: ROOT_QDISC,
                    priority: *priority,
                    protocol: *protocol,
                    kind: FilterKind::U32(U32Filter {
                        handle: 0,
                        divisor: None,
                        link: None,
                        hash_table: None,
                        selector: None,
                        class_id: None,
                    }),
                }));
                out.push(TcObject::Filter(Filter {
                    parent: ROOT_QDISC,
                    priority: *priority,
                    protocol: *protocol,
                    kind: FilterKind::U32(U32Filter {
                        handle: htid << 20,
                        divisor: Some(1),
                        link: None,
                        hash_table: None,
                        selector: None,
                        class_id: None,
                    }),
                }));
            }
            out
        }

        fn find(&self, k: Key) -> Option<usize> {
            self.objects.iter().position(|o| key(o) == k)
        }

        fn parent_exists(&self, h: Handle) -> bool {
            h == Handle::ROOT
                || self.objects.iter().any(|o| match o {
                    TcObject::Class(c) => c.handle == h,
                    // TBF's inner class X:1 and a qdisc's own X:0.
                    TcObject::Qdisc(q) => {
                        q.handle == h
                            || (h.minor() == 1 && q.handle.major() == h.major() && matches!(q.kind, QdiscKind::Tbf(_)))
                    }
                    TcObject::Filter(_) => false,
                })
        }

        pub fn apply(&mut self, op: &Operation) -> Result<(), String> {
            self.mutations += 1;
            match op {
                Operation::Add(o) => {
                    let mut o = o.clone();
                    let parent = match &o {
                        TcObject::Qdisc(q) => q.parent,
                        TcObject::Class(c) => {
                            if c.parent == Handle::ROOT {
                                Handle::new(c.handle.major(), 0)
                            } else {
                                c.parent
                            }
                        }
                        TcObject::Filter(f) => f.parent,
                    };
                    if !self.parent_exists(parent) {
                        return Err(format!("add {o:?}: parent {parent} missing"));
                    }
                    if let TcObject::Qdisc(q) = &o
                        && self.objects.iter().any(|x| matches!(x, TcObject::Qdisc(p) if p.parent == q.parent))
                    {
                        return Err(format!("add {o:?}: NLM_F_REPLACE needed to override"));
                    }
                    if let TcObject::Filter(f) = &mut o
                        && let FilterKind::U32(u) = &mut f.kind
                    {
                        let tp = (f.priority, f.protocol);
                        if self.objects.iter().any(|x| matches!(x, TcObject::Filter(g) if g.priority == f.priority && g.protocol != f.protocol)) {
                            return Err("protocol mismatch within a priority".into());
                        }
                        if u.handle >> 20 == 0 {
                            let htid = *self.tp_htid.entry(tp).or_insert_with(|| {
                                self.next_htid += 1;
                                0x800 + self.next_htid
                            });
                            u.handle |= htid << 20;
                        } else {
                            self.tp_htid.entry(tp).or_insert_with(|| {
                                self.next_htid += 1;
                                0x800 + self.next_htid
                            });
                            if u.divisor.is_none() {
                                let table = u.hash_table.ok_or("entry of a user table without TCA_U32_HASH")?;
                                if table != u.handle & 0xfff_ff000 {
                                    return Err("hash table does not match handle".into());
                                }
                                if !self.objects.iter().any(|x| matches!(x, TcObject::Filter(Filter{kind: FilterKind::U32(t), ..}) if t.divisor.is_some() && t.handle >> 20 == table >> 20)) {
                                    return Err(format!("table {table:x} missing"));
                                }
                            }
                        }
                        u.hash_table = None;
                        if let Some(link) = u.link
                            && !self.objects.iter().any(|x| matches!(x, TcObject::Filter(Filter{kind: FilterKind::U32(t), ..}) if t.divisor.is_some() && t.handle == link))
                        {
                            return Err(format!("link target {link:x} missing"));
                        }
                        if let Some(class) = u.class_id
                            && !self.objects.iter().any(|x| matches!(x, TcObject::Class(c) if c.handle == class))
                        {
                            return Err(format!("class {class} missing"));
                        }
                    }
                    if self.find(key(&o)).is_some() {
                        return Err(format!("add {o:?}: exists"));
                    }
                    self.objects.push(o);
                }
                Operation::Change(o) => {
                    let i = self.find(key(o)).ok_or_else(|| format!("change {o:?}: missing"))?;
                    if !changeable(&self.objects[i], o) {
                        return Err(format!("change {o:?}: not changeable from {:?}", self.objects[i]));
                    }
                    self.objects[i] = o.clone();
                }
                Operation::Delete(o) => {
                    let i = self.find(key(o)).ok_or_else(|| format!("delete {o:?}: missing"))?;
                    if let TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) = o
                        && u.handle >> 20 == 0
                    {
                        return Err("delete by node id alone: the kernel needs the full handle".into());
                    }
                    let victim = self.objects[i].clone();
                    let tree = Tree::new(&self.objects);
                    let removed = tree.cascade(key(&victim));
                    let map = &tree.objects;
                    let bound = |pred: &dyn Fn(&U32Filter) -> bool| {
                        self.objects.iter().any(|x| {
                            !removed.contains(&key(x))
                                && matches!(x, TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) if pred(u))
                        })
                    };
                    for k in &removed {
                        if let Key::Class(c) = k
                            && bound(&|u| u.class_id == Some(Handle(*c)))
                        {
                            return Err(format!("delete {victim:?}: class {} in use", Handle(*c)));
                        }
                        if let Some(TcObject::Filter(Filter { kind: FilterKind::U32(t), .. })) = map.get(k)
                            && t.divisor.is_some()
                            && bound(&|u| u.link == Some(t.handle))
                        {
                            return Err(format!("delete {victim:?}: table in use"));
                        }
                    }
                    self.objects.retain(|x| !removed.contains(&key(x)));
                    // A priority with no filters left disappears, with its generated table.
                    let live: BTreeSet<(u16, u16)> = self
                        .objects
                        .iter()
                        .filter_map(|x| match x {
                            TcObject::Filter(f) => Some((f.priority, f.protocol)),
                            _ => None,
                        })
                        .collect();
                    self.tp_htid.retain(|tp, _| live.contains(tp));
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ipnet::IpNet;
    use isthmus_agent_api::test_util;
    use isthmus_agent_api::{Impairment, ImpairmentFields};
    use proptest::prelude::*;

    use super::sim::SimKernel;
    use super::*;
    use crate::datapath::handles::ROOT_QDISC;
    use crate::datapath::installed::owned;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn place() -> Place {
        Place { netns: crate::netns::NetnsId { dev: 0, inode: 1 }, interface: "eth0".into() }
    }

    /// One reconcile against the simulated kernel, as the I/O shell does it.
    fn reconcile(kernel: &mut SimKernel, desired: &DesiredState) -> Result<Vec<Operation>, String> {
        let dump = kernel.dump();
        let ours = owned(&dump);
        let ops = plan(&place(), &ours, desired).map_err(|e| e.to_string())?;
        for op in &ops {
            kernel.apply(op)?;
        }
        Ok(ops)
    }

    fn assert_installed_exactly(kernel: &SimKernel, desired: &DesiredState) {
        let ours = owned(&kernel.dump());
        let slots = installed_destinations(&ours);
        let want: BTreeSet<IpNet> = desired.destinations().map(|(d, _)| *d).collect();
        assert_eq!(slots.keys().copied().collect::<BTreeSet<_>>(), want);
        let mut got: Vec<TcObject> = ours.iter().map(comparable).collect();
        let mut expected: Vec<TcObject> = tree::build(desired, &slots).iter().map(comparable).collect();
        let sort = |v: &mut Vec<TcObject>| v.sort_by_key(|o| format!("{:?}", key(o)));
        sort(&mut got);
        sort(&mut expected);
        assert_eq!(got, expected);
    }

    fn rate(mbit: u64) -> Impairment {
        test_util::rate(mbit * 1_000_000)
    }

    fn with_latency(ms: u64, impairment: Impairment) -> Impairment {
        test_util::impairment(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..impairment.into() })
    }

    #[test]
    fn same_state_twice_sends_nothing_and_latency_change_is_in_place() {
        let mut k = SimKernel::default();
        let a = DesiredState::new([
            (net("10.0.0.1/32"), with_latency(10, rate(10))),
            (net("10.0.0.2/32"), rate(20)),
            (net("10.9.0.0/16"), rate(5)),
        ])
        .unwrap();
        let first = reconcile(&mut k, &a).unwrap();
        assert!(first.iter().all(|o| matches!(o, Operation::Add(_))));
        assert!(reconcile(&mut k, &a).unwrap().is_empty());

        let b = DesiredState::new([
            (net("10.0.0.1/32"), with_latency(30, rate(10))),
            (net("10.0.0.2/32"), rate(20)),
            (net("10.9.0.0/16"), rate(5)),
        ])
        .unwrap();
        let ops = reconcile(&mut k, &b).unwrap();
        assert!(
            matches!(ops.as_slice(), [Operation::Change(TcObject::Qdisc(Qdisc { kind: QdiscKind::Netem(n), .. }))] if n.latency_ns == 30_000_000),
            "{ops:?}"
        );
        assert_installed_exactly(&k, &b);
    }

    /// Trees installed before netem got a TBF ahead of it (netem on the class, a rate's TBF without a peak) are
    /// rebuilt into today's on the agent's first reconcile after an upgrade.
    #[test]
    fn a_tree_from_before_the_gso_cut_is_rebuilt() {
        let d = DesiredState::new([
            (net("10.0.0.1/32"), with_latency(10, rate(10))),
            (net("10.0.0.2/32"), with_latency(20, test_util::impairment(ImpairmentFields::default()))),
        ])
        .unwrap();
        let slots = crate::datapath::handles::assign_slots(d.destinations().map(|(n, _)| n), &BTreeMap::new()).unwrap();
        let unrated = slots[&net("10.0.0.2/32")];
        let old: Vec<TcObject> = tree::build(&d, &slots)
            .into_iter()
            .filter(|o| !matches!(o, TcObject::Qdisc(q) if q.handle == unrated.tbf()))
            .map(|o| match o {
                TcObject::Qdisc(Qdisc { handle, parent, kind: QdiscKind::Tbf(t) }) => {
                    TcObject::Qdisc(Qdisc { handle, parent, kind: QdiscKind::Tbf(Tbf { peak: None, ..t }) })
                }
                TcObject::Qdisc(q) if q.handle == unrated.netem() => {
                    TcObject::Qdisc(Qdisc { parent: unrated.class(), ..q })
                }
                o => o,
            })
            .collect();
        let mut k = SimKernel::default();
        for o in &old {
            k.apply(&Operation::Add(o.clone())).unwrap();
        }
        reconcile(&mut k, &d).unwrap();
        assert_installed_exactly(&k, &d);
        assert!(reconcile(&mut k, &d).unwrap().is_empty());
    }

    #[test]
    fn removing_a_destination_deletes_its_filter_then_its_class_only() {
        let mut k = SimKernel::default();
        let a = DesiredState::new([(net("10.0.0.1/32"), rate(10)), (net("10.0.0.2/32"), rate(20))]).unwrap();
        reconcile(&mut k, &a).unwrap();
        let b = DesiredState::new([(net("10.0.0.1/32"), rate(10))]).unwrap();
        let ops = reconcile(&mut k, &b).unwrap();
        assert!(
            matches!(ops.as_slice(), [Operation::Delete(TcObject::Filter(_)), Operation::Delete(TcObject::Class(_))]),
            "{ops:?}"
        );
        assert_installed_exactly(&k, &b);
        let ops = reconcile(&mut k, &DesiredState::empty()).unwrap();
        assert!(matches!(ops.as_slice(), [Operation::Delete(TcObject::Qdisc(q))] if q.handle == ROOT_QDISC));
        assert!(k.dump().is_empty());
    }

    fn impairment() -> impl Strategy<Value = Impairment> {
        (prop::option::of(1u64..5000), prop::option::of(0u64..300), prop::option::of(1u32..5000)).prop_map(
            |(mbit, latency_ms, limit)| {
                test_util::impairment(ImpairmentFields {
                    rate_bps: mbit.map(|m| m * 1_000_000),
                    latency: latency_ms.map(Duration::from_millis),
                    queue_limit_packets: limit,
                    ..Default::default()
                })
            },
        )
    }

    fn destination() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (0u32..40)
                .prop_map(|i| IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i * 37)))),
            (0u32..6, 8u8..32).prop_map(|(i, len)| IpNet::new(
                std::net::Ipv4Addr::from(0x0a00_0000 + (i << 20)).into(),
                len
            )
            .unwrap()
            .trunc()),
            (0u128..20).prop_map(|i| IpNet::from(std::net::IpAddr::from(std::net::Ipv6Addr::from(
                0xfd00_0000_0000_0000_0000_0000_0000_0000u128 + i * 255
            )))),
            (0u128..4, 16u8..128).prop_map(|(i, len)| IpNet::new(
                std::net::Ipv6Addr::from(0xfd00u128 << 112 | i << 80).into(),
                len
            )
            .unwrap()
            .trunc()),
        ]
    }

    fn desired_state() -> impl Strategy<Value = DesiredState> {
        prop::collection::btree_map(destination(), impairment(), 0..24).prop_map(|m| DesiredState::new(m).unwrap())
    }

    /// The fast path against the simulated kernel, as the I/O shell does it: diff against the record of what
    /// was last installed, no dump; returns the operations and the record afterwards.
    fn update(
        kernel: &mut SimKernel,
        record: &[TcObject],
        desired: &DesiredState,
    ) -> Result<(Vec<Operation>, Option<Vec<TcObject>>), String> {
        let ops = plan(&place(), record, desired).map_err(|e| e.to_string())?;
        for op in &ops {
            kernel.apply(op)?;
        }
        let record = after(record.to_vec(), &ops);
        Ok((ops, record))
    }

    /// Objects as the record must hold them: exact handles (deletions address entries by them), the table
    /// attribute aside (a dump and a request state it differently, and nothing is addressed by it).
    fn exact(objects: &[TcObject]) -> Vec<TcObject> {
        let mut out: Vec<TcObject> = objects
            .iter()
            .cloned()
            .map(|mut o| {
                if let TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) = &mut o {
                    u.hash_table = None;
                }
                o
            })
            .collect();
        out.sort_by_key(|o| format!("{o:?}"));
        out
    }

    /// A full reconcile that also yields the record the shell keeps (after the operations, or a fresh dump's
    /// owned objects when a kernel-picked handle is unknown, as the shell's next full reconcile establishes).
    fn reconcile_recording(kernel: &mut SimKernel, desired: &DesiredState) -> Result<Vec<TcObject>, String> {
        let before = owned(&kernel.dump());
        let ops = reconcile(kernel, desired)?;
        let dumped = owned(&kernel.dump());
        match after(before, &ops) {
            Some(record) => {
                assert_eq!(exact(&record), exact(&dumped), "record after a full reconcile");
                Ok(record)
            }
            None => Ok(dumped),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn update_via_the_record_leaves_the_same_kernel_state_as_a_full_reconcile(
            a in desired_state(), b in desired_state(), c in desired_state()
        ) {
            let (mut fast, mut full) = (SimKernel::default(), SimKernel::default());
            let mut record = reconcile_recording(&mut fast, &a).map_err(TestCaseError::fail)?;
            reconcile(&mut full, &a).map_err(TestCaseError::fail)?;
            for next in [&b, &c, &a] {
                let (_, after_update) = update(&mut fast, &record, next).map_err(TestCaseError::fail)?;
                reconcile(&mut full, next).map_err(TestCaseError::fail)?;
                assert_installed_exactly(&fast, next);
                let (fast_dump, full_dump) = (owned(&fast.dump()), owned(&full.dump()));
                let sorted = |v: &[TcObject]| {
                    let mut v: Vec<TcObject> = v.iter().map(comparable).collect();
                    v.sort_by_key(|o| format!("{o:?}"));
                    v
                };
                prop_assert_eq!(sorted(&fast_dump), sorted(&full_dump), "update and full reconcile disagree");
                record = match after_update {
                    Some(r) => {
                        prop_assert_eq!(exact(&r), exact(&fast_dump), "the record after an update is what a dump shows");
                        r
                    }
                    // The shell drops the record; its next call is a full reconcile, which re-reads it.
                    None => fast_dump,
                };
                let (again, _) = update(&mut fast, &record, next).map_err(TestCaseError::fail)?;
                prop_assert!(again.is_empty(), "the same state via the record sent {:?}", again);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn applying_a_then_b_leaves_exactly_b_and_b_again_sends_nothing(a in desired_state(), b in desired_state()) {
            let mut k = SimKernel::default();
            reconcile(&mut k, &a).map_err(TestCaseError::fail)?;
            assert_installed_exactly(&k, &a);
            let slots_a = installed_destinations(&owned(&k.dump()));
            reconcile(&mut k, &b).map_err(TestCaseError::fail)?;
            assert_installed_exactly(&k, &b);
            let slots_b = installed_destinations(&owned(&k.dump()));
            for (dst, slot) in &slots_b {
                if let Some(before) = slots_a.get(dst) {
                    prop_assert_eq!(before, slot, "a destination kept across reconciles keeps its slot");
                }
            }
            let again = reconcile(&mut k, &b).map_err(TestCaseError::fail)?;
            prop_assert!(again.is_empty(), "second apply sent {:?}", again);
            reconcile(&mut k, &DesiredState::empty()).map_err(TestCaseError::fail)?;
            prop_assert!(k.dump().is_empty());
        }
    }
}
