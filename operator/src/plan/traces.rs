//! Trace ConfigMaps into the planner: a link whose schedule replays a trace is compiled with its ConfigMap's data
//! (`Index::traces`), and again whenever that ConfigMap appears, changes or goes, so that an edited trace reaches
//! the agents as a new timeline and a missing one shows in the link's status.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

use super::planner::Planner;
use crate::index::ObjectKey;

impl Planner {
    /// A ConfigMap labelled [`crate::schedule::TRACE_LABEL`] added or changed. Only `data` is read: a trace is text.
    pub fn apply_trace_map(&mut self, map: &ConfigMap) {
        let key = ObjectKey::new(map.namespace().unwrap_or_default(), map.name_any());
        let data = map.data.clone().unwrap_or_default();
        if self.index.traces.get(&key).is_some_and(|d| **d == data) {
            return;
        }
        self.index.traces.insert(key.clone(), data.into());
        self.trace_changed(&key);
    }

    /// A trace ConfigMap deleted, or its label removed.
    pub fn delete_trace_map(&mut self, key: &ObjectKey) {
        if self.index.traces.remove(key).is_some() {
            self.trace_changed(key);
        }
    }

    fn trace_changed(&mut self, map: &ObjectKey) {
        let names = |link: &crate::api::NetworkLink| {
            link.spec.schedule.as_ref().and_then(|s| s.trace.as_ref()).is_some_and(|t| t.config_map == map.name)
        };
        let links: Vec<_> = self
            .trace_links
            .iter()
            .filter(|(key, link)| key.namespace == map.namespace && names(link))
            .map(|(_, link)| link.clone())
            .collect();
        for link in links {
            self.apply_link(&link);
        }
    }
}
