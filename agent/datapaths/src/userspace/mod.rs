//! The second datapath, for nodes whose kernel has no `sch_netem`: the agent emulates the link itself.
//!
//! ```text
//! pod netns:  app ─► route to an impaired destination ─► isth-u0 ══ veth ══╗
//!                                                                           ║ agent's own netns (unpinned)
//! agent:      RxSocket × SHARDS (AF_PACKET, cBPF by destination) ◄─ agent end ╝
//!               └─► PodPipeline: emulator per destination (delay line, loss, duplication, corruption,
//!                   reordering, token bucket) ─► TxSocket (raw IP, bound to the pod's eth0) ─► wire
//! ```
//!
//! - [`capture`]: the veth pair and the routes (netlink); fail-open when the agent dies.
//! - [`routing`]: the capture's own routing table and rules, and the pod's reverse-path filter while captured.
//! - [`pipeline`]: pure: which destination a packet is for, its emulator, when the next one leaves.
//! - [`shard`]: pure: which of the pod's capture sockets a packet queues on, so that no destination's backlog
//!   holds up another's while the loop falls behind.
//! - [`sys`]: the sockets, their batched reads and sends (`recvmmsg`, `sendmmsg`) and `ppoll`, the only
//!   `unsafe` of this datapath.
//! - [`Shell`] (here): one thread, talked to by commands; `event_loop`: that thread's poll loop over every pod's
//!   sockets and the earliest wake-up of all; `buffers`: the packet buffers it reuses.
//!
//! Why these choices (measured where a number is given, by the tests named): routing, not a tc redirect, takes
//! the packets out, because a route through an interface disappears with it, while a mirred redirect to a
//! vanished device drops what it matches: the pod's traffic would be black-holed while the agent restarts. A
//! packet crosses a veth on its way to the agent, which orphans it from its socket, so the sender's TCP small
//! queues do not throttle it while it waits in the delay line. The raw socket's packets are routed with the
//! socket bound to the pod's interface, which passes over the capture's routes, so nothing is captured twice.

pub mod budget;
mod buffers;
pub mod capture;
mod event_loop;
pub mod pipeline;
mod pod;
pub mod routing;
pub mod shard;
pub mod sys;

pub use event_loop::IoBatch;
pub use pod::{EmulationError, PodEmulation, Userspace};

use std::io;
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use budget::NodeBudget;
use pipeline::PodPipeline;
use sys::{RxSocket, TxSocket};

/// A pod's part in the loop: where its packets arrive, where they leave, what happens in between.
pub struct PodPath {
    /// One socket per shard of destination addresses (`shard::SHARDS`), each its own kernel queue.
    pub rx: Vec<RxSocket>,
    pub tx: TxSocket,
    pub pipeline: PodPipeline,
    /// The longest packet the capture passes (its MTU).
    pub mtu: u32,
}

impl PodPath {
    /// The path through `capture` for `pipeline`: its packet sockets opened in the agent's namespace `agent_ns`,
    /// its raw sockets on `interface` in the pod's namespace `pod_ns`.
    pub async fn open(
        agent_ns: &crate::netns::Netns,
        pod_ns: &crate::netns::Netns,
        capture: &capture::Capture,
        interface: &str,
        pipeline: PodPipeline,
    ) -> Result<PodPath, EmulationError> {
        let agent_end = capture.agent_end;
        let socket = |action| move |source| EmulationError::Socket { action, source };
        let rx = agent_ns
            .run_inside(move || {
                (0..shard::SHARDS).map(|s| RxSocket::open(agent_end, &shard::filter(s))).collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(socket("enter the agent's namespace"))?
            .map_err(socket("open the capture's packet sockets"))?;
        let name = interface.to_owned();
        let tx = pod_ns
            .run_inside(move || TxSocket::open(&name))
            .await
            .map_err(socket("enter the pod's namespace"))?
            .map_err(socket("open the raw sockets on the pod's interface"))?;
        Ok(PodPath { rx, tx, pipeline, mtu: capture.mtu })
    }

    /// Packets the kernel dropped from the capture's sockets since the last call (their queues were full).
    fn take_dropped(&self) -> u64 {
        self.rx.iter().map(|rx| rx.take_dropped().unwrap_or(0)).sum()
    }
}

/// What the loop counts beyond each emulator's own counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShellCounters {
    /// Packets the raw socket refused (its queue full, or no route out of the pod's interface).
    pub send_errors: u64,
    /// Captured frames that were not IP packets the pipeline could read.
    pub malformed: u64,
    /// Packets the kernel dropped from a capture's socket because the loop had not read it in time (counted
    /// when a pod's counters are read, and when its socket closes). No destination's counters have them.
    pub capture_overruns: u64,
    /// Packets dropped because the node's queues held their budget ([`budget`]). No destination's counters have
    /// them either.
    pub budget_drops: u64,
    /// Not a counter: what the node's queues hold at the time of reading, draining pipelines included.
    pub queued_bytes: u64,
}

/// A pod's destinations' counters (longest prefix first), and the loop's own.
pub type PodCounters = (Vec<(ipnet::IpNet, isthmus_agent_api::Counters)>, ShellCounters);

enum Command {
    Attach(String, Box<PodPath>),
    /// A new pipeline for an attached pod, on the sockets it has.
    Retune(String, Box<PodPipeline>),
    Detach(String),
    /// Replies with the pod's destinations' counters and the loop's.
    Counters(String, mpsc::Sender<Option<PodCounters>>),
    /// Ends the loop as a bug would: the tests of what a stopped loop leads to.
    #[cfg(test)]
    Panic,
}

/// Nanoseconds since `epoch`: the emulators' clock.
fn clock(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// The loop's thread and the way to talk to it. Dropping it stops the loop (its pods' captures stay until
/// detached or the agent ends).
pub struct Shell {
    commands: mpsc::Sender<Command>,
    /// Writing a byte wakes the loop to read its commands.
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
    epoch: Instant,
}

impl Shell {
    /// The loop, its queues (every pod's, draining ones included) held to `budget_bytes` together, moving up to
    /// `batch` packets per system call.
    pub fn start(budget_bytes: u64, batch: IoBatch) -> io::Result<Shell> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(io::Error::from)?;
        let (commands, inbox) = mpsc::channel();
        let epoch = Instant::now();
        let thread = std::thread::Builder::new().name("isthmus-us-loop".into()).spawn(move || {
            event_loop::Loop::new(read, inbox, epoch, NodeBudget::new(budget_bytes), batch).run();
        })?;
        Ok(Shell { commands, wake: write, thread: Some(thread), epoch })
    }

    /// The loop's clock, for the pipelines handed to it (`PodPipeline::new`'s `now`).
    pub fn now(&self) -> u64 {
        clock(self.epoch)
    }

    /// Whether the loop still runs. It ends on its own only by a bug (a panic) or a failed poll; then nothing
    /// reads the captures and every captured packet is lost, which the agent turns into fail-open
    /// ([`super::Userspace::fail_open`]).
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn send(&self, command: Command) {
        // The loop ends only when the Shell is dropped, or by a bug ([`Shell::running`]); a command sent to an
        // ended loop is lost, and a caller waiting for a reply gets none.
        let _ = self.commands.send(command);
        let _ = nix::unistd::write(&self.wake, &[1]);
    }

    /// Starts (or replaces) `pod`'s path. Packets the replaced path's pipeline holds still leave when it
    /// scheduled them.
    pub fn attach(&self, pod: &str, path: PodPath) {
        self.send(Command::Attach(pod.to_owned(), Box::new(path)));
    }

    /// Gives an attached `pod` a new pipeline on the sockets it has. A destination both pipelines have keeps its
    /// queue, now paced by its new bucket, its delayed packets leaving when they were due
    /// ([`PodPipeline::take_over`]); what the old pipeline holds for destinations gone still leaves when it
    /// scheduled them. Not a new path: a second packet socket on the capture would receive a copy of
    /// every packet until the loop swapped them, and both pipelines would send it. Ignored for a pod not
    /// attached.
    pub fn retune(&self, pod: &str, pipeline: PodPipeline) {
        self.send(Command::Retune(pod.to_owned(), Box::new(pipeline)));
    }

    /// Stops reading `pod`'s packets; those still in its delay line are dropped.
    pub fn detach(&self, pod: &str) {
        self.send(Command::Detach(pod.to_owned()));
    }

    /// `pod`'s destinations' counters and the loop's own; `None` for a pod not attached.
    pub fn counters(&self, pod: &str) -> Option<PodCounters> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Counters(pod.to_owned(), tx));
        rx.recv().ok().flatten()
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let (dead, _) = mpsc::channel();
        // Dropping the only sender ends the loop at its next wake-up.
        self.commands = dead;
        let _ = nix::unistd::write(&self.wake, &[1]);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests;
