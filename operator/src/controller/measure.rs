//! Polling what the agents measured: while this replica leads, every `--measure-interval` it asks each node's
//! ready agent for its latest windows (`GET /v1/measured`), keeps the newest answer per node, merges them per
//! link direction and has every link's status checked again. The verdicts are pure (`crate::measure`,
//! `status/measured.rs`); this file is the I/O and the bookkeeping around them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use isthmus_agent_api::measure::MeasuredState;
use isthmus_agent_api::{Direction, LinkRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;

use super::Controller;
use super::agent_api::CallError;
use super::status::{Progress, measured_part, place_measured};
use super::version::unix_millis;
use crate::api::NetworkLinkStatus;
use crate::index::ObjectKey;
use crate::measure::{Judged, Leg, Merged, RoundTrip, judge, merge, phase_path, unjudged_scheduled};
use crate::metrics::LinkLabels;

/// Whether and how often the agents are asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeasureConfig {
    /// False: verification is off for the whole install (no polling, no `status.measured`, no `Conformant`).
    pub enabled: bool,
    pub interval: Duration,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        MeasureConfig { enabled: true, interval: Duration::from_secs(10) }
    }
}

/// One round of polls: per node, the agent's answer.
pub(super) type PollResults = Vec<(String, Result<MeasuredState, CallError>)>;

/// The latest measurements and what was made of them.
#[derive(Debug)]
pub(super) struct Measurements {
    states: BTreeMap<String, MeasuredState>,
    merged: BTreeMap<LinkRef, Merged>,
    last_poll: Option<Instant>,
    polling: bool,
    /// When this replica last put a fresh measured part into each link's status.
    written: BTreeMap<ObjectKey, Instant>,
    /// Link series in the operator's metrics, to forget those of links that went away.
    exported: BTreeSet<LinkLabels>,
    results: mpsc::UnboundedSender<PollResults>,
}

impl Measurements {
    pub(super) fn new(results: mpsc::UnboundedSender<PollResults>) -> Self {
        Measurements {
            states: BTreeMap::new(),
            merged: BTreeMap::new(),
            last_poll: None,
            polling: false,
            written: BTreeMap::new(),
            exported: BTreeSet::new(),
            results,
        }
    }
}

fn labels(key: &ObjectKey, direction: Direction) -> LinkLabels {
    let direction = match direction {
        Direction::Forward => "forward",
        Direction::Reverse => "reverse",
    };
    LinkLabels { namespace: key.namespace.clone(), link: key.name.clone(), direction: direction.into() }
}

impl Controller {
    /// Starts a round of polls when one is due (from the controller's tick).
    pub(super) fn poll_measurements(&mut self) {
        let config = self.ctx.config.measure;
        let m = &self.measure;
        let due = !m.polling && m.last_poll.is_none_or(|t| t.elapsed() >= config.interval);
        if !config.enabled || !due || !self.leading() {
            return;
        }
        let agents: Vec<(String, SocketAddr)> =
            self.nodes.iter().filter_map(|n| Some((n.clone(), self.node_input(n).agent?))).collect();
        let m = &mut self.measure;
        m.polling = true;
        m.last_poll = Some(Instant::now());
        let (api, tx) = (self.ctx.agent_api.clone(), m.results.clone());
        tokio::spawn(async move {
            let calls = agents.into_iter().map(|(node, addr)| {
                let api = api.clone();
                async move {
                    let result = api.measured(addr, &node).await;
                    (node, result)
                }
            });
            let _ = tx.send(futures::future::join_all(calls).await);
        });
    }

    /// A round of polls came back: keep the newest state per node, merge, and check every status again.
    pub(super) fn on_measured(&mut self, results: PollResults) {
        let m = &mut self.measure;
        m.polling = false;
        for (node, result) in results {
            match result {
                Ok(state) => {
                    m.states.insert(node, state);
                }
                // The node's last answer stays until its windows turn stale.
                Err(e) => tracing::debug!(node, error = %e, "polling measurements"),
            }
        }
        let nodes = &self.nodes;
        m.states.retain(|node, _| nodes.contains(node));
        // A link that changes with time is judged by the phase its newest window lies in: only the nodes' newest
        // windows are merged (the agents cut a scheduled direction's windows at its phases; the other direction's
        // answers cross them too).
        let index = self.planner.index();
        let cut = |l: &LinkRef| {
            index.links.get(&ObjectKey::new(&l.namespace, &l.name)).is_some_and(|i| i.timelines.is_some())
        };
        m.merged = merge(m.states.values(), unix_millis(), self.ctx.config.measure.interval, cut);
        let links = &self.links;
        let gone: Vec<LinkLabels> = m
            .exported
            .iter()
            .filter(|l| !links.contains_key(&ObjectKey::new(&l.namespace, &l.link)))
            .cloned()
            .collect();
        for l in gone {
            self.ctx.metrics.forget_link(&l);
            m.exported.remove(&l);
        }
        m.written.retain(|k, _| links.contains_key(k));
        self.status.dirty.extend(self.links.keys().cloned());
        self.after_batch();
    }

    /// Adds the measured part to a link's new status, or leaves it out where the link is not verified.
    pub(super) fn with_measured(
        &mut self,
        key: &ObjectKey,
        status: &mut NetworkLinkStatus,
        previous: Option<&NetworkLinkStatus>,
        progress: Option<&Progress>,
        now: &Time,
    ) {
        let info = self.planner.index().links.get(key);
        let compiled =
            info.filter(|i| i.verify && self.ctx.config.measure.enabled).and_then(|i| i.compiled.as_ref().ok());
        let Some((_, impairments)) = compiled else {
            for d in [Direction::Forward, Direction::Reverse] {
                let l = labels(key, d);
                if self.measure.exported.remove(&l) {
                    self.ctx.metrics.forget_link(&l);
                }
            }
            return;
        };
        let applied = progress.is_some_and(|p| p.applied > 0);
        let merged = |direction| {
            let r = LinkRef { namespace: key.namespace.clone(), name: key.name.clone(), direction };
            self.measure.merged.get(&r)
        };
        // A one-way link's answers come back through whatever the plan applies the other way (a topology's
        // opposite link, a hand-written one), which the prediction must include.
        let way_back = if impairments.reverse.is_none() { self.planner.way_back(key) } else { None };
        let timelines = info.and_then(|i| i.timelines.as_ref());
        let leg = |d: Direction, own| Leg { own, timeline: timelines.and_then(|t| t.of(d)).map(|t| &**t) };
        let forward_leg = leg(Direction::Forward, &impairments.forward);
        let reverse_leg = impairments.reverse.as_ref().map(|r| leg(Direction::Reverse, r));
        let way_back_leg = way_back.as_deref().map(|own| Leg { own, timeline: None });
        let verdict = |direction, out: Leg<'_>, back: Option<Leg<'_>>| {
            let input = |path| Judged { path, ipv6: false, applied };
            let own = RoundTrip { out: out.own, back: back.map(|b| b.own) };
            let merged = merged(direction);
            if timelines.is_none() {
                return judge(input(own), merged);
            }
            // A link that changes with time: judged against the phase its last window lies in, if one.
            match merged.and_then(|m| m.bounds).and_then(|bounds| phase_path(out, back, bounds)) {
                Some(p) => {
                    let mut v = judge(input(RoundTrip { out: p.out, back: p.back }), merged);
                    if let Some(m) = v.measured.as_mut() {
                        m.phase = p.phase;
                    }
                    v
                }
                None => unjudged_scheduled(judge(input(own), merged)),
            }
        };
        let forward = verdict(Direction::Forward, forward_leg, reverse_leg.or(way_back_leg));
        let reverse = reverse_leg.map(|r| verdict(Direction::Reverse, r, Some(forward_leg)));
        let window = [Direction::Forward, Direction::Reverse]
            .into_iter()
            .filter_map(|d| merged(d).map(|m| m.window))
            .max()
            .unwrap_or_default()
            .max(self.ctx.config.measure.interval);
        for (d, v) in
            std::iter::once((Direction::Forward, &forward)).chain(reverse.iter().map(|r| (Direction::Reverse, r)))
        {
            let l = labels(key, d);
            self.ctx.metrics.link_verdict(&l, v.expected_added_rtt, v.expected_loss, v.conformant());
            self.measure.exported.insert(l);
        }
        let since = self.measure.written.get(key).map(Instant::elapsed);
        let part = measured_part(&forward, reverse.as_ref());
        if place_measured(status, part, previous, since, window, now) {
            self.measure.written.insert(key.clone(), Instant::now());
        }
    }
}
