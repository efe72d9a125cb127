//! Tumbling windows of probe results, per link direction, and the probe kind each link direction uses. Pure.
//!
//! Windows are aligned on the Unix epoch (`[k·length, (k+1)·length)`), so that the windows of every node agree
//! and the operator can merge them. A probe counts in the window it was *sent* in, answered or not; a window is
//! complete once its last probe's timeout has passed (`end + grace`), and then replaces the link's last
//! complete window — unless no probe of the link was sent in it (a small budget spread over many pairs probes
//! each pair less often than once a window), in which case the previous one stays.
//!
//! A link that changes with time (`spec.schedule`) has its windows cut at its phases: a probe counts only from
//! [`PHASE_SETTLE`] after a change of phase to that long (plus the phase's latency out) before the next one, so
//! that every window lies inside one phase and the operator can judge it against that phase's impairment. The
//! bounds follow from the timeline and the instant alone, so the windows of every node still agree.
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
use isthmus_agent_api::schedule::{Position, Timeline};

use super::pacing;
use crate::probe_path::ProbePath;

/// How long after a change of phase a scheduled link's probes count again, and how long (plus the phase's one-way
/// latency out, after which a probe would meet the next phase on its way back) before the next change they stop:
/// the agents at the link's two ends each switch within this of the instant on clocks kept by NTP
/// (docs/networklink.md#schedule).
pub const PHASE_SETTLE: Duration = Duration::from_secs(1);

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

/// One link direction to probe, as the plan in force has it.
#[derive(Debug, Clone)]
pub struct Probed {
    pub link: Arc<LinkRef>,
    /// Sampled pairs on this node.
    pub pairs: u32,
    /// The link's own impairment drops every packet: no fallback.
    pub drops_everything: bool,
    /// The link's own one-way latency out (latency + jitter).
    pub one_way: Duration,
    /// The link direction's timeline, when its impairment changes with time.
    pub timeline: Option<Arc<Timeline>>,
}

/// What the node knows of one link direction between windows.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkState {
    pub kind: ProbeKind,
    /// Sampled pairs on this node.
    pub pairs: u32,
    /// The link's own impairment drops every packet by configuration: no fallback.
    pub drops_everything: bool,
    /// As [`Probed`] has them.
    pub one_way: Duration,
    pub timeline: Option<Arc<Timeline>>,
    /// Why the probes could not be sent (a socket that could not be opened), until the next plan.
    pub failure: Option<String>,
    pub unmeasurable: Option<Unmeasurable>,
    /// The last complete window with probes in it, with its bounds (Unix ms) and the kind it was probed with.
    pub last: Option<(u64, u64, ProbeKind, Tally)>,
}

impl LinkState {
    fn new(p: &Probed) -> Self {
        LinkState {
            kind: ProbeKind::IcmpEcho,
            pairs: p.pairs,
            drops_everything: p.drops_everything,
            one_way: p.one_way,
            timeline: p.timeline.clone(),
            failure: None,
            unmeasurable: None,
            last: None,
        }
    }

    /// Whether the impairment in force over the window from `start_ms` drops every packet.
    fn drops_everything_at(&self, start_ms: u64) -> bool {
        match self.timeline.as_deref().map(|t| (t, t.position(start_ms))) {
            Some((t, Position::In { phase, .. })) => pacing::drops_everything(&t.phases()[phase].impairment),
            _ => self.drops_everything,
        }
    }
}

/// The window a probe sent at `sent_ms` counts in, `[start, end)`: the one of `length_ms` aligned on the epoch, and
/// for a link with a timeline (`one_way`: its own latency out) cut to its phase less [`PHASE_SETTLE`] after the
/// phase's start and less that and the phase's latency out before its end. `None`: the probe was sent too near a
/// change to count.
pub fn window_bounds(length_ms: u64, schedule: Option<(&Timeline, Duration)>, sent_ms: u64) -> Option<(u64, u64)> {
    let start = sent_ms - sent_ms % length_ms;
    let (mut from, mut to) = (start, start.saturating_add(length_ms));
    if let Some((timeline, own_one_way)) = schedule {
        let settle = PHASE_SETTLE.as_millis() as u64;
        let (since, next, one_way) = match timeline.position(sent_ms) {
            Position::Before { next_ms } => (None, Some(next_ms), own_one_way),
            Position::In { phase, since_ms, next_ms, .. } => {
                (Some(since_ms), next_ms, pacing::one_way(&timeline.phases()[phase].impairment))
            }
            Position::Over { since_ms } => (Some(since_ms), None, own_one_way),
        };
        if let Some(since) = since {
            from = from.max(since.saturating_add(settle));
        }
        if let Some(next) = next {
            to = to.min(next.saturating_sub(settle.saturating_add(one_way.as_millis() as u64)));
        }
    }
    (from <= sent_ms && sent_ms < to).then_some((from, to))
}

/// A window not yet closed: where it ends, the kind its link was probed with, and the probes.
#[derive(Debug, Clone)]
struct Open {
    end: u64,
    kind: ProbeKind,
    tally: Tally,
}

#[derive(Debug, Clone)]
pub struct Windows {
    length_ms: u64,
    /// Open windows by start and link direction.
    open: BTreeMap<(u64, Arc<LinkRef>), Open>,
    links: BTreeMap<Arc<LinkRef>, LinkState>,
}

impl Windows {
    pub fn new(length: Duration) -> Self {
        Windows { length_ms: (length.as_millis() as u64).max(1), open: BTreeMap::new(), links: BTreeMap::new() }
    }

    /// The window `link`'s probe sent at `sent_ms` counts in ([`window_bounds`]); `None` for an unknown link.
    pub fn window_of(&self, link: &LinkRef, sent_ms: u64) -> Option<(u64, u64)> {
        let state = self.links.get(link)?;
        window_bounds(self.length_ms, state.timeline.as_deref().map(|t| (t, state.one_way)), sent_ms)
    }

    /// Makes `links` the probed link directions: new ones start on ICMP, kept ones keep their kind and last
    /// window, and the others (and their open tallies) are forgotten.
    pub fn set_links(&mut self, links: impl IntoIterator<Item = Probed>) {
        let mut next = BTreeMap::new();
        for p in links {
            let state = match self.links.remove(&p.link) {
                Some(kept) => LinkState {
                    pairs: p.pairs,
                    drops_everything: p.drops_everything,
                    one_way: p.one_way,
                    timeline: p.timeline.clone(),
                    failure: None,
                    ..kept
                },
                None => LinkState::new(&p),
            };
            next.insert(p.link, state);
        }
        self.links = next;
        self.open.retain(|(_, link), _| self.links.contains_key(link));
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

    /// A probe went out at `sent_ms`; it counts unless sent too near a change of the link's phase.
    pub fn sent(&mut self, link: &Arc<LinkRef>, path: ProbePath, sent_ms: u64) {
        let Some((start, end)) = self.window_of(link, sent_ms) else { return };
        let kind = self.kind(link);
        let open =
            self.open.entry((start, link.clone())).or_insert_with(|| Open { end, kind, tally: Tally::default() });
        open.tally.path(path).sent += 1;
    }

    /// An answer to a probe sent at `sent_ms`; ignored when its window is already closed or was never opened.
    pub fn answered(&mut self, link: &Arc<LinkRef>, path: ProbePath, sent_ms: u64, rtt: Duration, at_ms: u64) {
        let Some((start, _)) = self.window_of(link, sent_ms) else { return };
        let Some(Open { tally, .. }) = self.open.get_mut(&(start, link.clone())) else { return };
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
        // Oldest first, so that a link's last complete window is its latest.
        let due: Vec<(u64, Arc<LinkRef>)> = self
            .open
            .iter()
            .filter(|(_, o)| now_ms >= o.end.saturating_add(grace_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &due {
            let Some(Open { end, kind, tally }) = self.open.remove(key) else { continue };
            if let Some(state) = self.links.get_mut(&key.1) {
                close_link(state, key.0, end, kind, tally);
            }
        }
        !due.is_empty()
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
    let silent = tally.impaired.sent > 0 && tally.impaired.answered == 0 && !state.drops_everything_at(start);
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
