//! Watch events into the controller, for any [`Watched`] resource: applies and deletes go to its description;
//! a watch that (re)starts lists everything again (`Init`, `InitApply`…, `InitDone`), and whatever the controller
//! holds of that kind and the list did not name was deleted meanwhile. Readiness waits for every watch's first
//! list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use kube::runtime::watcher::Event;

use super::Controller;
use super::watch::{WatchKind, Watched};
use crate::index::ObjectKey;

/// The lists under way and the watches that finished one.
#[derive(Debug, Default)]
pub(super) struct Relist {
    /// Keys seen since a watch's `Init`, per watch in the middle of a list.
    listing: BTreeMap<WatchKind, BTreeSet<ObjectKey>>,
    synced: BTreeSet<WatchKind>,
}

impl Relist {
    fn begin(&mut self, kind: WatchKind) {
        self.listing.insert(kind, BTreeSet::new());
    }

    fn listed(&mut self, kind: WatchKind, key: ObjectKey) {
        if let Some(seen) = self.listing.get_mut(&kind) {
            seen.insert(key);
        }
    }

    /// Ends a list: the keys it named; `None` when no list was under way.
    fn finish(&mut self, kind: WatchKind) -> Option<BTreeSet<ObjectKey>> {
        self.listing.remove(&kind)
    }

    /// Records a finished list; true when it completes the first list of every watch.
    fn mark_synced(&mut self, kind: WatchKind) -> bool {
        self.synced.insert(kind) && self.all_synced()
    }

    pub(super) fn all_synced(&self) -> bool {
        self.synced.len() == WatchKind::ALL.len()
    }
}

impl Controller {
    pub(super) fn on_event<W: Watched>(&mut self, event: Event<W::Object>) {
        match event {
            Event::Init => self.relist.begin(W::KIND),
            Event::InitApply(object) => {
                self.relist.listed(W::KIND, W::key(&object));
                W::upsert(self, object);
            }
            Event::Apply(object) => W::upsert(self, object),
            Event::Delete(object) => W::delete(self, &W::key(&object)),
            Event::InitDone => {
                if let Some(seen) = self.relist.finish(W::KIND) {
                    for key in W::known(self).into_iter().filter(|k| !seen.contains(k)) {
                        W::delete(self, &key);
                    }
                }
                if self.relist.mark_synced(W::KIND) {
                    tracing::info!("all watches synced");
                    self.gates.all = true;
                    self.ctx.ready.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<ObjectKey> {
        names.iter().map(|n| ObjectKey::new("ns", *n)).collect()
    }

    #[test]
    fn a_relist_remembers_what_it_named_until_it_ends() {
        let mut r = Relist::default();
        r.begin(WatchKind::Pod);
        r.listed(WatchKind::Pod, ObjectKey::new("ns", "b"));
        r.listed(WatchKind::Service, ObjectKey::new("ns", "a")); // no list under way for services: ignored
        assert_eq!(r.finish(WatchKind::Service), None, "no list under way for services: nothing to prune");
        assert_eq!(r.finish(WatchKind::Pod), Some(keys(&["b"]).into_iter().collect()));
        assert_eq!(r.finish(WatchKind::Pod), None, "the list is over");
    }

    #[test]
    fn synced_once_every_watch_listed() {
        let mut r = Relist::default();
        let (last, first) = WatchKind::ALL.split_last().unwrap();
        for kind in first {
            assert!(!r.mark_synced(*kind));
        }
        assert!(!r.all_synced());
        assert!(r.mark_synced(*last), "the last first list completes the sync");
        assert!(r.all_synced());
        assert!(!r.mark_synced(*last), "a later re-list does not complete it again");
    }
}
