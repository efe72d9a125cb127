//! The in-memory index: what the plan needs to know about Pods, Namespaces, Services and NetworkLinks, kept
//! as compact records and fed by watch events (apply = added or modified, delete = deleted). A kube-runtime
//! watcher feeds it through [`crate::plan::Planner`], which also tracks what each event makes stale.
//!
//! Services are matched to pods through their selectors here, the way the EndpointSlice controller does it,
//! so EndpointSlices need not be watched.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::api::{NetworkLink, ResolvedImpairments, ServiceInclusion, SpecError};
use crate::gate::PodGate;

mod phase;
pub use phase::PodPhase;

pub type Labels = BTreeMap<String, String>;

/// Namespace and name of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// Whether `link` is a direction of the NetworkLink this key names.
    pub fn names(&self, link: &isthmus_agent_api::LinkRef) -> bool {
        link.namespace == self.namespace && link.name == self.name
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the plan needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub labels: Labels,
    pub node: Option<String>,
    /// `status.podIPs` (dual stack), in the order the kubelet reported them.
    pub ips: Vec<IpAddr>,
    pub phase: PodPhase,
    /// `metadata.deletionTimestamp` is set: the pod is going away and its IP may soon belong to another.
    pub terminating: bool,
    pub host_network: bool,
}

impl PodInfo {
    /// A pod whose network the plan can use: pending or running, not terminating, on a node, with IPs (its
    /// sandbox exists, so its containers may send from now on), own network.
    pub fn usable(&self) -> bool {
        self.phase.may_send() && !self.terminating && self.node.is_some() && !self.ips.is_empty() && !self.host_network
    }

    /// A pod a Service sends to, as the EndpointSlice controller counts its endpoints: running, not terminating.
    pub fn serves(&self) -> bool {
        self.phase == PodPhase::Running && !self.terminating
    }

    /// A pending or running host-network pod that a selector picks but isthmus must leave alone.
    pub fn excluded_host_network(&self) -> bool {
        self.host_network && self.phase.may_send() && !self.terminating && self.node.is_some()
    }

    pub fn from_pod(pod: &Pod) -> (ObjectKey, PodInfo) {
        let key = ObjectKey::new(pod.namespace().unwrap_or_default(), pod.name_any());
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> =
            status.and_then(|s| s.pod_ips.as_ref()).into_iter().flatten().filter_map(|ip| ip.ip.parse().ok()).collect();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_ref()).and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        let spec = pod.spec.as_ref();
        let info = PodInfo {
            uid: pod.uid().unwrap_or_default(),
            labels: pod.labels().clone(),
            node: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            ips,
            phase: PodPhase::of(status.and_then(|s| s.phase.as_deref())),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        };
        (key, info)
    }
}

/// What the plan needs to know about a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// `spec.selector`; an empty or absent selector means endpoints are managed by hand, never matched.
    pub selector: Labels,
    /// `spec.clusterIPs` (dual stack), without `None` (headless).
    pub cluster_ips: Vec<IpAddr>,
}

impl ServiceInfo {
    pub fn from_service(svc: &Service) -> (ObjectKey, ServiceInfo) {
        let key = ObjectKey::new(svc.namespace().unwrap_or_default(), svc.name_any());
        let spec = svc.spec.as_ref();
        let mut ips: Vec<IpAddr> =
            spec.and_then(|s| s.cluster_ips.as_ref()).into_iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
        if ips.is_empty()
            && let Some(ip) = spec.and_then(|s| s.cluster_ip.as_ref()).and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        let external_name = spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let info = ServiceInfo {
            selector: if external_name {
                Labels::new()
            } else {
                spec.and_then(|s| s.selector.clone()).unwrap_or_default()
            },
            cluster_ips: if external_name { Vec::new() } else { ips },
        };
        (key, info)
    }

    /// Whether the Service routes to this pod.
    pub fn selects(&self, pod: &PodInfo) -> bool {
        !self.selector.is_empty() && self.selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
    }
}

/// Where a link's `to.podSelector` looks.
#[derive(Debug, Clone, PartialEq)]
pub enum NamespaceScope {
    /// The link's own namespace.
    Own,
    Selected(Selector),
}

/// The parts of a link that select pods, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSelectors {
    pub from: Selector,
    pub to_pods: Option<Selector>,
    pub to_namespaces: NamespaceScope,
    pub cidrs: Vec<IpNet>,
    pub services: ServiceInclusion,
}

/// Ordering of links on a shared pair: higher priority, then older, then name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank {
    pub priority: i32,
    pub created: Option<Time>,
    pub name: String,
}

impl Rank {
    /// A key that sorts the winner first.
    pub fn sort_key(&self) -> (std::cmp::Reverse<i32>, bool, Option<&Time>, &str) {
        (std::cmp::Reverse(self.priority), self.created.is_none(), self.created.as_ref(), &self.name)
    }
}

/// What the plan needs to know about a NetworkLink: its rank, and either its compiled selectors and
/// impairments or why it cannot be acted on.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkInfo {
    pub rank: Rank,
    /// `from` and `to` summarized for `kubectl get`.
    pub from_summary: String,
    pub to_summary: String,
    pub generation: Option<i64>,
    pub compiled: Result<(LinkSelectors, ResolvedImpairments), SpecError>,
    /// `spec.verify` (default true): whether the agents probe the link's pairs.
    pub verify: bool,
    /// `spec.schedule` as a timeline per direction it changes; `None` without a schedule (or with an error,
    /// which is in `compiled`).
    pub timelines: Option<crate::schedule::Timelines>,
}

fn selector(field: &str, s: &LabelSelector) -> Result<Selector, SpecError> {
    Selector::try_from(s.clone()).map_err(|e| SpecError { field: field.to_owned(), message: e.to_string() })
}

/// The most characters of a selector in `status.from` and `status.to` (a `kubectl get` column): a selector may
/// hold 64 expressions of 64 values each, which would make the status hundreds of kilobytes. `to` holds two
/// selectors and a count of CIDRs, within [`crate::api::bounds::MAX_SUMMARY`].
pub const MAX_SELECTOR_SUMMARY: usize = 100;

/// A selector as `kubectl` prints one: `app=api,tier in (a,b)`; `(all)` when it selects everything; cut at
/// [`MAX_SELECTOR_SUMMARY`] characters, ending in `…`.
fn summarize(s: &LabelSelector) -> String {
    let mut summary = match Selector::try_from(s.clone()) {
        Ok(sel) if sel.selects_all() => return "(all)".into(),
        Ok(sel) => sel.to_string(),
        Err(_) => return "(invalid)".into(),
    };
    crate::api::bounds::cut(&mut summary, MAX_SELECTOR_SUMMARY);
    summary
}

impl LinkInfo {
    /// The link as the plan needs it, with no trace ConfigMap known (a trace schedule is refused as missing one).
    pub fn from_link(link: &NetworkLink) -> (ObjectKey, LinkInfo) {
        Self::from_link_reading(link, None)
    }

    /// The link as the plan needs it; `trace` is the data of the ConfigMap its `spec.schedule.trace` names, if
    /// that exists (see [`Index::trace_of`]).
    pub fn from_link_reading(link: &NetworkLink, trace: crate::schedule::TraceData<'_>) -> (ObjectKey, LinkInfo) {
        let key = ObjectKey::new(link.namespace().unwrap_or_default(), link.name_any());
        let rank = Rank {
            priority: link.spec.priority,
            created: link.metadata.creation_timestamp.clone(),
            name: key.name.clone(),
        };
        let created_unix_ms =
            link.metadata.creation_timestamp.as_ref().map_or(0, |t| u64::try_from(t.0.as_millisecond()).unwrap_or(0));
        let compiled = (|| {
            let spec = &link.spec;
            let impairments = spec.resolve()?;
            let timelines = crate::schedule::compile(spec, &impairments, created_unix_ms, trace)?;
            let selectors = LinkSelectors {
                from: selector("spec.from.podSelector", &spec.from.pod_selector)?,
                to_pods: spec.to.pod_selector.as_ref().map(|s| selector("spec.to.podSelector", s)).transpose()?,
                to_namespaces: match &spec.to.namespace_selector {
                    None => NamespaceScope::Own,
                    Some(s) => NamespaceScope::Selected(selector("spec.to.namespaceSelector", s)?),
                },
                cidrs: spec.to.cidrs.iter().filter_map(|c| c.parse().ok()).collect(),
                services: spec.to.services,
            };
            Ok((selectors, impairments, timelines))
        })();
        let (compiled, timelines) = match compiled {
            Ok((selectors, impairments, timelines)) => (Ok((selectors, impairments)), timelines),
            Err(e) => (Err(e), None),
        };
        let to = &link.spec.to;
        let mut to_summary = to.pod_selector.as_ref().map(summarize).unwrap_or_default();
        if let Some(ns) = &to.namespace_selector {
            to_summary.push_str(&format!(" in ns {}", summarize(ns)));
        }
        if !to.cidrs.is_empty() {
            let n = to.cidrs.len();
            let sep = if to_summary.is_empty() { "" } else { " +" };
            to_summary.push_str(&format!("{sep}{n} CIDR{}", if n == 1 { "" } else { "s" }));
        }
        let info = LinkInfo {
            rank,
            from_summary: summarize(&link.spec.from.pod_selector),
            to_summary,
            generation: link.metadata.generation,
            compiled,
            verify: link.spec.verify.unwrap_or(true),
            timelines,
        };
        (key, info)
    }
}

/// The objects, keyed and ordered, so that every iteration is deterministic.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub pods: BTreeMap<ObjectKey, PodInfo>,
    pub namespaces: BTreeMap<String, Labels>,
    pub services: BTreeMap<ObjectKey, ServiceInfo>,
    pub links: BTreeMap<ObjectKey, LinkInfo>,
    /// The pods that declare the readiness gate, with the condition each carries. Apart from `pods`, so that
    /// the condition isthmus itself writes never marks a link stale.
    pub gates: BTreeMap<ObjectKey, PodGate>,
    /// ConfigMaps labelled [`crate::schedule::TRACE_LABEL`]: their data by key.
    pub traces: BTreeMap<ObjectKey, Arc<BTreeMap<String, String>>>,
}

impl Index {
    /// The data of the trace ConfigMap that `link` names, if it names one and that exists.
    pub fn trace_of(&self, link: &NetworkLink) -> crate::schedule::TraceData<'_> {
        let trace = link.spec.schedule.as_ref()?.trace.as_ref()?;
        let key = ObjectKey::new(link.namespace().unwrap_or_default(), &trace.config_map);
        self.traces.get(&key).map(|d| &**d)
    }

    /// The pods of one namespace, in name order.
    pub fn pods_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = (&'a ObjectKey, &'a PodInfo)> + 'a {
        self.pods.range(ObjectKey::new(namespace, "")..).take_while(move |(k, _)| k.namespace == namespace)
    }

    /// The links of one namespace, in name order.
    pub fn links_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = (&'a ObjectKey, &'a LinkInfo)> + 'a {
        self.links.range(ObjectKey::new(namespace, "")..).take_while(move |(k, _)| k.namespace == namespace)
    }

    pub fn services_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a ServiceInfo)> + 'a {
        self.services.range(ObjectKey::new(namespace, "")..).take_while(move |(k, _)| k.namespace == namespace)
    }

    /// The namespaces a link's `to.podSelector` looks in, in order.
    pub fn to_namespaces(&self, link: &ObjectKey, scope: &NamespaceScope) -> Vec<String> {
        match scope {
            NamespaceScope::Own => vec![link.namespace.clone()],
            NamespaceScope::Selected(sel) => {
                self.namespaces.iter().filter(|(_, labels)| sel.matches(labels)).map(|(n, _)| n.clone()).collect()
            }
        }
    }

    /// Namespace labels as the API server maintains them: `kubernetes.io/metadata.name` is always set.
    pub fn namespace_labels(ns: &Namespace) -> (String, Labels) {
        let name = ns.name_any();
        let mut labels = ns.labels().clone();
        labels.insert("kubernetes.io/metadata.name".into(), name.clone());
        (name, labels)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;
    use crate::api::selector::{MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_SELECTOR_TERMS};

    #[test]
    fn a_selector_summary_stays_short_whatever_the_selector_holds() {
        let value = |i: usize| format!("{i:0>width$}", width = MAX_LABEL_VALUE);
        let key = |i: usize| format!("{i:0>width$}", width = MAX_LABEL_KEY);
        let largest = LabelSelector {
            match_labels: Some((0..MAX_SELECTOR_TERMS).map(|i| (key(i), value(i))).collect()),
            match_expressions: Some(
                (0..MAX_SELECTOR_TERMS)
                    .map(|i| LabelSelectorRequirement {
                        key: key(i + MAX_SELECTOR_TERMS),
                        operator: "In".into(),
                        values: Some((0..MAX_SELECTOR_TERMS).map(value).collect()),
                    })
                    .collect(),
            ),
        };
        let summary = summarize(&largest);
        assert_eq!(summary.chars().count(), MAX_SELECTOR_SUMMARY);
        assert!(summary.ends_with('…'));
        let short = LabelSelector {
            match_labels: Some([("app".to_owned(), "api".to_owned())].into()),
            match_expressions: None,
        };
        assert_eq!(summarize(&short), "app=api");
        assert_eq!(summarize(&LabelSelector::default()), "(all)");
    }

    #[test]
    fn a_pod_is_usable_from_its_first_ip_and_serves_a_service_once_running() {
        let pod = |phase: &str, ip: Option<&str>, deleted: bool| {
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
                "spec": {"nodeName": "n1", "containers": []},
                "status": {"phase": phase, "podIP": ip, "podIPs": ip.map(|ip| vec![serde_json::json!({"ip": ip})])},
            }))
            .unwrap();
            if deleted {
                pod.metadata.deletion_timestamp = Some(Time(Default::default()));
            }
            let info = PodInfo::from_pod(&pod).1;
            (info.phase, info.usable(), info.serves())
        };
        assert_eq!(pod("Pending", None, false), (PodPhase::Pending, false, false), "no sandbox yet");
        assert_eq!(pod("Pending", Some("10.0.0.1"), false), (PodPhase::Pending, true, false), "init containers send");
        assert_eq!(pod("Running", Some("10.0.0.1"), false), (PodPhase::Running, true, true));
        assert_eq!(pod("Running", Some("10.0.0.1"), true), (PodPhase::Running, false, false), "terminating");
        assert_eq!(pod("Succeeded", Some("10.0.0.1"), false), (PodPhase::Ended, false, false), "its IP may be reused");
        assert_eq!(pod("Unknown", Some("10.0.0.1"), false), (PodPhase::Unknown, false, false));
    }
}
