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

use std::sync::Arc;
use std::time::Duration;

use isthmus_datapaths::netns::Netns;

use crate::metrics::Metrics;
use crate::node::Node;

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

/// Starts probing the node's applied plans, for as long as the node lives.
pub fn spawn(node: Arc<Node>, config: ProbeConfig, metrics: Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run::run(Arc::downgrade(&node), config, metrics))
}
