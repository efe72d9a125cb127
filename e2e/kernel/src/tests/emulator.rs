//! The datapath a test drives, either of the agent's two: the tc tree (`isthmus_datapaths::datapath`, netem under
//! HTB) or the userspace datapath (`isthmus_datapaths::userspace`, a capture and the agent's loop). The fidelity
//! tests run once through each with the same traffic and the same tolerances, which is the parity table of
//! e2e/kernel/README.md.

use std::sync::Arc;

use anyhow::Context;
use ipnet::IpNet;
use isthmus_agent_api::Counters;
use isthmus_datapaths::datapath::{Datapath, DesiredState, QueueBudget};
use isthmus_datapaths::netns::Netns as AgentNetns;
use isthmus_datapaths::userspace::capture::POD_END;
use isthmus_datapaths::userspace::{PodEmulation, Userspace};

use crate::harness::{Ctx, Via};
use crate::netns::{SOURCE_IF, VethPair};

/// What one reconcile did, in terms both datapaths share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// Requests that changed something (netlink mutations, or the capture's pipeline and routes): 0 when the
    /// datapath already matched.
    pub made: usize,
    /// The tc tree's objects deleted and added (0 for the userspace datapath, which changes a destination by
    /// handing its loop a new pipeline on the same capture).
    pub replaced: usize,
}

/// Packets a datapath lost, by where (`Emulation::losses`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Losses {
    /// Dropped by the emulation as configured or for its queue's limit (netem's or the emulators' counters).
    pub emulator: u64,
    /// Dropped by the kernel from the userspace datapath's capture sockets: its loop fell behind.
    pub capture_overruns: u64,
    /// Refused by the userspace datapath's raw socket on the way out.
    pub send_errors: u64,
    /// Captured but not read as IP.
    pub malformed: u64,
}

impl std::ops::Sub for Losses {
    type Output = Losses;
    fn sub(self, before: Losses) -> Losses {
        Losses {
            emulator: self.emulator - before.emulator,
            capture_overruns: self.capture_overruns - before.capture_overruns,
            send_errors: self.send_errors - before.send_errors,
            malformed: self.malformed - before.malformed,
        }
    }
}

impl std::fmt::Display for Losses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "emulator {}, capture overruns {}, send errors {}, malformed {}",
            self.emulator, self.capture_overruns, self.send_errors, self.malformed
        )
    }
}

pub enum Emulation {
    Tc(Datapath),
    Userspace {
        pod: PodEmulation,
        /// The loop and the agent's namespace; dropped after `pod`.
        _userspace: Arc<Userspace>,
    },
}

impl Emulation {
    /// The datapath of `via`, on namespace `a` of `pair`, empty.
    pub fn open(ctx: &Ctx, pair: &VethPair, via: Via) -> anyhow::Result<Emulation> {
        Ok(match via {
            Via::Tc => Emulation::Tc(ctx.runtime.block_on(Datapath::open(pair.a.fd())).context("opening tc")?),
            Via::Userspace => {
                let userspace = ctx
                    .runtime
                    .block_on(Userspace::start(isthmus_datapaths::userspace::budget::DEFAULT_BYTES))
                    .context("starting the userspace loop")?;
                let pod_ns = AgentNetns::open(format!("/run/netns/{}", pair.a.name()).as_ref())?;
                Emulation::Userspace { pod: userspace.open(Arc::new(pod_ns)), _userspace: userspace }
            }
        })
    }

    pub fn reconcile(&self, ctx: &Ctx, desired: &DesiredState) -> anyhow::Result<Changes> {
        Ok(match self {
            Emulation::Tc(dp) => {
                let r = ctx.runtime.block_on(dp.reconcile(SOURCE_IF, desired))?;
                Changes { made: r.mutations, replaced: r.added + r.deleted }
            }
            Emulation::Userspace { pod, .. } => {
                Changes { made: ctx.runtime.block_on(pod.reconcile(SOURCE_IF, desired, false))?, replaced: 0 }
            }
        })
    }

    /// Each destination's counters as the datapath keeps them (the kernel's for tc, the loop's emulators').
    pub fn counters(&self, ctx: &Ctx) -> anyhow::Result<Vec<(IpNet, Counters)>> {
        Ok(match self {
            Emulation::Tc(dp) => ctx.runtime.block_on(dp.observe(SOURCE_IF))?.unwrap_or_default(),
            Emulation::Userspace { pod, .. } => pod.counters().0,
        })
    }

    /// Where the datapath itself lost packets so far, by reason (cumulative: subtract a reading taken before).
    pub fn losses(&self, ctx: &Ctx) -> anyhow::Result<Losses> {
        let queue = |counters: &[(IpNet, Counters)]| counters.iter().map(|(_, c)| c.drops).sum();
        Ok(match self {
            Emulation::Tc(_) => Losses { emulator: queue(&self.counters(ctx)?), ..Losses::default() },
            Emulation::Userspace { pod, .. } => {
                let (counters, shell) = pod.counters();
                let shell = shell.unwrap_or_default();
                Losses {
                    emulator: queue(&counters),
                    capture_overruns: shell.capture_overruns,
                    send_errors: shell.send_errors,
                    malformed: shell.malformed,
                }
            }
        })
    }

    /// What is installed, read back (tc's tree; the capture is write-only state the datapath keeps in memory).
    pub fn installed(&self, ctx: &Ctx) -> anyhow::Result<Option<DesiredState>> {
        match self {
            Emulation::Tc(dp) => Ok(ctx.runtime.block_on(dp.installed(SOURCE_IF, QueueBudget::DEFAULT))?),
            Emulation::Userspace { .. } => Ok(None),
        }
    }

    /// The kernel's own account of what is installed, from iproute2 in the guest: the qdiscs, or the capture's
    /// interface and routes.
    pub fn show(&self, pair: &VethPair) -> anyhow::Result<String> {
        match self {
            Emulation::Tc(_) => pair.tc_show("qdisc"),
            Emulation::Userspace { .. } => {
                Ok(format!("{}{}", pair.a.ip(&["-o", "link", "show"])?, pair.a.ip(&["route", "show", "table", "all"])?))
            }
        }
    }

    /// Whether `show` holds any of the datapath's state.
    pub fn shows_state(&self, shown: &str) -> bool {
        match self {
            Emulation::Tc(_) => shown.contains("htb") || shown.contains("netem"),
            Emulation::Userspace { .. } => shown.contains(POD_END),
        }
    }
}
