//! What a node's agent must know beside its pods: the links it must not probe — those whose `spec.verify` is
//! false (`NodePlan::unverified`) and the destinations that are not pods (`NodePlan::unprobed`) — and the
//! timelines of the scheduled links its destinations name (`NodePlan::timelines`). All follow from the node's
//! pods and the links' resolutions. Each pod's share is kept and the node's lists are counted over the shares,
//! so that a batch costs the destinations of the pods it touched: walking the whole plan of every node a batch
//! touched cost a destination pod's IP change every destination of every node that runs one of its link's
//! sources (1,000,000 at 10,000 pods × 100 links, docs/benchmarks.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::schedule::Timeline;
use isthmus_agent_api::{Direction, LinkId, LinkRef, LinkTimeline, NodePlan, PodPlan};

use super::selection::Resolution;
use crate::index::ObjectKey;

/// What one pod's destinations name: each list sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct PodShare {
    unverified: Vec<LinkId>,
    unprobed: Vec<IpNet>,
    timelines: Vec<(Arc<LinkRef>, Arc<Timeline>)>,
}

impl PodShare {
    /// The share of a pod whose entry is `pod`, under the current resolutions.
    pub(super) fn of(pod: &PodPlan, resolutions: &BTreeMap<ObjectKey, Resolution>) -> Self {
        let mut share = PodShare::default();
        let mut last: Option<(&LinkRef, Option<&Resolution>)> = None;
        for dest in &pod.destinations {
            let (ns, name) = (dest.link.namespace.as_str(), dest.link.name.as_str());
            // Destinations of one link sit together; look the link up once per run of them. A link's
            // destinations share one `LinkRef`: the pointer settles most of them without comparing names.
            let resolution = match last {
                Some((l, r)) if std::ptr::eq(l, &*dest.link) || (l.namespace == ns && l.name == name) => r,
                _ => {
                    let r = resolutions.get(&ObjectKey::new(ns, name));
                    last = Some((&dest.link, r));
                    r
                }
            };
            let Some(resolution) = resolution else { continue };
            let side = match dest.link.direction {
                Direction::Forward => resolution.forward.as_ref(),
                Direction::Reverse => resolution.reverse.as_ref(),
            };
            if let Some(timeline) = side.and_then(|s| s.timeline.as_ref()) {
                share.timelines.push((dest.link.clone(), timeline.clone()));
            }
            if !resolution.verify {
                share.unverified.push(LinkId { namespace: ns.to_owned(), name: name.to_owned() });
            }
            if resolution.unprobed.binary_search(&dest.destination).is_ok() {
                share.unprobed.push(dest.destination);
            }
        }
        share.unverified.sort_unstable();
        share.unverified.dedup();
        share.unprobed.sort_unstable();
        share.unprobed.dedup();
        share.timelines.sort_by(|a, b| a.0.cmp(&b.0));
        share.timelines.dedup_by(|a, b| a.0 == b.0);
        share
    }
}

/// A node's lists, each entry with the number of its pods' shares that name it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct NodeShares {
    unverified: BTreeMap<LinkId, u32>,
    unprobed: BTreeMap<IpNet, u32>,
    /// A link direction's timeline is the same in every share that names it: a resolution's change recomputes
    /// the shares of all its sources in one batch (planner.rs).
    timelines: BTreeMap<Arc<LinkRef>, (u32, Arc<Timeline>)>,
}

impl NodeShares {
    pub(super) fn add(&mut self, share: &PodShare) {
        for id in &share.unverified {
            *self.unverified.entry(id.clone()).or_default() += 1;
        }
        for net in &share.unprobed {
            *self.unprobed.entry(*net).or_default() += 1;
        }
        for (link, timeline) in &share.timelines {
            let entry = self.timelines.entry(link.clone()).or_insert_with(|| (0, timeline.clone()));
            entry.0 += 1;
            entry.1 = timeline.clone();
        }
    }

    /// Takes back a share that [`NodeShares::add`] added.
    pub(super) fn remove(&mut self, share: &PodShare) {
        for id in &share.unverified {
            release(&mut self.unverified, id, |n| n);
        }
        for net in &share.unprobed {
            release(&mut self.unprobed, net, |n| n);
        }
        for (link, _) in &share.timelines {
            release(&mut self.timelines, link, |(n, _)| n);
        }
    }

    /// Writes the lists into `plan`; true when any changed. Compares before it copies: a node whose lists stayed
    /// as they were costs no timeline's copy.
    pub(super) fn write(&self, plan: &mut NodePlan) -> bool {
        let same = plan.unverified.iter().eq(self.unverified.keys())
            && plan.unprobed.iter().eq(self.unprobed.keys())
            && plan
                .timelines
                .iter()
                .map(|t| (&t.link, &t.timeline))
                .eq(self.timelines.iter().map(|(l, (_, t))| (&**l, &**t)));
        if same {
            return false;
        }
        plan.unverified = self.unverified.keys().cloned().collect();
        plan.unprobed = self.unprobed.keys().copied().collect();
        plan.timelines = self
            .timelines
            .iter()
            .map(|(link, (_, timeline))| LinkTimeline { link: (**link).clone(), timeline: (**timeline).clone() })
            .collect();
        true
    }
}

fn release<K: Ord, V>(map: &mut BTreeMap<K, V>, key: &K, count: fn(&mut V) -> &mut u32) {
    debug_assert!(map.contains_key(key), "a share takes back only what it added");
    if let Some(value) = map.get_mut(key) {
        let n = count(value);
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}
