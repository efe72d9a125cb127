//! What is installed, as the node's jobs share it: the pods of the plan in force with their connections, the
//! trees adopted at start-up, and the snapshot that observe and the metrics read without waiting for an apply.

use std::collections::HashMap;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{LeftoverTree, LinkRef, PodResult};

use super::datapath::{PodDatapath, Removal};
use super::plan::Destination;
use super::plan::ProbeFilter;
use super::probe_view::ProbeView;
use super::timing::Timelines;
use crate::metrics::PodName;
use isthmus_datapaths::datapath::{DatapathError, DesiredState, QueueBudget};
use isthmus_datapaths::netns::Netns;

/// One pod's tree as installed by the plan in force, with the connection that installed it.
pub(super) struct InstalledPod {
    /// Namespace and name, shared with the link metrics.
    pub pod: Arc<PodName>,
    pub interface: String,
    pub netns: Arc<Netns>,
    /// Kept across plans while the pod stays in the same namespace; its record makes the next plan cheap.
    pub datapath: Arc<PodDatapath>,
    /// What the plan asked for, per destination (sorted): the impairment and the link that asked for it, each
    /// shared with every destination that has the same one. The resync brings the kernel back to it.
    pub destinations: Vec<Destination>,
}

impl std::fmt::Debug for InstalledPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstalledPod")
            .field("pod", &self.pod)
            .field("interface", &self.interface)
            .field("netns", &self.netns.id())
            .field("destinations", &self.destinations.len())
            .finish_non_exhaustive()
    }
}

impl InstalledPod {
    pub fn link(&self, destination: &IpNet) -> Option<&Arc<LinkRef>> {
        self.destinations.binary_search_by(|(d, _, _)| d.cmp(destination)).ok().map(|i| &self.destinations[i].2)
    }

    /// What the tree should hold at `now_ms`: the plan's destinations with the impairments in force then.
    pub fn desired(
        &self,
        budget: QueueBudget,
        timelines: &Timelines,
        now_ms: u64,
    ) -> Result<DesiredState, DatapathError> {
        desired_state(&timelines.in_force(&self.destinations, now_ms), budget)
    }

    /// Whether a link of one of its destinations changes with time.
    pub fn scheduled(&self, timelines: &Timelines) -> bool {
        self.destinations.iter().any(|(_, _, link)| timelines.has(link))
    }
}

pub(super) fn desired_state(destinations: &[Destination], budget: QueueBudget) -> Result<DesiredState, DatapathError> {
    DesiredState::with_budget(destinations.iter().map(|(d, impairment, _)| (*d, impairment.clone())), budget)
}

/// A tree found installed at start-up, kept as it is until the first plan says whether it is wanted.
#[derive(Debug, Clone)]
pub(super) struct AdoptedEntry {
    pub netns: Arc<Netns>,
    pub interface: String,
}

#[derive(Debug, Default)]
pub(super) struct Applied {
    /// None until the first plan.
    pub version: Option<u64>,
    pub pods: HashMap<String, Arc<InstalledPod>>,
    pub adopted: Vec<AdoptedEntry>,
    /// NodeDatapath that could not be removed: tried again with the next plan, reported until they go.
    pub leftovers: Vec<Leftover>,
    pub last_results: Vec<PodResult>,
    /// What the prober must leave alone, from the plan in force.
    pub probe_filter: ProbeFilter,
    /// The plan in force's timelines: the phase timer and the resync install what they say.
    pub timelines: Timelines,
}

/// A tree the agent could not remove, and why.
pub(super) struct Leftover {
    pub removal: Removal,
    pub message: String,
}

impl std::fmt::Debug for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leftover")
            .field("netns", &self.removal.netns.id())
            .field("interface", &self.removal.interface)
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl Leftover {
    /// As the agent's reply reports it.
    pub fn report(&self) -> LeftoverTree {
        LeftoverTree {
            netns_inode: self.removal.netns.id().inode,
            interface: self.removal.interface.clone(),
            pod: self.removal.pod.as_ref().map(|p| format!("{}/{}", p.namespace, p.name)),
            links: self.removal.links.clone(),
            message: self.message.clone(),
        }
    }
}

impl Applied {
    /// The pod's connection, while the pod is still in the namespace it was opened in.
    pub fn kept_datapath(&self, uid: &str, netns: &Netns) -> Option<Arc<PodDatapath>> {
        self.pods
            .get(uid)
            .filter(|previous| previous.netns.id() == netns.id())
            .map(|previous| previous.datapath.clone())
    }
}

/// What observe and the metrics read, replaced at the end of each apply.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub version: u64,
    pub pods: Vec<(String, Arc<InstalledPod>)>,
    pub adopted: Vec<AdoptedEntry>,
    /// What the prober works from; `None` when verification is off.
    pub probe: Option<Arc<ProbeView>>,
}
