//! What of an interface's dump is isthmus's: whose root qdisc it is, the objects of the isthmus tree (without
//! what the kernel adds on its own), and which destination holds which slot. Pure.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::handles::{self, GENERATED_HTID_MIN, ROOT_MAJOR, ROOT_QDISC, Slot};
use super::model::*;
use super::tree;

/// What sits at the interface's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootState {
    /// No root qdisc, or the kernel's default one (handle 0:), which the kernel restores when ours goes.
    Default,
    Isthmus,
    Foreign {
        kind: String,
        handle: Handle,
    },
}

pub fn root_state(installed: &[TcObject]) -> RootState {
    let root = installed.iter().find_map(|o| match o {
        TcObject::Qdisc(q) if q.parent == Handle::ROOT => Some(q),
        _ => None,
    });
    match root {
        None => RootState::Default,
        Some(q) if q.handle.major() == 0 => RootState::Default,
        Some(q) if q.handle == ROOT_QDISC && matches!(q.kind, QdiscKind::Htb(_)) => RootState::Isthmus,
        Some(q) => RootState::Foreign { kind: q.kind.name().to_owned(), handle: q.handle },
    }
}

/// The objects of the isthmus tree among everything dumped from the interface (empty when the root is not
/// isthmus's). Not included: the kernel's per-priority records (u32 handle 0) and the tables the kernel
/// generates for each priority; the diff compares entries of those tables by node id alone.
pub fn owned(installed: &[TcObject]) -> Vec<TcObject> {
    if root_state(installed) != RootState::Isthmus {
        return Vec::new();
    }
    installed
        .iter()
        .filter(|o| match o {
            TcObject::Qdisc(q) => handles::is_isthmus_qdisc_major(q.handle.major()),
            TcObject::Class(c) => c.handle.major() == ROOT_MAJOR,
            TcObject::Filter(f) => {
                f.parent == ROOT_QDISC
                    && match &f.kind {
                        // Dumps start each priority with a handle-0 record of the classifier instance itself.
                        FilterKind::U32(u) => {
                            u.handle != 0 && !(u.divisor.is_some() && u.handle >> 20 >= GENERATED_HTID_MIN)
                        }
                        FilterKind::Foreign(_) => false,
                    }
            }
        })
        .cloned()
        .collect()
}

/// Which destination holds which slot, read from the installed entries' selectors and class ids.
pub fn installed_destinations(owned: &[TcObject]) -> BTreeMap<IpNet, Slot> {
    owned
        .iter()
        .filter_map(|o| match o {
            TcObject::Filter(Filter { protocol, kind: FilterKind::U32(u), .. }) => {
                let slot = Slot::from_class(u.class_id?)?;
                let dst = tree::destination_of_keys(*protocol, &u.selector.as_ref()?.keys)?;
                Some((dst, slot))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_root_is_reported_and_default_root_is_not_foreign() {
        let foreign = vec![TcObject::Qdisc(Qdisc {
            handle: Handle::new(1, 0),
            parent: Handle::ROOT,
            kind: QdiscKind::Foreign("fq_codel".into()),
        })];
        assert_eq!(root_state(&foreign), RootState::Foreign { kind: "fq_codel".into(), handle: Handle::new(1, 0) });
        assert!(owned(&foreign).is_empty());
        let default = vec![TcObject::Qdisc(Qdisc {
            handle: Handle(0),
            parent: Handle::ROOT,
            kind: QdiscKind::Foreign("noqueue".into()),
        })];
        assert_eq!(root_state(&default), RootState::Default);
    }
}
