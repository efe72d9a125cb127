//! The incremental planner: the index, each link's cached resolution and each node's cached plan. Events mark
//! the links they can affect as stale (`events.rs`); [`Planner::recompute`] re-resolves the stale links and
//! recomputes only the source pods whose entries a changed resolution can affect.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_agent_api::{NodePlan, PodPlan};

use super::limits::{PlanLimits, Refusal};
use super::selection::{EndpointMemo, Resolution, mark_changed_sources, resolve_link_with};
use super::verify::{NodeShares, PodShare};
use super::winner::{LinkStats, PodOutput, compute_pod};
use crate::index::{Index, ObjectKey};

/// One node's plan (pods sorted by namespace and name), what lies behind each pod's entry, and the plan's
/// `unverified`, `unprobed` and `timelines` counted over the pods' shares (verify.rs).
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct NodeState {
    pub(super) plan: NodePlan,
    pub(super) pod_states: BTreeMap<ObjectKey, PodState>,
    annotations: NodeShares,
}

/// Behind one pod's entry: the counts per link (for the links' status facts) and its share of its node's lists.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct PodState {
    pub(super) link_stats: BTreeMap<ObjectKey, LinkStats>,
    share: PodShare,
}

impl NodeState {
    fn position(&self, pod: &ObjectKey) -> Result<usize, usize> {
        let key =
            |p: &PodPlan| (p.namespace.as_str(), p.name.as_str()).cmp(&(pod.namespace.as_str(), pod.name.as_str()));
        // A full computation adds each node's pods in order: the place of the next is the end.
        match self.plan.pods.last().map(key) {
            Some(std::cmp::Ordering::Less) => Err(self.plan.pods.len()),
            _ => self.plan.pods.binary_search_by(key),
        }
    }
}

/// What an event batch changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Changes {
    /// Nodes whose plan changed (a node whose plan became empty is listed and has no plan any more).
    pub nodes: Vec<String>,
    /// Links whose facts may have changed.
    pub links: Vec<ObjectKey>,
    /// A link was added, changed or removed, or a namespace's labels changed: which links select a pod may
    /// differ even where no resolution did (a pod that does not run yet is in none).
    pub selection: bool,
}

/// The index plus cached resolutions and node plans, updated incrementally.
#[derive(Debug, Clone, Default)]
pub struct Planner {
    pub(super) limits: PlanLimits,
    pub(super) index: Index,
    pub(super) resolutions: BTreeMap<ObjectKey, Resolution>,
    /// Links refused whole because their pairs, with those of the links that rank before them, exceed the
    /// total (limits.rs); their resolutions stay cached, so that they are planned as soon as there is room.
    pub(super) total_refused: BTreeMap<ObjectKey, Refusal>,
    /// Source pod → the links that list it as a source (either direction).
    pub(super) pod_links: BTreeMap<ObjectKey, BTreeSet<ObjectKey>>,
    /// Source pod → the node whose plan holds its entry.
    pub(super) pod_nodes: BTreeMap<ObjectKey, String>,
    pub(super) nodes: BTreeMap<String, NodeState>,
    pub(super) dirty_links: BTreeSet<ObjectKey>,
    pub(super) dirty_pods: BTreeSet<ObjectKey>,
    /// Since the last recompute: see [`Changes::selection`].
    pub(super) selection_changed: bool,
    /// Pods whose share of their node's `unverified`/`unprobed`/`timelines` may differ: they are a source of a
    /// link whose resolution or admission changed (a pod whose entry changes gets its share with the entry).
    pub(super) dirty_annotations: BTreeSet<ObjectKey>,
    /// The links whose schedule replays a trace, as last applied: compiled again when their ConfigMap changes.
    pub(super) trace_links: BTreeMap<ObjectKey, std::sync::Arc<crate::api::NetworkLink>>,
}

/// Computes every plan from scratch, within the default limits.
pub fn compute(index: Index) -> Planner {
    compute_with(index, PlanLimits::DEFAULT)
}

/// Computes every plan from scratch.
pub fn compute_with(index: Index, limits: PlanLimits) -> Planner {
    let mut planner = Planner::with_limits(limits);
    planner.dirty_links = index.links.keys().cloned().collect();
    planner.index = index;
    planner.recompute();
    planner
}

impl Planner {
    /// An empty planner within the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_limits(limits: PlanLimits) -> Self {
        Planner { limits, ..Self::default() }
    }

    pub fn limits(&self) -> PlanLimits {
        self.limits
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Brings every cached result up to date with the events since the last call.
    pub fn recompute(&mut self) -> Changes {
        let mut changed_links = self.resolve_stale_links();
        if !changed_links.is_empty() {
            self.admit_within_total(&mut changed_links);
        }
        let mut changed_nodes: BTreeSet<String> = BTreeSet::new();
        // The nodes whose lists (unverified, unprobed, timelines) may differ from their pods' shares.
        let mut annotate: BTreeSet<String> = BTreeSet::new();
        for pod in std::mem::take(&mut self.dirty_pods) {
            self.recompute_pod(pod, &mut changed_nodes, &mut annotate, &mut changed_links);
        }
        for pod in std::mem::take(&mut self.dirty_annotations) {
            self.reshare(&pod, &mut annotate);
        }
        for node in annotate {
            if let Some(state) = self.nodes.get_mut(&node)
                && state.annotations.write(&mut state.plan)
            {
                changed_nodes.insert(node);
            }
        }
        Changes {
            nodes: changed_nodes.into_iter().collect(),
            links: changed_links.into_iter().collect(),
            selection: std::mem::take(&mut self.selection_changed),
        }
    }

    /// Re-resolves the stale links; returns those whose resolution changed, after marking the source pods
    /// that the change can affect.
    fn resolve_stale_links(&mut self) -> BTreeSet<ObjectKey> {
        let mut changed_links: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut memo = EndpointMemo::default();
        for link_key in std::mem::take(&mut self.dirty_links) {
            let new = self
                .index
                .links
                .get(&link_key)
                .map(|info| resolve_link_with(&self.index, &link_key, info, &self.limits, &mut memo));
            let old = self.resolutions.remove(&link_key);
            if old == new {
                if let Some(old) = old {
                    self.resolutions.insert(link_key, old);
                }
                continue;
            }
            changed_links.insert(link_key.clone());
            for r in old.iter().chain(new.iter()) {
                self.dirty_annotations.extend(r.source_pods().into_iter().cloned());
            }
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
        changed_links
    }

    /// Admits links in rank order while their pairs stay within the total; a link whose admission changed has
    /// its sources recomputed, and every link whose refusal changed is reported changed.
    fn admit_within_total(&mut self, changed_links: &mut BTreeSet<ObjectKey>) {
        let mut ranked: Vec<(&ObjectKey, &Resolution)> = self.resolutions.iter().collect();
        ranked.sort_by(|(ka, a), (kb, b)| (a.rank.sort_key(), *ka).cmp(&(b.rank.sort_key(), *kb)));
        let limit = self.limits.pairs_total();
        let mut admitted = 0u64;
        let mut refused = BTreeMap::new();
        for (key, res) in ranked {
            let pairs = res.pair_bound();
            if admitted + pairs <= u64::from(limit) {
                admitted += pairs;
            } else {
                let destinations = res.destination_count();
                refused.insert(key.clone(), Refusal::TotalPairs { pairs, admitted, destinations, limit });
            }
        }
        let before = std::mem::replace(&mut self.total_refused, refused);
        let keys: BTreeSet<ObjectKey> = before.keys().chain(self.total_refused.keys()).cloned().collect();
        for key in keys {
            let (was, is) = (before.get(&key), self.total_refused.get(&key));
            if was == is {
                continue;
            }
            changed_links.insert(key.clone());
            if was.is_some() != is.is_some()
                && let Some(res) = self.resolutions.get(&key)
            {
                self.dirty_pods.extend(res.source_pods().into_iter().cloned());
                self.dirty_annotations.extend(res.source_pods().into_iter().cloned());
            }
        }
    }

    /// The resolutions of the links that list `pod` as a source and are within the total.
    pub(super) fn admitted_links<'a>(
        &'a self,
        pod: &ObjectKey,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Resolution)> + 'a {
        let links = self.pod_links.get(pod);
        links
            .into_iter()
            .flatten()
            .filter(|k| !self.total_refused.contains_key(*k))
            .filter_map(|k| self.resolutions.get_key_value(k))
    }

    /// Recomputes one source pod's entry and moves it between node plans when its node or content changed; a
    /// node that takes back a share the pod had is listed in `annotate`.
    fn recompute_pod(
        &mut self,
        pod: ObjectKey,
        changed_nodes: &mut BTreeSet<String>,
        annotate: &mut BTreeSet<String>,
        changed_links: &mut BTreeSet<ObjectKey>,
    ) {
        let out = compute_pod(&pod, self.admitted_links(&pod), self.limits.per_pod());
        if self.entry_unchanged(&pod, out.as_ref()) {
            return;
        }
        if let Some(node) = self.pod_nodes.remove(&pod) {
            let state = self.nodes.get_mut(&node).expect("a pod's node has a state");
            if let Ok(i) = state.position(&pod) {
                state.plan.pods.remove(i);
            }
            if let Some(gone) = state.pod_states.remove(&pod) {
                changed_links.extend(gone.link_stats.into_keys());
                if gone.share != PodShare::default() {
                    state.annotations.remove(&gone.share);
                    annotate.insert(node.clone());
                }
            }
            if state.plan.pods.is_empty() {
                self.nodes.remove(&node);
            }
            changed_nodes.insert(node);
        }
        if let Some(out) = out {
            for link in out.link_stats.keys() {
                insert_cloned(changed_links, link);
            }
            // Its share, taken back with the old entry above, is added here, under the batch's resolutions; `reshare`
            // need not come back to it.
            let share = PodShare::of(&out.plan, &self.resolutions);
            self.dirty_annotations.remove(&pod);
            if !self.nodes.contains_key(&out.node) {
                let plan = NodePlan { node: out.node.clone(), ..NodePlan::default() };
                self.nodes.insert(out.node.clone(), NodeState { plan, ..NodeState::default() });
            }
            let state = self.nodes.get_mut(&out.node).expect("inserted above");
            match state.position(&pod) {
                Ok(i) => state.plan.pods[i] = out.plan,
                Err(i) => state.plan.pods.insert(i, out.plan),
            }
            if share != PodShare::default() {
                state.annotations.add(&share);
                insert_cloned(annotate, &out.node);
            }
            state.pod_states.insert(pod.clone(), PodState { link_stats: out.link_stats, share });
            self.pod_nodes.insert(pod, out.node.clone());
            changed_nodes.insert(out.node);
        }
    }

    /// Recomputes a pod's share of its node's lists; lists the node when the share changed. A pod without an
    /// entry has no share: its node took it back when the entry went (`recompute_pod`).
    fn reshare(&mut self, pod: &ObjectKey, annotate: &mut BTreeSet<String>) {
        let Some(node) = self.pod_nodes.get(pod) else { return };
        let state = self.nodes.get_mut(node).expect("a pod's node has a state");
        let (Ok(i), Some(behind)) = (state.position(pod), state.pod_states.get_mut(pod)) else { return };
        let share = PodShare::of(&state.plan.pods[i], &self.resolutions);
        if behind.share == share {
            return;
        }
        state.annotations.remove(&behind.share);
        state.annotations.add(&share);
        behind.share = share;
        annotate.insert(node.clone());
    }

    /// Whether the pod's cached entry (node, plan, counts) is already `out`.
    fn entry_unchanged(&self, pod: &ObjectKey, out: Option<&PodOutput>) -> bool {
        let old = self.pod_nodes.get(pod).and_then(|n| {
            let state = self.nodes.get(n)?;
            let i = state.position(pod).ok()?;
            Some((n, &state.plan.pods[i], state.pod_states.get(pod).map(|p| &p.link_stats)))
        });
        match (old, out) {
            (None, None) => true,
            (Some((n, plan, stats)), Some(o)) => {
                *n == o.node && *plan == o.plan && stats.is_some_and(|s| *s == o.link_stats)
            }
            _ => false,
        }
    }

    /// The node's plan (version 0: the caller numbers the plans it sends); `None` when nothing on the node is
    /// impaired, in which case the agent should get an empty plan.
    pub fn node_plan(&self, node: &str) -> Option<&NodePlan> {
        self.nodes.get(node).map(|s| &s.plan)
    }

    pub fn node_plans(&self) -> impl Iterator<Item = &NodePlan> {
        self.nodes.values().map(|s| &s.plan)
    }

    /// A source pod's entry and the node whose plan holds it; `None` when no plan holds the pod.
    pub fn pod_entry(&self, pod: &ObjectKey) -> Option<(&str, &PodPlan)> {
        let node = self.pod_nodes.get(pod)?;
        let state = self.nodes.get(node)?;
        let i = state.position(pod).ok()?;
        Some((node, &state.plan.pods[i]))
    }
}

/// Adds `item` to `set`, cloning it only when the set lacks it: most pods share their links and nodes with many
/// others, and a clone is two strings.
fn insert_cloned<T: Ord + Clone>(set: &mut BTreeSet<T>, item: &T) {
    if !set.contains(item) {
        set.insert(item.clone());
    }
}
