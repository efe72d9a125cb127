//! What the node keeps for its prober (`crate::measure`): the view each applied plan leaves (the pods whose
//! plan applied, with the plan's filter and timelines), and the last measurements the prober publishes, as
//! `GET /v1/measured` serves them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use isthmus_agent_api::LinkRef;
use isthmus_agent_api::measure::MeasuredState;
use isthmus_agent_api::schedule::Timeline;
use isthmus_datapaths::netns::Netns;

use super::plan::{Destination, ProbeFilter};

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

    pub(crate) fn publish(&self, version: u64, links: Vec<isthmus_agent_api::measure::LinkMeasurement>) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        state.version = version;
        state.links = links;
    }
}
