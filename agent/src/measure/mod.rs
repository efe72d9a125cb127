//! Every link measures itself: the agent probes sampled (source pod, destination) pairs of the links it applied,
//! from inside the source pods' network namespaces (so the probes take the link's impairment) and from the
//! node's own namespace (the baseline without it), and reports the last complete window per link direction at
//! `GET /v1/measured` and in the `isthmus_link_*` probe metrics. Each job is a module of its own:
//! - `sample` (pure): which pairs, at most `--probe-pairs-per-link` per link direction;
//! - `pacing` (pure): when, under the `--probe-rate` ceiling, with jitter and a quarter of baseline probes,
//!   and each probe's timeout;
//! - `window` (pure): tumbling windows of `--probe-window`, cut at a scheduled link's phases, and ICMP → TCP SYN
//!   fallback;
//! - `socket`: raw ICMP and TCP SYN probes;
//! - `run`: the loop that ties them to the node's applied plan.
//!
//! Network safety: only host addresses of the applied plan's destinations are ever probed (never a Service
//! ClusterIP or a `to.cidrs` network: the plan lists those in `unprobed`).

mod pacing;
mod run;
mod sample;
mod socket;
mod window;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use isthmus_agent_api::LinkRef;
use isthmus_agent_api::measure::MeasuredState;
use isthmus_agent_api::schedule::Timeline;

pub use self::pacing::ProbePath;
pub use self::sample::ProbeFilter;
use crate::metrics::Metrics;
use crate::netns::Netns;
use crate::node::{Destination, Node};

/// The agent's `--verify`, `--probe-*` settings.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// Probes per second the node sends at most, all pairs and both paths together.
    pub rate: f64,
    pub pairs_per_link: usize,
    pub window: Duration,
    /// Where baseline probes are sent from: the agent's own namespace when `None` (a node's agent runs with the
    /// host's network); another one for simulated nodes sharing one kernel.
    pub baseline_netns: Option<Arc<Netns>>,
}

/// One source pod of the applied plan, as the prober needs it.
#[derive(Debug, Clone)]
pub struct ProbePod {
    pub uid: String,
    pub netns: Arc<Netns>,
    pub destinations: Vec<Destination>,
}

/// What the prober works from: the pods whose plan applied, with the plan's filter and timelines. Replaced by
/// every plan.
#[derive(Debug, Clone, Default)]
pub struct ProbeView {
    pub version: u64,
    pub pods: Vec<ProbePod>,
    pub filter: ProbeFilter,
    /// The link directions that change with time (their windows are cut at their phases).
    pub timelines: BTreeMap<LinkRef, Arc<Timeline>>,
}

/// The node's last measurements, as `GET /v1/measured` serves them.
#[derive(Debug)]
pub struct Measurements {
    state: RwLock<MeasuredState>,
}

impl Measurements {
    pub fn new(node: &str, enabled: bool) -> Self {
        Measurements { state: RwLock::new(MeasuredState { node: node.to_owned(), enabled, ..Default::default() }) }
    }

    /// The last measurements.
    pub fn current(&self) -> MeasuredState {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn publish(&self, version: u64, links: Vec<isthmus_agent_api::measure::LinkMeasurement>) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        state.version = version;
        state.links = links;
    }
}

/// Starts probing the node's applied plans, for as long as the node lives.
pub fn spawn(node: Arc<Node>, config: ProbeConfig, metrics: Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run::run(Arc::downgrade(&node), config, metrics))
}
