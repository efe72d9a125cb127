//! The userspace datapath as the node drives it: one [`Userspace`] per agent (the loop and the agent's own
//! namespace), one [`PodEmulation`] per pod, brought to a desired state as a tc `Datapath` is.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::IpNet;
use isthmus_agent_api::Counters;

use super::capture::{Capture, CaptureError};
use super::pipeline::PodPipeline;
use super::{PodPath, Shell, ShellCounters};
use crate::datapath::DesiredState;
use crate::netns::Netns;

/// The agent's part of the userspace datapath: the loop, and the namespace the captures' agent ends live in.
/// Nothing pins that namespace: it ends with the agent, and every capture with it.
pub struct Userspace {
    shell: Shell,
    netns: Netns,
    next: AtomicU64,
}

impl std::fmt::Debug for Userspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Userspace").field("netns", &self.netns.id()).finish_non_exhaustive()
    }
}

impl Userspace {
    pub async fn start() -> io::Result<Arc<Userspace>> {
        Ok(Arc::new(Userspace { shell: Shell::start()?, netns: Netns::scratch().await?, next: AtomicU64::new(0) }))
    }

    /// A pod's emulation in `netns`, empty until reconciled.
    pub fn open(self: &Arc<Self>, netns: Arc<Netns>) -> PodEmulation {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        PodEmulation { userspace: self.clone(), netns, id, state: tokio::sync::Mutex::new(None) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmulationError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error("{action}: {source}")]
    Socket { action: &'static str, source: io::Error },
}

impl EmulationError {
    /// The pod has no interface of the plan's name.
    pub fn interface_missing(&self) -> bool {
        matches!(self, EmulationError::Capture(CaptureError::NoInterface(_)))
    }
}

/// What is in force for a pod: the capture, the interface behind it, and what it was built from.
struct Installed {
    capture: Capture,
    interface: String,
    desired: DesiredState,
}

/// One pod's emulation: its capture and its path through the loop.
pub struct PodEmulation {
    userspace: Arc<Userspace>,
    netns: Arc<Netns>,
    id: u64,
    state: tokio::sync::Mutex<Option<Installed>>,
}

impl std::fmt::Debug for PodEmulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodEmulation").field("netns", &self.netns.id()).field("id", &self.id).finish_non_exhaustive()
    }
}

impl PodEmulation {
    /// Where the pod's errors happened, as the tc datapath's errors name it.
    pub fn place(&self, interface: &str) -> crate::datapath::Place {
        crate::datapath::Place { netns: self.netns.id(), interface: interface.to_owned() }
    }

    fn key(&self) -> String {
        format!("pod-{}", self.id)
    }

    /// Brings the pod to `desired` behind `interface`: the capture (made when missing, or when `full` and its
    /// pod end is gone) with its path through the loop, a new pipeline on that path when the destinations or
    /// impairments changed (packets the old one holds still leave as it scheduled them), and the routes added
    /// and withdrawn. Returns the changes made.
    /// Empty `desired` removes everything.
    pub async fn reconcile(
        &self,
        interface: &str,
        desired: &DesiredState,
        full: bool,
    ) -> Result<usize, EmulationError> {
        let mut state = self.state.lock().await;
        if desired.is_empty() {
            return Ok(match state.take() {
                Some(installed) => {
                    self.userspace.shell.detach(&self.key());
                    installed.capture.detach().await?;
                    1
                }
                None => 0,
            });
        }
        let stale = match &*state {
            Some(installed) => installed.interface != interface || (full && !installed.capture.present().await?),
            None => true,
        };
        let mut changes = 0;
        if stale {
            if let Some(old) = state.take() {
                self.userspace.shell.detach(&self.key());
                old.capture.detach().await?;
            }
            let name = format!("isu{}", self.id);
            let capture = Capture::attach(&self.userspace.netns, &self.netns, interface, &name).await?;
            *state = Some(Installed { capture, interface: interface.to_owned(), desired: DesiredState::empty() });
            changes += 1;
        }
        let installed = state.as_mut().expect("set above");
        if stale {
            self.attach_path(installed, interface, desired).await?;
            changes += 1;
        } else if installed.desired != *desired {
            self.userspace.shell.retune(&self.key(), self.pipeline(desired));
            changes += 1;
        }
        let before: BTreeSet<IpNet> = installed.desired.destinations().map(|(d, _)| *d).collect();
        let after: BTreeSet<IpNet> = desired.destinations().map(|(d, _)| *d).collect();
        // New routes first: a destination moving between prefixes is never left uncaptured.
        for destination in &after {
            if full || stale || !before.contains(destination) {
                installed.capture.route(*destination, None).await?;
                changes += usize::from(!before.contains(destination));
            }
        }
        for destination in before.difference(&after) {
            installed.capture.unroute(*destination).await?;
            changes += 1;
        }
        installed.desired = desired.clone();
        Ok(changes)
    }

    /// Opens the capture's sockets and hands the loop a pipeline for `desired`, replacing the pod's old one.
    async fn attach_path(
        &self,
        installed: &Installed,
        interface: &str,
        desired: &DesiredState,
    ) -> Result<(), EmulationError> {
        let pipeline = self.pipeline(desired);
        let path = PodPath::open(&self.userspace.netns, &self.netns, &installed.capture, interface, pipeline).await?;
        self.userspace.shell.attach(&self.key(), path);
        Ok(())
    }

    fn pipeline(&self, desired: &DesiredState) -> PodPipeline {
        PodPipeline::new(desired.destinations(), desired.queue_bound(), self.id, self.userspace.shell.now())
    }

    /// Each destination's counters, as the emulators keep them (empty when nothing is installed), and the loop's
    /// own (for the whole agent, `None` when nothing is installed).
    pub fn counters(&self) -> (Vec<(IpNet, Counters)>, Option<ShellCounters>) {
        match self.userspace.shell.counters(&self.key()) {
            Some((mut counters, shell)) => {
                counters.sort_by_key(|(d, _)| *d);
                (counters, Some(shell))
            }
            None => (Vec::new(), None),
        }
    }
}

impl Drop for PodEmulation {
    /// A pod dropped without being emptied (its namespace gone) leaves the loop; its capture went with the
    /// namespace, or goes with the agent's.
    fn drop(&mut self) {
        self.userspace.shell.detach(&self.key());
    }
}
