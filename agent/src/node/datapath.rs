//! The node's datapath, whichever kind (tc trees, or the userspace loop's emulations), and its one way to work
//! on a pod: open its handle in a namespace, reconcile an interface (in full or from the connection's record),
//! read its counters, remove what is there. Applying, resyncing, observing and the cleanup mode all go through
//! here, so each is done and counted the same way, and each failure is one [`PodDatapathError`].

use std::sync::Arc;

use futures::StreamExt;
use ipnet::IpNet;
use isthmus_agent_api::{Counters, LinkRef};

use isthmus_agent_api::PodErrorKind;

use crate::metrics::{Metrics, PodName};
use isthmus_datapaths::datapath::{Datapath, DatapathError, DesiredState, Place};
use isthmus_datapaths::netns::Netns;
use isthmus_datapaths::userspace::{EmulationError, PodEmulation, Userspace};

/// What working on a pod's datapath can fail with: the tc datapath's errors (the kernel's own text kept), or
/// the userspace datapath's.
#[derive(Debug, thiserror::Error)]
pub enum PodDatapathError {
    #[error(transparent)]
    Tc(#[from] DatapathError),
    /// The userspace datapath could not capture the pod's destinations or open its sockets.
    #[error("{place}: userspace datapath: {source}")]
    Emulation { place: Place, source: EmulationError },
}

impl PodDatapathError {
    pub fn kind(&self) -> PodErrorKind {
        match self {
            PodDatapathError::Tc(e) => e.kind(),
            PodDatapathError::Emulation { source, .. } if source.interface_missing() => PodErrorKind::InterfaceNotFound,
            PodDatapathError::Emulation { source, .. } if source.stopped() => PodErrorKind::DatapathStopped,
            PodDatapathError::Emulation { .. } => PodErrorKind::Kernel,
        }
    }
}

/// A pod's handle on the node's datapath, kept across plans while the pod stays in its namespace.
pub(super) enum PodDatapath {
    /// The tc tree's connection and record.
    Tc(Datapath),
    /// The pod's capture and path through the agent's loop.
    Userspace(PodEmulation),
}

/// Which way a pod is reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReconcilePath {
    /// Dump, diff, send: the resync, removals, and every call on a fresh connection.
    Full,
    /// Diff against the connection's record and send (the full path when it has none).
    Record,
}

impl ReconcilePath {
    fn label(self) -> &'static str {
        match self {
            ReconcilePath::Full => "full",
            ReconcilePath::Record => "record",
        }
    }
}

/// A tree to remove: where it is, the pod's connection there if it had one, and whose it was (for a report
/// when it cannot be removed).
pub(super) struct Removal {
    pub netns: Arc<Netns>,
    pub interface: String,
    pub datapath: Option<Arc<PodDatapath>>,
    /// The pod it was installed for; `None` for a tree adopted at start-up.
    pub pod: Option<Arc<PodName>>,
    /// The links it served (sorted, distinct); empty when unknown.
    pub links: Vec<LinkRef>,
}

impl Removal {
    /// A tree whose pod and links are unknown (adopted at start-up, or found by the cleanup mode).
    pub fn unowned(netns: Arc<Netns>, interface: String) -> Self {
        Removal { netns, interface, datapath: None, pod: None, links: Vec::new() }
    }
}

#[derive(Debug)]
pub(super) struct NodeDatapath {
    metrics: Arc<Metrics>,
    /// NodeDatapath removed at once.
    parallelism: usize,
    /// Set when the node's pods go through the userspace datapath instead of tc trees.
    userspace: Option<Arc<Userspace>>,
}

impl NodeDatapath {
    pub fn new(metrics: Arc<Metrics>, parallelism: usize, userspace: Option<Arc<Userspace>>) -> Self {
        Self { metrics, parallelism: parallelism.max(1), userspace }
    }

    /// The userspace datapath, where the node's pods go through it.
    pub fn userspace(&self) -> Option<&Arc<Userspace>> {
        self.userspace.as_ref()
    }

    /// Opens a pod's handle in `netns` on the node's datapath (for tc, its connection and, across plans, its
    /// record), counted.
    pub async fn open(&self, netns: &Arc<Netns>) -> Result<PodDatapath, PodDatapathError> {
        match &self.userspace {
            Some(userspace) => Ok(PodDatapath::Userspace(userspace.open(netns.clone()))),
            None => Ok(PodDatapath::Tc(self.open_tc(netns).await?)),
        }
    }

    /// A tc connection in `netns`, counted: for the node's tc trees, and for removing a tree adopted at start-up
    /// whatever the node's datapath now is.
    async fn open_tc(&self, netns: &Netns) -> Result<Datapath, DatapathError> {
        self.metrics.datapath_connections_opened.inc();
        Datapath::open(netns.fd()).await
    }

    /// Brings `interface` to `desired` on `path`, counted; returns the mutations sent. The record stays; the
    /// sockets (and their buffers) are closed, to be opened again by the pod's next call.
    pub async fn reconcile(
        &self,
        datapath: &PodDatapath,
        interface: &str,
        desired: &DesiredState,
        path: ReconcilePath,
    ) -> Result<usize, PodDatapathError> {
        self.metrics.count_reconcile(path.label());
        match datapath {
            PodDatapath::Tc(datapath) => Ok(Self::reconcile_tc(datapath, interface, desired, path).await?),
            PodDatapath::Userspace(emulation) => emulation
                .reconcile(interface, desired, path == ReconcilePath::Full)
                .await
                .map_err(|source| PodDatapathError::Emulation { place: emulation.place(interface), source }),
        }
    }

    async fn reconcile_tc(
        datapath: &Datapath,
        interface: &str,
        desired: &DesiredState,
        path: ReconcilePath,
    ) -> Result<usize, DatapathError> {
        let report = match path {
            ReconcilePath::Full => datapath.reconcile(interface, desired).await,
            ReconcilePath::Record => datapath.update(interface, desired).await,
        };
        datapath.release_connection();
        Ok(report?.mutations)
    }

    /// The counters on `interface`, per destination: the emulators' for a userspace pod; for tc, over the
    /// pod's kept connection or over one opened for this read (an adopted tree has none). Empty when no isthmus
    /// tree is there or it cannot be read.
    pub async fn counters(&self, kept: Option<&PodDatapath>, netns: &Netns, interface: &str) -> Vec<(IpNet, Counters)> {
        let kept = match kept {
            Some(PodDatapath::Userspace(emulation)) => {
                let (counters, loop_counters) = emulation.counters();
                if let Some(loop_counters) = loop_counters {
                    self.metrics.set_loop_losses(&loop_counters);
                }
                return counters;
            }
            Some(PodDatapath::Tc(datapath)) => Some(datapath),
            None => None,
        };
        let observed = async {
            let opened;
            let datapath = match kept {
                Some(datapath) => datapath,
                None => {
                    opened = Datapath::open(netns.fd()).await?;
                    &opened
                }
            };
            let observed = datapath.observe(interface).await;
            datapath.release_connection();
            observed
        };
        match observed.await {
            Ok(counters) => counters.unwrap_or_default(),
            Err(e) => {
                tracing::debug!(netns = %netns.id(), %interface, error = %e, "cannot observe");
                Vec::new()
            }
        }
    }

    /// Removes each tree (on the pod's handle where it has one, else as a tc tree), `parallelism` at once; every removal
    /// comes back with its outcome.
    pub async fn remove(&self, removals: Vec<Removal>) -> Vec<(Removal, Result<(), PodDatapathError>)> {
        futures::stream::iter(removals)
            .map(|removal| async move {
                let outcome = async {
                    let datapath = match &removal.datapath {
                        Some(datapath) => datapath.clone(),
                        None => Arc::new(PodDatapath::Tc(self.open_tc(&removal.netns).await?)),
                    };
                    let empty = DesiredState::empty();
                    self.reconcile(&datapath, &removal.interface, &empty, ReconcilePath::Full).await.map(|_| ())
                };
                let outcome = outcome.await;
                (removal, outcome)
            })
            .buffer_unordered(self.parallelism)
            .collect()
            .await
    }
}
