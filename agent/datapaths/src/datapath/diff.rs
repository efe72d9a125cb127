//! Installed objects vs desired objects → the ordered operations that turn one into the other ([`operations`] from a
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

/// A map keyed by [`Key`]s: what the kernel and the plan hold is not chosen to collide, so SipHash's defence
/// against chosen keys buys nothing here, and it costs a third of a diff of 3,000 objects.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Key {
    Qdisc(u32),
    Class(u32),
    Filter { priority: u16, protocol: u16, handle: u32 },
}

fn normalized_u32_handle(handle: u32) -> u32 {
    if handle >> 20 >= GENERATED_HTID_MIN { handle & 0xf_ffff } else { handle }
}

pub(super) fn key(o: &TcObject) -> Key {
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
pub(super) fn changeable(installed: &TcObject, desired: &TcObject) -> bool {
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
pub(super) struct Tree<'a> {
    pub(super) objects: BTreeMap<Key, &'a TcObject>,
    parent: HashMap<Key, Key>,
    children: HashMap<Key, Vec<Key>>,
}

impl<'a> Tree<'a> {
    pub(super) fn new(installed: impl IntoIterator<Item = &'a TcObject>) -> Tree<'a> {
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
    pub(super) fn cascade(&self, victim: Key) -> BTreeSet<Key> {
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
    // Each installed object beside the desired object of its key, if any (the last, as a later one would win).
    let mut current: FastMap<Key, (&TcObject, Option<&TcObject>)> =
        installed.iter().map(|o| (key(o), (o, None))).collect();
    for d in desired {
        if let Some((_, wanted)) = current.get_mut(&key(d)) {
            *wanted = Some(d);
        }
    }
    // Objects that must go: not desired, or desired in a form that cannot be reached in place.
    let doomed: Vec<Key> = current
        .iter()
        .filter(|(_, (o, wanted))| match wanted {
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
            doomed.into_iter().map(|k| (tree.depth(k), k, current[&k].0)).collect();
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
            Some((o, _)) if !gone.contains(&k) => {
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
pub fn operations(place: &Place, ours: &[TcObject], desired: &DesiredState) -> Result<Vec<Operation>, DatapathError> {
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
#[path = "diff_tests.rs"]
mod tests;
