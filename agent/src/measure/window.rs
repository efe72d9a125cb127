//! Tumbling windows of probe results, per link direction, and the probe kind each link direction uses. Pure.
//!
//! Windows are aligned on the Unix epoch (`[k·length, (k+1)·length)`), so that the windows of every node agree
//! and the operator can merge them. A probe counts in the window it was *sent* in, answered or not; a window is
//! complete once its last probe's timeout has passed (`end + grace`), and then replaces the link's last
//! complete window — unless no probe of the link was sent in it (a small budget spread over many pairs probes
//! each pair less often than once a window), in which case the previous one stays.
//!
//! Probe kind: ICMP echo first. A window in which the link's impaired probes were sent and none was answered
//! switches the link to TCP SYN for the next window; a TCP window without any answer reports the link
//! `Unmeasurable{NoAnswer}` and goes back to ICMP. A link that drops everything by configuration stays on ICMP
//! and reports its loss.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::LinkRef;
use isthmus_agent_api::measure::{LinkMeasurement, ProbeKind, ProbeWindow, Unmeasurable, UnmeasurableReason};

use super::pacing::ProbePath;

/// One link direction's probes in one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub impaired: ProbeWindow,
    pub baseline: ProbeWindow,
    pub last_answer_ms: Option<u64>,
}

impl Tally {
    fn path(&mut self, path: ProbePath) -> &mut ProbeWindow {
        match path {
            ProbePath::Impaired => &mut self.impaired,
            ProbePath::Baseline => &mut self.baseline,
        }
    }
}

/// What the node knows of one link direction between windows.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkState {
    pub kind: ProbeKind,
    /// Sampled pairs on this node.
    pub pairs: u32,
    /// The link drops every packet by configuration: no fallback.
    pub drops_everything: bool,
    /// Why the probes could not be sent (a socket that could not be opened), until the next plan.
    pub failure: Option<String>,
    pub unmeasurable: Option<Unmeasurable>,
    /// The last complete window with probes in it, with its bounds (Unix ms) and the kind it was probed with.
    pub last: Option<(u64, u64, ProbeKind, Tally)>,
}

impl LinkState {
    pub fn new(pairs: u32, drops_everything: bool) -> Self {
        LinkState { kind: ProbeKind::IcmpEcho, pairs, drops_everything, failure: None, unmeasurable: None, last: None }
    }
}

#[derive(Debug, Clone)]
pub struct Windows {
    length_ms: u64,
    /// Open windows by start, each with its links' tallies and the kind each link was probed with.
    open: BTreeMap<u64, BTreeMap<Arc<LinkRef>, (ProbeKind, Tally)>>,
    links: BTreeMap<Arc<LinkRef>, LinkState>,
}

impl Windows {
    pub fn new(length: Duration) -> Self {
        Windows { length_ms: (length.as_millis() as u64).max(1), open: BTreeMap::new(), links: BTreeMap::new() }
    }

    pub fn window_of(&self, at_ms: u64) -> u64 {
        at_ms - at_ms % self.length_ms
    }

    /// Makes `links` the probed link directions: new ones start on ICMP, kept ones keep their kind and last
    /// window, and the others (and their open tallies) are forgotten.
    pub fn set_links(&mut self, links: impl IntoIterator<Item = (Arc<LinkRef>, u32, bool)>) {
        let mut next = BTreeMap::new();
        for (link, pairs, drops_everything) in links {
            let mut state = self.links.remove(&link).unwrap_or_else(|| LinkState::new(pairs, drops_everything));
            state.pairs = pairs;
            state.drops_everything = drops_everything;
            state.failure = None;
            next.insert(link, state);
        }
        self.links = next;
        for tallies in self.open.values_mut() {
            tallies.retain(|link, _| self.links.contains_key(link));
        }
    }

    pub fn kind(&self, link: &LinkRef) -> ProbeKind {
        self.links.get(link).map_or(ProbeKind::IcmpEcho, |s| s.kind)
    }

    /// A probe could not be sent at all (its socket did not open).
    pub fn failed(&mut self, link: &LinkRef, message: String) {
        if let Some(state) = self.links.get_mut(link) {
            state.failure = Some(message);
        }
    }

    pub fn sent(&mut self, link: &Arc<LinkRef>, path: ProbePath, sent_ms: u64) {
        if !self.links.contains_key(link) {
            return;
        }
        let kind = self.kind(link);
        let start = self.window_of(sent_ms);
        self.open
            .entry(start)
            .or_default()
            .entry(link.clone())
            .or_insert_with(|| (kind, Tally::default()))
            .1
            .path(path)
            .sent += 1;
    }

    /// An answer to a probe sent at `sent_ms`; ignored when its window is already closed or was never opened.
    pub fn answered(&mut self, link: &LinkRef, path: ProbePath, sent_ms: u64, rtt: Duration, at_ms: u64) {
        let start = self.window_of(sent_ms);
        let Some((_, tally)) = self.open.get_mut(&start).and_then(|w| w.get_mut(link)) else { return };
        let window = tally.path(path);
        if window.answered < window.sent {
            window.answered += 1;
            window.rtt.record(rtt);
            tally.last_answer_ms = tally.last_answer_ms.max(Some(at_ms));
        }
    }

    /// Closes every window that ended at least `grace` (the longest probe timeout) before `now_ms`; returns
    /// whether any closed.
    pub fn close(&mut self, now_ms: u64, grace: Duration) -> bool {
        let grace_ms = grace.as_millis() as u64;
        let mut closed = false;
        while let Some(entry) = self.open.first_entry() {
            let start = *entry.key();
            let end = start + self.length_ms;
            if now_ms < end + grace_ms {
                break;
            }
            let tallies = entry.remove();
            closed = true;
            for (link, state) in &mut self.links {
                match tallies.get(link) {
                    Some((kind, tally)) => close_link(state, start, end, *kind, tally.clone()),
                    None => continue,
                }
            }
        }
        closed
    }

    /// The last complete window of every probed link direction (and the ones that could not be probed).
    pub fn measurements(&self) -> Vec<LinkMeasurement> {
        self.links
            .iter()
            .filter_map(|(link, state)| {
                let unmeasurable = state.unmeasurable.clone().or_else(|| {
                    let nothing_sent = state.last.as_ref().is_none_or(|(_, _, _, t)| t.impaired.sent == 0);
                    let failure = state.failure.as_ref().filter(|_| nothing_sent)?;
                    Some(Unmeasurable { reason: UnmeasurableReason::ProbeFailed, message: failure.clone() })
                });
                let (start, end, kind, tally) = match &state.last {
                    Some((start, end, kind, tally)) => (*start, *end, *kind, tally.clone()),
                    None if unmeasurable.is_some() => (0, 0, state.kind, Tally::default()),
                    None => return None,
                };
                Some(LinkMeasurement {
                    link: (**link).clone(),
                    probe: kind,
                    pairs: state.pairs,
                    impaired: tally.impaired,
                    baseline: tally.baseline,
                    window_start_ms: start,
                    window_end_ms: end,
                    last_answer_ms: tally.last_answer_ms,
                    unmeasurable,
                })
            })
            .collect()
    }
}

/// A link's window closed: it becomes the last complete one, and decides the next window's probe kind.
fn close_link(state: &mut LinkState, start: u64, end: u64, kind: ProbeKind, tally: Tally) {
    if tally.impaired.sent == 0 && tally.baseline.sent == 0 {
        return;
    }
    let silent = tally.impaired.sent > 0 && tally.impaired.answered == 0 && !state.drops_everything;
    state.unmeasurable = None;
    if silent {
        match kind {
            ProbeKind::IcmpEcho => state.kind = ProbeKind::TcpSyn,
            ProbeKind::TcpSyn => {
                state.kind = ProbeKind::IcmpEcho;
                state.unmeasurable = Some(Unmeasurable {
                    reason: UnmeasurableReason::NoAnswer,
                    message: format!(
                        "neither ICMP echo nor TCP SYN got an answer: {} TCP probes from {} pairs unanswered",
                        tally.impaired.sent, state.pairs
                    ),
                });
            }
        }
        // An ICMP window without answers is not reported as measured (it would read as 100 % loss); the
        // previous window, if any, stays until TCP has had its window.
        if kind == ProbeKind::IcmpEcho {
            return;
        }
    }
    state.last = Some((start, end, kind, tally));
}

#[cfg(test)]
mod tests;
