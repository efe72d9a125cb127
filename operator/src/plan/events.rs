//! Events into the planner: each updates the index and marks as stale only the links it can affect.

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::core::SelectorExt;

use super::planner::Planner;
use super::selection::Resolution;
use crate::api::{NetworkLink, ServiceInclusion};
use crate::gate::PodGate;
use crate::index::{Index, Labels, LinkInfo, NamespaceScope, ObjectKey, PodInfo, ServiceInfo};

impl Planner {
    pub fn apply_pod(&mut self, pod: &Pod) {
        let (key, info) = PodInfo::from_pod(pod);
        match PodGate::from_pod(pod) {
            Some(gate) => self.index.gates.insert(key.clone(), gate),
            None => self.index.gates.remove(&key),
        };
        self.upsert_pod(key, info);
    }

    pub fn upsert_pod(&mut self, key: ObjectKey, info: PodInfo) {
        let old = self.index.pods.insert(key.clone(), info);
        let new = self.index.pods.get(&key);
        if old.as_ref() != new {
            self.pod_changed(&key, old.as_ref(), new.cloned().as_ref());
        }
    }

    pub fn delete_pod(&mut self, key: &ObjectKey) {
        self.index.gates.remove(key);
        if let Some(old) = self.index.pods.remove(key) {
            self.pod_changed(key, Some(&old), None);
        }
    }

    pub fn apply_namespace(&mut self, ns: &Namespace) {
        let (name, labels) = Index::namespace_labels(ns);
        self.upsert_namespace(name, labels);
    }

    pub fn upsert_namespace(&mut self, name: String, labels: Labels) {
        if self.index.namespaces.get(&name) != Some(&labels) {
            self.index.namespaces.insert(name, labels);
            self.namespaces_changed();
        }
    }

    pub fn delete_namespace(&mut self, name: &str) {
        if self.index.namespaces.remove(name).is_some() {
            self.namespaces_changed();
        }
    }

    pub fn apply_service(&mut self, svc: &Service) {
        let (key, info) = ServiceInfo::from_service(svc);
        self.upsert_service(key, info);
    }

    pub fn upsert_service(&mut self, key: ObjectKey, info: ServiceInfo) {
        if self.index.services.get(&key) != Some(&info) {
            self.index.services.insert(key.clone(), info);
            self.service_changed(&key.namespace);
        }
    }

    pub fn delete_service(&mut self, key: &ObjectKey) {
        if self.index.services.remove(key).is_some() {
            self.service_changed(&key.namespace);
        }
    }

    pub fn apply_link(&mut self, link: &NetworkLink) {
        let (key, info) = LinkInfo::from_link_reading(link, self.index.trace_of(link));
        if link.spec.schedule.as_ref().is_some_and(|s| s.trace.is_some()) {
            self.trace_links.insert(key.clone(), std::sync::Arc::new(link.clone()));
        } else {
            self.trace_links.remove(&key);
        }
        self.upsert_link(key, info);
    }

    pub fn upsert_link(&mut self, key: ObjectKey, info: LinkInfo) {
        if self.index.links.get(&key) != Some(&info) {
            self.index.links.insert(key.clone(), info);
            self.dirty_links.insert(key);
            self.selection_changed = true;
        }
    }

    pub fn delete_link(&mut self, key: &ObjectKey) {
        self.trace_links.remove(key);
        if self.index.links.remove(key).is_some() {
            self.dirty_links.insert(key.clone());
            self.selection_changed = true;
        }
    }

    fn pod_changed(&mut self, key: &ObjectKey, old: Option<&PodInfo>, new: Option<&PodInfo>) {
        // Whether a Service selects the pod depends on the pod alone: asked once, not once per link.
        let served = |pod: &PodInfo| self.index.services_in(&key.namespace).any(|(_, svc)| svc.selects(pod));
        let (old, new) = (old.map(|p| (p, served(p))), new.map(|p| (p, served(p))));
        for (link_key, link) in &self.index.links {
            if self.dirty_links.contains(link_key) {
                continue;
            }
            let Some(res) = self.resolutions.get(link_key) else { continue };
            let touches = |&(pod, served): &(&PodInfo, bool)| pod_touches_link(link_key, link, res, key, pod, served);
            if old.as_ref().is_some_and(touches) || new.as_ref().is_some_and(touches) {
                self.dirty_links.insert(link_key.clone());
            }
        }
    }

    fn service_changed(&mut self, namespace: &str) {
        for (link_key, link) in &self.index.links {
            let matching = matches!(&link.compiled, Ok((sel, _)) if sel.services == ServiceInclusion::Matching);
            let in_scope = self
                .resolutions
                .get(link_key)
                .is_none_or(|r| r.to_namespaces.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok());
            if matching && in_scope {
                self.dirty_links.insert(link_key.clone());
            }
        }
    }

    fn namespaces_changed(&mut self) {
        self.selection_changed = true;
        for (link_key, link) in &self.index.links {
            if matches!(&link.compiled, Ok((sel, _)) if matches!(sel.to_namespaces, NamespaceScope::Selected(_))) {
                self.dirty_links.insert(link_key.clone());
            }
        }
    }
}

/// Whether a pod can change a link's resolution: it is (or was) a source, a destination, or an endpoint of a
/// Service in the link's destination namespaces (`served`: a Service of its namespace selects it).
fn pod_touches_link(
    link_key: &ObjectKey,
    link: &LinkInfo,
    res: &Resolution,
    pod_key: &ObjectKey,
    pod: &PodInfo,
    served: bool,
) -> bool {
    let Ok((sel, _)) = &link.compiled else { return false };
    if pod_key.namespace == link_key.namespace && sel.from.matches(&pod.labels) {
        return true;
    }
    if res.to_namespaces.binary_search(&pod_key.namespace).is_err() {
        return false;
    }
    if sel.to_pods.as_ref().is_some_and(|s| s.matches(&pod.labels)) {
        return true;
    }
    sel.services == ServiceInclusion::Matching && served
}
