//! Which impairment each destination has at an instant when its link changes with time, and when that next
//! changes. Pure: the plan's destinations (each with its link's own impairment), the plan's timelines, an instant
//! on the agent's clock (Unix milliseconds). The apply, the resync and the phase timer all install what
//! [`Timelines::in_force`] gives, so an agent that restarts mid-schedule installs the phase of the moment.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use isthmus_agent_api::schedule::{Cursor, Position, Timeline};
use isthmus_agent_api::{Impairment, LinkRef, LinkTimeline};

use super::plan::Destination;

/// The plan's timelines by link direction, each with the cursor of its last evaluation: a jittered timeline
/// cannot skip whole cycles, and walking a week of one-second flaps from its start at every switch of every pod
/// would cost more as the schedule ages.
#[derive(Debug, Default)]
pub struct Timelines(BTreeMap<LinkRef, (Timeline, Mutex<Cursor>)>);

impl Timelines {
    pub fn new(list: Vec<LinkTimeline>) -> Self {
        Timelines(list.into_iter().map(|t| (t.link, (t.timeline, Mutex::default()))).collect())
    }

    fn position((timeline, cursor): &(Timeline, Mutex<Cursor>), now_ms: u64) -> Position {
        cursor.lock().unwrap_or_else(|p| p.into_inner()).advance(timeline, now_ms)
    }

    /// Every timeline, by link direction, for readers that keep no cursor (the prober).
    pub fn shared(&self) -> BTreeMap<LinkRef, Arc<Timeline>> {
        self.0.iter().map(|(link, (timeline, _))| (link.clone(), Arc::new(timeline.clone()))).collect()
    }

    /// Whether `link`'s impairment changes with time.
    pub fn has(&self, link: &LinkRef) -> bool {
        self.0.contains_key(link)
    }

    /// Every impairment `link`'s timeline can put in force, besides the link's own (none when it has no
    /// timeline).
    pub fn phase_impairments(&self, link: &LinkRef) -> impl Iterator<Item = &Arc<Impairment>> {
        self.0.get(link).into_iter().flat_map(|(timeline, _)| timeline.phases().iter().map(|p| &p.impairment))
    }

    /// Where each link's timeline stands at `now_ms`.
    pub fn positions(&self, now_ms: u64) -> impl Iterator<Item = (&LinkRef, Position)> {
        self.0.iter().map(move |(link, entry)| (link, Self::position(entry, now_ms)))
    }

    /// The first instant after `now_ms` at which some timeline changes phase; `None` when none ever will.
    pub fn next_change(&self, now_ms: u64) -> Option<u64> {
        self.positions(now_ms).filter_map(|(_, p)| p.next_ms()).min()
    }

    /// `destinations` with the impairments in force at `now_ms`: a scheduled link's destinations get its
    /// timeline's, the others keep theirs. Each phase's impairment stays one shared allocation.
    pub fn in_force(&self, destinations: &[Destination], now_ms: u64) -> Vec<Destination> {
        if self.0.is_empty() {
            return destinations.to_vec();
        }
        let mut positions: HashMap<&LinkRef, Option<(&Timeline, Position)>> = HashMap::new();
        destinations
            .iter()
            .map(|(net, own, link)| {
                let at = *positions
                    .entry(link.as_ref())
                    .or_insert_with(|| self.0.get(link.as_ref()).map(|e| (&e.0, Self::position(e, now_ms))));
                let impairment = match at {
                    Some((timeline, position)) => timeline.impairment(&position, own).clone(),
                    None => own.clone(),
                };
                (*net, impairment, Arc::clone(link))
            })
            .collect()
    }
}

impl Clone for Timelines {
    fn clone(&self) -> Self {
        Timelines(self.0.iter().map(|(link, (t, _))| (link.clone(), (t.clone(), Mutex::default()))).collect())
    }
}

/// Equal when they hold the same timelines; where their cursors stand makes no difference to what they say.
impl PartialEq for Timelines {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|((a, (x, _)), (b, (y, _)))| a == b && x == y)
    }
}

#[cfg(test)]
#[path = "timing/tests.rs"]
mod tests;
