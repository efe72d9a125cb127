//! What a node's agent must know beside its pods: the links it must not probe — those whose `spec.verify` is
//! false (`NodePlan::unverified`) and the destinations that are not pods (`NodePlan::unprobed`) — and the
//! timelines of the scheduled links its destinations name (`NodePlan::timelines`). All follow from the node's
//! pods and the links' resolutions, so they are recomputed for the nodes a batch touched.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use isthmus_agent_api::{Direction, LinkId, LinkRef, LinkTimeline, NodePlan};

use super::selection::Resolution;
use crate::index::ObjectKey;

/// Fills `plan.unverified`, `plan.unprobed` and `plan.timelines` from the links its destinations name; true when
/// any changed.
pub(super) fn annotate(plan: &mut NodePlan, resolutions: &BTreeMap<ObjectKey, Resolution>) -> bool {
    let mut timelines: BTreeMap<LinkRef, LinkTimeline> = BTreeMap::new();
    let mut unverified: BTreeSet<LinkId> = BTreeSet::new();
    let mut unprobed: BTreeSet<IpNet> = BTreeSet::new();
    let mut last: Option<(&LinkRef, Option<&Resolution>)> = None;
    for dest in plan.pods.iter().flat_map(|p| &p.destinations) {
        let (ns, name) = (dest.link.namespace.as_str(), dest.link.name.as_str());
        // Destinations of one link sit together; look the link up once per run of them. A link's destinations
        // share one `LinkRef`: the pointer settles most of them without comparing names.
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
        if let Some(timeline) = side.and_then(|s| s.timeline.as_ref())
            && !timelines.contains_key(&*dest.link)
        {
            let link = (*dest.link).clone();
            timelines.insert(link.clone(), LinkTimeline { link, timeline: (**timeline).clone() });
        }
        if !resolution.verify {
            unverified.insert(LinkId { namespace: ns.to_owned(), name: name.to_owned() });
        }
        if resolution.unprobed.binary_search(&dest.destination).is_ok() {
            unprobed.insert(dest.destination);
        }
    }
    let unverified: Vec<LinkId> = unverified.into_iter().collect();
    let unprobed: Vec<IpNet> = unprobed.into_iter().collect();
    let timelines: Vec<LinkTimeline> = timelines.into_values().collect();
    let changed = plan.unverified != unverified || plan.unprobed != unprobed || plan.timelines != timelines;
    plan.unverified = unverified;
    plan.unprobed = unprobed;
    plan.timelines = timelines;
    changed
}
