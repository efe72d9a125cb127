//! The pure plan: from the [`Index`] to each node's [`NodePlan`] and each link's status facts.
//!
//! Two stages, both deterministic functions of the index:
//! 1. per link, a [`Resolution`]: its source pods (with node, UID, IPs), its destinations per direction, the
//!    pods it must leave alone and why;
//! 2. per node, the plan: every source pod on the node with the winning (destination, impairment, link) of
//!    each pair, after the overlap rule (higher priority, then older, then name; forward before reverse within
//!    one link), plus per-link pair and overlap counts.
//!
//! [`Planner`] keeps both stages cached. An event marks the links it can affect as stale; [`Planner::recompute`]
//! re-resolves those links and recomputes only the nodes whose inputs actually changed. The result is always
//! identical to computing everything from scratch ([`compute`]), which the property tests check.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use isthmus_agent_api::{Direction, Impairment, LinkRef, NodePlan, PodPlan, default_interface};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::core::SelectorExt;

use crate::api::{
    MAX_STATUS_FAILURES, MAX_STATUS_OVERLAPS, NetworkLink, NetworkLinkStatus, OverlapStatus, PodFailure,
    ServiceInclusion, SpecError, Summary,
};
use crate::index::{Index, LinkInfo, NamespaceScope, ObjectKey, PodInfo, Rank, ServiceInfo};

/// A pod whose egress a link shapes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Source {
    pub key: ObjectKey,
    pub node: String,
    pub uid: String,
    pub ips: Vec<IpAddr>,
}

/// One direction of a resolved link.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    pub impairment: Impairment,
    /// Sorted by pod.
    pub sources: Vec<Source>,
    /// Sorted, without duplicates.
    pub destinations: Vec<IpNet>,
}

impl Side {
    fn source(&self, pod: &ObjectKey) -> Option<&Source> {
        self.sources.binary_search_by(|s| s.key.cmp(pod)).ok().map(|i| &self.sources[i])
    }
}

/// Why a selected pod is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExclusionReason {
    /// The pod shares the node's network namespace; shaping it would shape the node.
    HostNetwork,
}

impl ExclusionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExclusionReason::HostNetwork => "HostNetwork",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exclusion {
    pub pod: ObjectKey,
    pub node: Option<String>,
    pub reason: ExclusionReason,
    pub message: String,
}

/// A link resolved against the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub rank: Rank,
    pub error: Option<SpecError>,
    pub summary: Option<Summary>,
    pub forward: Option<Side>,
    pub reverse: Option<Side>,
    /// Sorted by pod.
    pub exclusions: Vec<Exclusion>,
    /// The namespaces `to.podSelector` looks in, sorted.
    pub to_namespaces: Vec<String>,
}

impl Resolution {
    fn sides(&self) -> impl Iterator<Item = (Direction, &Side)> {
        self.forward.iter().map(|s| (Direction::Forward, s)).chain(self.reverse.iter().map(|s| (Direction::Reverse, s)))
    }

    /// Every source pod of either direction.
    fn source_pods(&self) -> BTreeSet<&ObjectKey> {
        self.sides().flat_map(|(_, s)| s.sources.iter().map(|src| &src.key)).collect()
    }
}

fn host_prefix(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn host_network_exclusion(key: &ObjectKey, pod: &PodInfo, role: &str) -> Exclusion {
    Exclusion {
        pod: key.clone(),
        node: pod.node.clone(),
        reason: ExclusionReason::HostNetwork,
        message: format!(
            "{role} pod uses the host's network: its egress and its IP are the node's, so isthmus does not touch it"
        ),
    }
}

/// The running pods each Service selects, computed at most once per [`Planner::recompute`] and shared by
/// every link resolved in it.
#[derive(Debug, Default)]
pub struct EndpointMemo {
    endpoints: BTreeMap<ObjectKey, Vec<ObjectKey>>,
}

impl EndpointMemo {
    fn endpoints(&mut self, index: &Index, key: &ObjectKey, svc: &ServiceInfo) -> &[ObjectKey] {
        self.endpoints.entry(key.clone()).or_insert_with(|| {
            if svc.cluster_ips.is_empty() || svc.selector.is_empty() {
                return Vec::new();
            }
            index
                .pods_in(&key.namespace)
                .filter(|(_, pod)| pod.running && !pod.terminating && svc.selects(pod))
                .map(|(k, _)| k.clone())
                .collect()
        })
    }
}

/// Resolves one link against the index. Only pods in the link's own namespace ever become sources.
pub fn resolve_link(index: &Index, key: &ObjectKey, info: &LinkInfo) -> Resolution {
    resolve_link_with(index, key, info, &mut EndpointMemo::default())
}

fn resolve_link_with(index: &Index, key: &ObjectKey, info: &LinkInfo, memo: &mut EndpointMemo) -> Resolution {
    let mut res = Resolution {
        rank: info.rank.clone(),
        error: None,
        summary: None,
        forward: None,
        reverse: None,
        exclusions: Vec::new(),
        to_namespaces: Vec::new(),
    };
    let (sel, impairments) = match &info.compiled {
        Ok(c) => c,
        Err(e) => {
            res.error = Some(e.clone());
            return res;
        }
    };
    res.summary = Some(impairments.summary());
    let mut exclusions = BTreeSet::new();

    let mut from_pods: Vec<(&ObjectKey, &PodInfo)> = Vec::new();
    for (pk, pod) in index.pods_in(&key.namespace) {
        if !sel.from.matches(&pod.labels) {
            continue;
        }
        if pod.excluded_host_network() {
            exclusions.insert(host_network_exclusion(pk, pod, "source"));
        } else if pod.usable() {
            from_pods.push((pk, pod));
        }
    }

    res.to_namespaces = index.to_namespaces(key, &sel.to_namespaces);
    let mut to_pods: Vec<(&ObjectKey, &PodInfo)> = Vec::new();
    if let Some(to_sel) = &sel.to_pods {
        for ns in &res.to_namespaces {
            for (pk, pod) in index.pods_in(ns) {
                if !to_sel.matches(&pod.labels) {
                    continue;
                }
                if pod.excluded_host_network() {
                    exclusions.insert(host_network_exclusion(pk, pod, "destination"));
                } else if pod.usable() {
                    to_pods.push((pk, pod));
                }
            }
        }
    }

    let mut forward_dests: BTreeSet<IpNet> =
        to_pods.iter().flat_map(|(_, p)| p.ips.iter().copied().map(host_prefix)).collect();
    if sel.services == ServiceInclusion::Matching && !to_pods.is_empty() {
        let destination_pods: BTreeSet<&ObjectKey> = to_pods.iter().map(|(k, _)| *k).collect();
        for ns in &res.to_namespaces {
            for (svc_key, svc) in index.services_in(ns) {
                // A Service qualifies when it routes to at least one running pod, and only to destination pods.
                let endpoints = memo.endpoints(index, svc_key, svc);
                if !endpoints.is_empty() && endpoints.iter().all(|p| destination_pods.contains(p)) {
                    forward_dests.extend(svc.cluster_ips.iter().copied().map(host_prefix));
                }
            }
        }
    }
    forward_dests.extend(sel.cidrs.iter().copied());

    let sources = |pods: &[(&ObjectKey, &PodInfo)]| -> Vec<Source> {
        let mut v: Vec<Source> = pods
            .iter()
            // The security boundary: a link shapes the egress of its own namespace's pods only.
            .filter(|(k, _)| k.namespace == key.namespace)
            .map(|(k, p)| Source {
                node: p.node.clone().unwrap_or_default(),
                key: (*k).clone(),
                uid: p.uid.clone(),
                ips: p.ips.clone(),
            })
            .collect();
        v.sort();
        v
    };

    res.forward = Some(Side {
        impairment: impairments.forward.clone(),
        sources: sources(&from_pods),
        destinations: forward_dests.into_iter().collect(),
    });
    if let Some(reverse) = &impairments.reverse {
        // The spec forbids a reverse direction with a namespaceSelector; `sources` filters regardless.
        let reverse_dests: BTreeSet<IpNet> =
            from_pods.iter().flat_map(|(_, p)| p.ips.iter().copied().map(host_prefix)).collect();
        res.reverse = Some(Side {
            impairment: reverse.clone(),
            sources: sources(&to_pods),
            destinations: reverse_dests.into_iter().collect(),
        });
    }
    res.exclusions = exclusions.into_iter().collect();
    res
}

/// A link's pair and overlap counts for one source pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Pairs this link wins.
    pub pairs: u32,
    /// Other link → (pairs won against it, pairs lost to it).
    pub overlaps: BTreeMap<ObjectKey, (u32, u32)>,
}

/// One source pod's plan and the per-link counts behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodOutput {
    pub node: String,
    pub plan: PodPlan,
    pub link_stats: BTreeMap<ObjectKey, LinkStats>,
}

struct Candidate<'a> {
    link: &'a ObjectKey,
    rank: &'a Rank,
    direction: Direction,
    impairment: &'a Impairment,
}

impl Candidate<'_> {
    fn beats(&self, other: &Candidate<'_>) -> bool {
        (self.rank.sort_key(), self.direction) < (other.rank.sort_key(), other.direction)
    }
}

/// Computes one source pod's plan from the resolutions of the links that list it as a source; `None` when it
/// has no destination.
pub fn compute_pod<'a>(
    pod: &ObjectKey,
    links: impl Iterator<Item = (&'a ObjectKey, &'a Resolution)>,
) -> Option<PodOutput> {
    let mut source: Option<&Source> = None;
    let mut dests: BTreeMap<IpNet, (Candidate<'a>, Vec<Candidate<'a>>)> = BTreeMap::new();
    for (link, res) in links {
        for (direction, side) in res.sides() {
            let Some(src) = side.source(pod) else { continue };
            source.get_or_insert(src);
            for dest in &side.destinations {
                // Traffic to the pod's own address never leaves it.
                if dest.prefix_len() == dest.max_prefix_len() && src.ips.contains(&dest.addr()) {
                    continue;
                }
                let cand = Candidate { link, rank: &res.rank, direction, impairment: &side.impairment };
                match dests.entry(*dest) {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert((cand, Vec::new()));
                    }
                    std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().1.push(cand),
                }
            }
        }
    }
    let source = source?;
    if dests.is_empty() {
        return None;
    }
    let mut link_stats: BTreeMap<ObjectKey, LinkStats> = BTreeMap::new();
    let mut destinations = Vec::with_capacity(dests.len());
    for (dest, (first, others)) in dests {
        let mut winner = &first;
        for c in &others {
            if c.beats(winner) {
                winner = c;
            }
        }
        link_stats.entry(winner.link.clone()).or_default().pairs += 1;
        if !others.is_empty() {
            let losers: BTreeSet<&ObjectKey> =
                std::iter::once(&first).chain(others.iter()).map(|c| c.link).filter(|l| *l != winner.link).collect();
            for loser in losers {
                link_stats.entry(winner.link.clone()).or_default().overlaps.entry(loser.clone()).or_default().0 += 1;
                link_stats.entry(loser.clone()).or_default().overlaps.entry(winner.link.clone()).or_default().1 += 1;
            }
        }
        destinations.push(isthmus_agent_api::DestinationPlan {
            destination: dest,
            impairment: winner.impairment.clone(),
            link: LinkRef {
                namespace: winner.link.namespace.clone(),
                name: winner.link.name.clone(),
                direction: winner.direction,
            },
        });
    }
    Some(PodOutput {
        node: source.node.clone(),
        plan: PodPlan {
            uid: source.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            ips: source.ips.clone(),
            interface: default_interface(),
            host_network: false,
            destinations,
        },
        link_stats,
    })
}

/// One node's plan (pods sorted by namespace and name) and the counts behind each pod's entry.
#[derive(Debug, Clone, PartialEq, Default)]
struct NodeState {
    plan: NodePlan,
    link_stats: BTreeMap<ObjectKey, BTreeMap<ObjectKey, LinkStats>>,
}

impl NodeState {
    fn position(&self, pod: &ObjectKey) -> Result<usize, usize> {
        self.plan.pods.binary_search_by(|p| {
            (p.namespace.as_str(), p.name.as_str()).cmp(&(pod.namespace.as_str(), pod.name.as_str()))
        })
    }
}

/// Another link sharing pairs with this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub link: ObjectKey,
    pub won: u32,
    pub lost: u32,
}

/// What the plan knows about one link, for its status.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFacts {
    pub generation: Option<i64>,
    pub from_summary: String,
    pub to_summary: String,
    pub error: Option<SpecError>,
    pub summary: Option<Summary>,
    /// Distinct pods whose egress the link shapes (both directions).
    pub source_pods: u32,
    /// Distinct destination networks (both directions).
    pub destinations: u32,
    /// (source pod, destination) pairs the link wins.
    pub pairs: u32,
    pub overlaps: Vec<Overlap>,
    pub exclusions: Vec<Exclusion>,
}

/// What an event batch changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Changes {
    /// Nodes whose plan changed (a node whose plan became empty is listed and has no plan any more).
    pub nodes: Vec<String>,
    /// Links whose facts may have changed.
    pub links: Vec<ObjectKey>,
}

/// The index plus cached resolutions and node plans, updated incrementally.
#[derive(Debug, Clone, Default)]
pub struct Planner {
    index: Index,
    resolutions: BTreeMap<ObjectKey, Resolution>,
    /// Source pod → the links that list it as a source (either direction).
    pod_links: BTreeMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// Source pod → the node whose plan holds its entry.
    pod_nodes: BTreeMap<ObjectKey, String>,
    nodes: BTreeMap<String, NodeState>,
    dirty_links: BTreeSet<ObjectKey>,
    dirty_pods: BTreeSet<ObjectKey>,
}

/// Computes every plan from scratch.
pub fn compute(index: Index) -> Planner {
    let mut planner = Planner { dirty_links: index.links.keys().cloned().collect(), index, ..Default::default() };
    planner.recompute();
    planner
}

impl Planner {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    // --- events -------------------------------------------------------------------------------------------

    pub fn apply_pod(&mut self, pod: &Pod) {
        let (key, info) = PodInfo::from_pod(pod);
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
        if let Some(old) = self.index.pods.remove(key) {
            self.pod_changed(key, Some(&old), None);
        }
    }

    pub fn apply_namespace(&mut self, ns: &Namespace) {
        let (name, labels) = Index::namespace_labels(ns);
        if self.index.namespaces.get(&name) != Some(&labels) {
            self.index.namespaces.insert(name, labels);
            self.namespaces_changed();
        }
    }

    pub fn upsert_namespace(&mut self, name: String, labels: crate::index::Labels) {
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
        let (key, info) = LinkInfo::from_link(link);
        self.upsert_link(key, info);
    }

    pub fn upsert_link(&mut self, key: ObjectKey, info: LinkInfo) {
        if self.index.links.get(&key) != Some(&info) {
            self.index.links.insert(key.clone(), info);
            self.dirty_links.insert(key);
        }
    }

    pub fn delete_link(&mut self, key: &ObjectKey) {
        if self.index.links.remove(key).is_some() {
            self.dirty_links.insert(key.clone());
        }
    }

    fn pod_changed(&mut self, key: &ObjectKey, old: Option<&PodInfo>, new: Option<&PodInfo>) {
        for (link_key, link) in &self.index.links {
            if self.dirty_links.contains(link_key) {
                continue;
            }
            let Some(res) = self.resolutions.get(link_key) else { continue };
            let touches = |pod: &PodInfo| pod_touches_link(&self.index, link_key, link, res, key, pod);
            if old.is_some_and(touches) || new.is_some_and(touches) {
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
        for (link_key, link) in &self.index.links {
            if matches!(&link.compiled, Ok((sel, _)) if matches!(sel.to_namespaces, NamespaceScope::Selected(_))) {
                self.dirty_links.insert(link_key.clone());
            }
        }
    }

    // --- computation --------------------------------------------------------------------------------------

    /// Brings every cached result up to date with the events since the last call.
    pub fn recompute(&mut self) -> Changes {
        let mut changed_links: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut memo = EndpointMemo::default();
        for link_key in std::mem::take(&mut self.dirty_links) {
            let new =
                self.index.links.get(&link_key).map(|info| resolve_link_with(&self.index, &link_key, info, &mut memo));
            let old = self.resolutions.remove(&link_key);
            if old == new {
                if let Some(old) = old {
                    self.resolutions.insert(link_key, old);
                }
                continue;
            }
            changed_links.insert(link_key.clone());
            mark_changed_sources(old.as_ref(), new.as_ref(), &mut self.dirty_pods);
            if let Some(old) = &old {
                for pod in old.source_pods() {
                    if let Some(set) = self.pod_links.get_mut(pod) {
                        set.remove(&link_key);
                        if set.is_empty() {
                            self.pod_links.remove(pod);
                        }
                    }
                }
            }
            if let Some(new) = new {
                for pod in new.source_pods() {
                    self.pod_links.entry(pod.clone()).or_default().insert(link_key.clone());
                }
                self.resolutions.insert(link_key, new);
            }
        }

        let mut changed_nodes: BTreeSet<String> = BTreeSet::new();
        for pod in std::mem::take(&mut self.dirty_pods) {
            let links = self.pod_links.get(&pod);
            let out = compute_pod(&pod, links.into_iter().flatten().filter_map(|k| self.resolutions.get_key_value(k)));
            let old_node = self.pod_nodes.get(&pod).cloned();
            let old = old_node.as_ref().and_then(|n| {
                let state = self.nodes.get(n)?;
                let i = state.position(&pod).ok()?;
                Some((n, &state.plan.pods[i], state.link_stats.get(&pod)))
            });
            let unchanged = match (&old, &out) {
                (None, None) => true,
                (Some((n, plan, stats)), Some(o)) => {
                    **n == o.node && **plan == o.plan && stats.is_some_and(|s| *s == o.link_stats)
                }
                _ => false,
            };
            if unchanged {
                continue;
            }
            if let Some(node) = old_node {
                let state = self.nodes.get_mut(&node).expect("a pod's node has a state");
                if let Ok(i) = state.position(&pod) {
                    state.plan.pods.remove(i);
                }
                if let Some(stats) = state.link_stats.remove(&pod) {
                    changed_links.extend(stats.into_keys());
                }
                if state.plan.pods.is_empty() {
                    self.nodes.remove(&node);
                }
                self.pod_nodes.remove(&pod);
                changed_nodes.insert(node);
            }
            if let Some(out) = out {
                changed_links.extend(out.link_stats.keys().cloned());
                let state = self.nodes.entry(out.node.clone()).or_insert_with(|| NodeState {
                    plan: NodePlan { node: out.node.clone(), version: 0, pods: Vec::new() },
                    link_stats: BTreeMap::new(),
                });
                match state.position(&pod) {
                    Ok(i) => state.plan.pods[i] = out.plan,
                    Err(i) => state.plan.pods.insert(i, out.plan),
                }
                state.link_stats.insert(pod.clone(), out.link_stats);
                self.pod_nodes.insert(pod, out.node.clone());
                changed_nodes.insert(out.node);
            }
        }
        Changes { nodes: changed_nodes.into_iter().collect(), links: changed_links.into_iter().collect() }
    }

    /// The node's plan (version 0: the caller numbers the plans it sends); `None` when nothing on the node is
    /// impaired, in which case the agent should get an empty plan.
    pub fn node_plan(&self, node: &str) -> Option<&NodePlan> {
        self.nodes.get(node).map(|s| &s.plan)
    }

    pub fn node_plans(&self) -> impl Iterator<Item = &NodePlan> {
        self.nodes.values().map(|s| &s.plan)
    }

    /// The status facts of a link; `None` for an unknown link.
    pub fn link_facts(&self, key: &ObjectKey) -> Option<LinkFacts> {
        let res = self.resolutions.get(key)?;
        let mut pairs = 0;
        let mut overlaps: BTreeMap<&ObjectKey, (u32, u32)> = BTreeMap::new();
        let source_pods = res.source_pods();
        for pod in &source_pods {
            let stats = self
                .pod_nodes
                .get(*pod)
                .and_then(|n| self.nodes.get(n))
                .and_then(|s| s.link_stats.get(*pod))
                .and_then(|per_link| per_link.get(key));
            if let Some(stats) = stats {
                pairs += stats.pairs;
                for (other, (won, lost)) in &stats.overlaps {
                    let e = overlaps.entry(other).or_default();
                    e.0 += won;
                    e.1 += lost;
                }
            }
        }
        let destinations: BTreeSet<&IpNet> = res.sides().flat_map(|(_, s)| s.destinations.iter()).collect();
        let info = self.index.links.get(key)?;
        Some(LinkFacts {
            generation: info.generation,
            from_summary: info.from_summary.clone(),
            to_summary: info.to_summary.clone(),
            error: res.error.clone(),
            summary: res.summary.clone(),
            source_pods: source_pods.len() as u32,
            destinations: destinations.len() as u32,
            pairs,
            overlaps: overlaps
                .into_iter()
                .map(|(link, (won, lost))| Overlap { link: link.clone(), won, lost })
                .collect(),
            exclusions: res.exclusions.clone(),
        })
    }

    /// Every node plan and every link's facts, for comparisons.
    pub fn snapshot(&self) -> (BTreeMap<String, NodePlan>, BTreeMap<ObjectKey, LinkFacts>) {
        let nodes = self.nodes.iter().map(|(n, s)| (n.clone(), s.plan.clone())).collect();
        let links = self.index.links.keys().filter_map(|k| Some((k.clone(), self.link_facts(k)?))).collect();
        (nodes, links)
    }
}

/// Marks the source pods whose entries a changed resolution can affect: all of a side's sources when what
/// they share (destinations, impairment, rank) changed, otherwise only the sources that came, went or changed.
fn mark_changed_sources(old: Option<&Resolution>, new: Option<&Resolution>, dirty: &mut BTreeSet<ObjectKey>) {
    let rank_same = old.map(|r| &r.rank) == new.map(|r| &r.rank);
    let forward = (old.and_then(|r| r.forward.as_ref()), new.and_then(|r| r.forward.as_ref()));
    let reverse = (old.and_then(|r| r.reverse.as_ref()), new.and_then(|r| r.reverse.as_ref()));
    for (a, b) in [forward, reverse] {
        match (a, b) {
            (Some(a), Some(b)) if rank_same && a.destinations == b.destinations && a.impairment == b.impairment => {
                // Both lists are sorted by pod: walk them together.
                let (mut i, mut j) = (0, 0);
                while i < a.sources.len() || j < b.sources.len() {
                    match (a.sources.get(i), b.sources.get(j)) {
                        (Some(x), Some(y)) if x.key == y.key => {
                            if x != y {
                                dirty.insert(x.key.clone());
                            }
                            i += 1;
                            j += 1;
                        }
                        (Some(x), Some(y)) if x.key < y.key => {
                            dirty.insert(x.key.clone());
                            i += 1;
                        }
                        (Some(_), Some(y)) | (None, Some(y)) => {
                            dirty.insert(y.key.clone());
                            j += 1;
                        }
                        (Some(x), None) => {
                            dirty.insert(x.key.clone());
                            i += 1;
                        }
                        (None, None) => unreachable!(),
                    }
                }
            }
            (a, b) => {
                for side in a.into_iter().chain(b) {
                    dirty.extend(side.sources.iter().map(|s| s.key.clone()));
                }
            }
        }
    }
}

/// Whether a pod can change a link's resolution: it is (or was) a source, a destination, or an endpoint of a
/// Service in the link's destination namespaces.
fn pod_touches_link(
    index: &Index,
    link_key: &ObjectKey,
    link: &LinkInfo,
    res: &Resolution,
    pod_key: &ObjectKey,
    pod: &PodInfo,
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
    sel.services == ServiceInclusion::Matching && index.services_in(&pod_key.namespace).any(|(_, svc)| svc.selects(pod))
}

impl LinkFacts {
    /// Writes what the plan knows into a status: observed generation, summaries, counts, overlaps and
    /// exclusions (as failures). Conditions and the applied/failed counts come from the agents' replies and are
    /// the controller's to set.
    pub fn fill_status(&self, status: &mut NetworkLinkStatus) {
        status.observed_generation = self.generation;
        status.from = Some(self.from_summary.clone());
        status.to = Some(self.to_summary.clone());
        if let Some(s) = &self.summary {
            status.latency = Some(s.latency.clone());
            status.loss = Some(s.loss.clone());
            status.bandwidth = Some(s.bandwidth.clone());
            status.expected_round_trip = Some(s.expected_round_trip.clone());
        }
        status.source_pods = self.source_pods;
        status.destinations = self.destinations;
        status.pairs = self.pairs;
        status.overlaps = self
            .overlaps
            .iter()
            .take(MAX_STATUS_OVERLAPS)
            .map(|o| OverlapStatus { link: o.link.name.clone(), won: o.won, lost: o.lost })
            .collect();
        status.failures = self
            .exclusions
            .iter()
            .take(MAX_STATUS_FAILURES)
            .map(|e| PodFailure {
                pod: e.pod.to_string(),
                node: e.node.clone(),
                reason: e.reason.as_str().to_owned(),
                message: e.message.clone(),
            })
            .collect();
        status.failures_omitted = self.exclusions.len().saturating_sub(MAX_STATUS_FAILURES) as u32;
    }
}
