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
    /// The loop, its queues held to `budget_bytes` on the node ([`super::budget`]), and the agent's namespace.
    pub async fn start(budget_bytes: u64) -> io::Result<Arc<Userspace>> {
        Ok(Arc::new(Userspace {
            shell: Shell::start(budget_bytes, super::IoBatch::DEFAULT)?,
            netns: Netns::scratch().await?,
            next: AtomicU64::new(0),
        }))
    }

    /// Whether the loop still runs ([`Shell::running`]).
    pub fn running(&self) -> bool {
        self.shell.running()
    }

    /// Fail-open for a loop that stopped while the agent lives on: removes every capture (each pair's agent end
    /// is in the agent's namespace, which holds nothing else), and with them every route through them, so that
    /// the pods' traffic takes their ordinary routes again instead of a loop that no longer reads it. Returns
    /// how many captures it removed. What the agent dying does by itself, done while it still runs.
    pub async fn fail_open(&self) -> Result<usize, CaptureError> {
        super::capture::remove_all(&self.netns).await
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
    #[error(
        "the userspace datapath's loop stopped: every capture was removed, so the pod's traffic leaves unimpaired \
         until the agent restarts"
    )]
    Stopped,
}

impl EmulationError {
    /// The pod has no interface of the plan's name.
    pub fn interface_missing(&self) -> bool {
        matches!(self, EmulationError::Capture(CaptureError::NoInterface(_)))
    }

    /// The loop is gone: nothing can be emulated until the agent restarts.
    pub fn stopped(&self) -> bool {
        matches!(self, EmulationError::Stopped)
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
        if !desired.is_empty() && !self.userspace.running() {
            // A capture now would take the pod's packets into a loop that no longer reads them.
            return Err(EmulationError::Stopped);
        }
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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use futures::TryStreamExt;
    use isthmus_agent_api::{Impairment, ImpairmentFields};
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};

    use super::*;
    use crate::userspace::Command;
    use crate::userspace::capture::{POD_END, handle_in};
    use crate::userspace::routing::TABLE;

    const MAIN: u32 = 254;

    /// The pod's IPv4 routes in `table`, as (destination/prefix, output interface index).
    async fn routes(netns: &Netns, table: u32) -> Vec<(String, u32)> {
        let handle = handle_in(netns).await.unwrap();
        let dump: Vec<RouteMessage> = handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().table_id(table).build())
            .execute()
            .try_collect()
            .await
            .unwrap();
        dump.iter()
            .filter(|r| {
                let id =
                    r.attributes.iter().find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None });
                id.unwrap_or(u32::from(r.header.table)) == table
            })
            .map(|r| {
                let dst = r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => Some(d.to_string()),
                    _ => None,
                });
                let oif =
                    r.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None });
                (
                    format!("{}/{}", dst.unwrap_or_else(|| "0.0.0.0".into()), r.header.destination_prefix_length),
                    oif.unwrap_or(0),
                )
            })
            .collect()
    }

    /// A pod's namespace: `eth0` (one end of a veth pair) up with 10.99.0.1/24 and the CNI's route to 10.98.0.0/16.
    async fn pod_namespace() -> (Arc<Netns>, u32) {
        let netns = Arc::new(Netns::scratch().await.unwrap());
        let handle = handle_in(&netns).await.unwrap();
        handle.link().add(LinkVeth::new("eth0", "peer0").build()).execute().await.unwrap();
        let mut eth0 = handle.link().get().match_name("eth0").execute();
        let index = eth0.try_next().await.unwrap().unwrap().header.index;
        for name in ["eth0", "peer0"] {
            let link = handle.link().get().match_name(name).execute().try_next().await.unwrap().unwrap();
            handle.link().set(LinkUnspec::new_with_index(link.header.index).up().build()).execute().await.unwrap();
        }
        handle.address().add(index, IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1)), 24).execute().await.unwrap();
        let cni = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::new(10, 98, 0, 0), 16)
            .output_interface(index)
            .build();
        handle.route().add(cni).execute().await.unwrap();
        (netns, index)
    }

    /// A loop that stops (here by a panic) is seen to have stopped; fail-open removes the capture and its routes
    /// while the agent lives on, leaving the pod's own routes as they were; and nothing is captured again.
    #[tokio::test]
    #[ignore = "needs root: make unit runs it"]
    async fn a_stopped_loop_fails_open_and_captures_nothing_more() {
        assert!(nix::unistd::geteuid().is_root(), "needs root to create network namespaces (make unit runs it)");
        let (pod_ns, eth0) = pod_namespace().await;
        let before = routes(&pod_ns, MAIN).await;
        let userspace = Userspace::start(crate::userspace::budget::DEFAULT_BYTES).await.unwrap();
        let pod = userspace.open(pod_ns.clone());
        let fields = ImpairmentFields { latency: Some(Duration::from_millis(10)), ..Default::default() };
        let impairment = Arc::new(Impairment::try_from(fields).unwrap());
        let desired = DesiredState::new([("10.98.1.0/24".parse::<IpNet>().unwrap(), impairment)]).unwrap();
        pod.reconcile("eth0", &desired, false).await.unwrap();
        let captured = routes(&pod_ns, TABLE).await;
        assert!(
            captured.iter().any(|(dst, oif)| dst == "10.98.1.0/24" && *oif != eth0),
            "the destination is routed to the capture: {captured:?}"
        );
        assert_eq!(routes(&pod_ns, MAIN).await, before, "the pod's own table is not touched");

        userspace.shell.send(Command::Panic);
        for _ in 0..1000 {
            if !userspace.running() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!userspace.running(), "the loop panicked 10 s ago");
        assert_eq!(userspace.fail_open().await.unwrap(), 1, "the one capture is removed");

        assert_eq!(routes(&pod_ns, MAIN).await, before, "the pod's routes are what they were before the capture");
        assert_eq!(routes(&pod_ns, TABLE).await, vec![], "no route leads to the removed capture");
        let handle = handle_in(&pod_ns).await.unwrap();
        let left = handle.link().get().match_name(POD_END).execute().try_next().await;
        assert!(!matches!(left, Ok(Some(_))), "the capture's end is gone from the pod: {left:?}");
        let again = pod.reconcile("eth0", &desired, true).await.unwrap_err();
        assert!(again.stopped(), "nothing is captured into a stopped loop: {again}");
        assert_eq!(pod.reconcile("eth0", &DesiredState::empty(), false).await.unwrap(), 1, "emptying still works");
    }
}
