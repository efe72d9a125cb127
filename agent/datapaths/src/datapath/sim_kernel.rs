//! An in-memory model of the kernel's tc semantics, enough to check that the diff's operations are valid
//! in order and produce the desired tree: adds need their parent and a free handle; deletes cascade and are
//! refused for a class that filters still point to and a hash table that a link still points into; u32
//! entries added by node id land in the priority's generated table.

use std::collections::{BTreeMap, BTreeSet};

use super::diff::{Key, Tree, changeable, key};
use super::handles::ROOT_QDISC;
use super::model::*;

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
                    if self.objects.iter().any(
                        |x| matches!(x, TcObject::Filter(g) if g.priority == f.priority && g.protocol != f.protocol),
                    ) {
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
