//! Stage 1 of the plan: one link resolved against the index into its source pods, its destinations per
//! direction and the pods it must leave alone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{Direction, Impairment, LinkRef};
use kube::core::{Selector, SelectorExt};

use super::limits::{PlanLimits, Refusal};
use crate::api::{ServiceInclusion, SpecError, Summary};
use crate::failure::FailureReason;
use crate::index::{Index, LinkInfo, ObjectKey, PodInfo, Rank, ServiceInfo};

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
    /// Shared with every destination the side plans.
    pub impairment: Arc<Impairment>,
    /// The link and this direction, shared likewise.
    pub link: Arc<LinkRef>,
    /// Sorted by pod.
    pub sources: Vec<Source>,
    /// Sorted, without duplicates.
    pub destinations: Vec<IpNet>,
    /// When the side's impairment changes with time (`spec.schedule`): what the agents follow.
    pub timeline: Option<Arc<isthmus_agent_api::schedule::Timeline>>,
}

impl Side {
    pub(super) fn source(&self, pod: &ObjectKey) -> Option<&Source> {
        self.sources.binary_search_by(|s| s.key.cmp(pod)).ok().map(|i| &self.sources[i])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exclusion {
    pub pod: ObjectKey,
    pub node: Option<String>,
    pub reason: FailureReason,
    pub message: String,
}

/// A link resolved against the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub rank: Rank,
    pub error: Option<SpecError>,
    pub summary: Option<Summary>,
    /// Set when the link asks for more than the limits allow; it then has no sides.
    pub refusal: Option<Refusal>,
    pub forward: Option<Side>,
    pub reverse: Option<Side>,
    /// Sorted by pod.
    pub exclusions: Vec<Exclusion>,
    /// The namespaces `to.podSelector` looks in, sorted.
    pub to_namespaces: Vec<String>,
    /// `spec.verify`: whether the agents probe the link's pairs.
    pub verify: bool,
    /// The forward destinations that are not pods (Service ClusterIPs, `to.cidrs`), sorted: never probed.
    pub unprobed: Vec<IpNet>,
}

impl Resolution {
    fn unresolved(rank: Rank, verify: bool) -> Self {
        Resolution {
            rank,
            error: None,
            summary: None,
            refusal: None,
            forward: None,
            reverse: None,
            exclusions: Vec::new(),
            to_namespaces: Vec::new(),
            verify,
            unprobed: Vec::new(),
        }
    }

    pub(super) fn sides(&self) -> impl Iterator<Item = (Direction, &Side)> {
        self.forward.iter().map(|s| (Direction::Forward, s)).chain(self.reverse.iter().map(|s| (Direction::Reverse, s)))
    }

    /// Distinct destinations of both directions; for a refused link, the count it was refused for; none while the
    /// link has no source pod. A link shapes its own namespace's pods only, and the destinations it shapes are in
    /// those pods' own kernel state (their filters or capture routes), which the link's author can read; without
    /// a source pod the count would be all that `to.namespaceSelector` tells about other namespaces' pods, which
    /// the author may not be allowed to list.
    pub(super) fn destination_count(&self) -> u32 {
        if let Some(destinations) = self.refusal.as_ref().and_then(Refusal::destinations) {
            return destinations;
        }
        if self.source_pods().is_empty() {
            return 0;
        }
        match (&self.forward, &self.reverse) {
            (Some(f), None) => f.destinations.len() as u32,
            _ => self.sides().flat_map(|(_, s)| s.destinations.iter()).collect::<BTreeSet<_>>().len() as u32,
        }
    }

    /// The pairs the link asks for: each side's sources times its destinations, before overlaps (which only
    /// move pairs between links) and the per-pod limit (which only removes some). What the pair limits count.
    pub(super) fn pair_bound(&self) -> u64 {
        self.sides().map(|(_, s)| s.sources.len() as u64 * s.destinations.len() as u64).sum()
    }

    /// Every source pod of either direction.
    pub(super) fn source_pods(&self) -> BTreeSet<&ObjectKey> {
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
        reason: FailureReason::HostNetwork,
        message: host_network(role),
    }
}

/// Why a host-network pod is left alone; `role` is `source` or `destination`.
pub fn host_network(role: &str) -> String {
    format!("{role} pod uses the host's network: its egress and its IP are the node's, so isthmus does not touch it")
}

/// The running pods each Service selects (its endpoints), computed at most once per [`Planner::recompute`] and shared by
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
                .filter(|(_, pod)| pod.serves() && svc.selects(pod))
                .map(|(k, _)| k.clone())
                .collect()
        })
    }
}

/// Resolves one link against the index. Only pods in the link's own namespace ever become sources.
pub fn resolve_link(index: &Index, key: &ObjectKey, info: &LinkInfo, limits: &PlanLimits) -> Resolution {
    resolve_link_with(index, key, info, limits, &mut EndpointMemo::default())
}

pub(super) fn resolve_link_with(
    index: &Index,
    key: &ObjectKey,
    info: &LinkInfo,
    limits: &PlanLimits,
    memo: &mut EndpointMemo,
) -> Resolution {
    let mut res = Resolution::unresolved(info.rank.clone(), info.verify);
    let (sel, impairments) = match &info.compiled {
        Ok(c) => c,
        Err(e) => {
            res.error = Some(e.clone());
            return res;
        }
    };
    res.summary = Some(impairments.summary());
    let mut exclusions = Exclusions { namespace: &key.namespace, found: BTreeSet::new() };
    let from_pods = select_pods(index, [key.namespace.as_str()], &sel.from, "source", &mut exclusions);
    res.to_namespaces = index.to_namespaces(key, &sel.to_namespaces);
    let to_pods = match &sel.to_pods {
        Some(to) => {
            select_pods(index, res.to_namespaces.iter().map(String::as_str), to, "destination", &mut exclusions)
        }
        None => Vec::new(),
    };

    let pod_dests = host_prefixes(&to_pods);
    let mut forward_dests = pod_dests.clone();
    if sel.services == ServiceInclusion::Matching && !to_pods.is_empty() {
        forward_dests.extend(service_destinations(index, memo, &res.to_namespaces, &to_pods));
    }
    forward_dests.extend(sel.cidrs.iter().copied());
    // Only pods answer probes: a ClusterIP is translated before it leaves the node, and a CIDR may be outside
    // the cluster, where isthmus sends nothing of its own.
    res.unprobed = forward_dests.difference(&pod_dests).copied().collect();
    let link_ref =
        |direction| Arc::new(LinkRef { namespace: key.namespace.clone(), name: key.name.clone(), direction });
    res.forward = Some(Side {
        impairment: Arc::new(impairments.forward.clone()),
        link: link_ref(Direction::Forward),
        sources: sources(key, &from_pods),
        destinations: forward_dests.into_iter().collect(),
        timeline: info.timelines.as_ref().and_then(|t| t.forward.clone()),
    });
    if let Some(reverse) = &impairments.reverse {
        // The spec forbids a reverse direction with a namespaceSelector; `sources` filters regardless.
        res.reverse = Some(Side {
            impairment: Arc::new(reverse.clone()),
            link: link_ref(Direction::Reverse),
            sources: sources(key, &to_pods),
            destinations: host_prefixes(&from_pods).into_iter().collect(),
            timeline: info.timelines.as_ref().and_then(|t| t.reverse.clone()),
        });
    }
    res.exclusions = exclusions.found.into_iter().collect();
    let destinations = res.destination_count();
    let pairs = res.pair_bound();
    if res.source_pods().is_empty() {
        // Nothing to shape, so nothing to refuse: a refusal would tell how many pods of other namespaces the
        // selectors match (see `destination_count`).
    } else if destinations > limits.per_link() {
        res.refusal = Some(Refusal::LinkDestinations { destinations, limit: limits.per_link() });
    } else if pairs > u64::from(limits.pairs_per_link()) {
        res.refusal = Some(Refusal::LinkPairs { pairs, destinations, limit: limits.pairs_per_link() });
    }
    if res.refusal.is_some() {
        res.forward = None;
        res.reverse = None;
    }
    res
}

type Selected<'a> = Vec<(&'a ObjectKey, &'a PodInfo)>;

/// The pods a link leaves alone, for its status: only those of the link's own namespace. A link's author may be a
/// tenant who cannot list pods elsewhere, and the status must tell them nothing their own access would not: a
/// host-network pod of another namespace is left alone without a trace.
struct Exclusions<'a> {
    namespace: &'a str,
    found: BTreeSet<Exclusion>,
}

/// The pods of `namespaces` that `selector` picks and the plan can use; the running host-network pods it picks
/// go to `exclusions` instead.
fn select_pods<'a>(
    index: &'a Index,
    namespaces: impl IntoIterator<Item = &'a str>,
    selector: &Selector,
    role: &str,
    exclusions: &mut Exclusions<'_>,
) -> Selected<'a> {
    let mut selected = Vec::new();
    for ns in namespaces {
        for (pk, pod) in index.pods_in(ns) {
            if !selector.matches(&pod.labels) {
                continue;
            }
            if pod.excluded_host_network() {
                if pk.namespace == exclusions.namespace {
                    exclusions.found.insert(host_network_exclusion(pk, pod, role));
                }
            } else if pod.usable() {
                selected.push((pk, pod));
            }
        }
    }
    selected
}

fn host_prefixes(pods: &Selected<'_>) -> BTreeSet<IpNet> {
    pods.iter().flat_map(|(_, p)| p.ips.iter().copied().map(host_prefix)).collect()
}

/// The ClusterIPs of the Services in `namespaces` that front destination pods only.
fn service_destinations(
    index: &Index,
    memo: &mut EndpointMemo,
    namespaces: &[String],
    to_pods: &Selected<'_>,
) -> BTreeSet<IpNet> {
    let destination_pods: BTreeSet<&ObjectKey> = to_pods.iter().map(|(k, _)| *k).collect();
    let mut dests = BTreeSet::new();
    for ns in namespaces {
        for (svc_key, svc) in index.services_in(ns) {
            // A Service qualifies when it routes to at least one running pod, and only to destination pods. One
            // that routes to none of them cannot: asking the destinations first spares most Services the walk
            // over their namespace's pods.
            if !to_pods.iter().any(|(k, p)| k.namespace == svc_key.namespace && p.serves() && svc.selects(p)) {
                continue;
            }
            let endpoints = memo.endpoints(index, svc_key, svc);
            if !endpoints.is_empty() && endpoints.iter().all(|p| destination_pods.contains(p)) {
                dests.extend(svc.cluster_ips.iter().copied().map(host_prefix));
            }
        }
    }
    dests
}

fn sources(link: &ObjectKey, pods: &Selected<'_>) -> Vec<Source> {
    let mut v: Vec<Source> = pods
        .iter()
        // The security boundary: a link shapes the egress of its own namespace's pods only.
        .filter(|(k, _)| k.namespace == link.namespace)
        .map(|(k, p)| Source {
            node: p.node.clone().unwrap_or_default(),
            key: (*k).clone(),
            uid: p.uid.clone(),
            ips: p.ips.clone(),
        })
        .collect();
    v.sort();
    v
}

/// Marks the source pods whose entries a changed resolution can affect: all of a side's sources when what
/// they share (destinations, impairment, rank) changed, otherwise only the sources that came, went or changed.
pub(super) fn mark_changed_sources(
    old: Option<&Resolution>,
    new: Option<&Resolution>,
    dirty: &mut BTreeSet<ObjectKey>,
) {
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
