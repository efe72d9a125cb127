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
//! - [`sys`]: the sockets and `ppoll`, the only `unsafe` of this datapath.
//! - [`Shell`] (here): one thread, one poll loop over every pod's socket and the earliest wake-up of all.
//!
//! Why these choices (measured where a number is given, by the tests named): routing, not a tc redirect, takes
//! the packets out, because a route through an interface disappears with it, while a mirred redirect to a
//! vanished device drops what it matches: the pod's traffic would be black-holed while the agent restarts. A
//! packet crosses a veth on its way to the agent, which orphans it from its socket, so the sender's TCP small
//! queues do not throttle it while it waits in the delay line. The raw socket's packets are routed with the
//! socket bound to the pod's interface, which passes over the capture's routes, so nothing is captured twice.

pub mod budget;
pub mod capture;
pub mod pipeline;
mod pod;
pub mod routing;
pub mod shard;
pub mod sys;

pub use pod::{EmulationError, PodEmulation, Userspace};

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use budget::NodeBudget;
use pipeline::{Frame, PodPipeline, Pushed};
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
    /// The loop, its queues (every pod's, draining ones included) held to `budget_bytes` together.
    pub fn start(budget_bytes: u64) -> io::Result<Shell> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(io::Error::from)?;
        let (commands, inbox) = mpsc::channel();
        let epoch = Instant::now();
        let thread = std::thread::Builder::new().name("isthmus-us-loop".into()).spawn(move || {
            Loop::new(read, inbox, epoch, NodeBudget::new(budget_bytes)).run();
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

/// A pod in the loop: its path, and what its earlier pipelines still hold for destinations the current one took
/// no queue from (`Shell::retune`), sent through the path's socket as those scheduled it.
struct Pod {
    path: PodPath,
    draining: Vec<PodPipeline>,
}

impl Pod {
    fn pipelines(&self) -> impl Iterator<Item = &PodPipeline> {
        std::iter::once(&self.path.pipeline).chain(&self.draining)
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.pipelines().filter_map(PodPipeline::next_wakeup).min()
    }

    /// What the pod's pipelines hold, draining ones included.
    fn held(&self) -> u64 {
        self.pipelines().map(PodPipeline::held).sum()
    }

    /// Sends every packet due at `now`, from the current pipeline and the draining ones; forgets those drained.
    fn send_due(&mut self, now: u64, due: &mut Vec<Frame>, counters: &mut ShellCounters, node: &mut NodeBudget) {
        self.path.pipeline.pop_due(now, due, node);
        for old in &mut self.draining {
            old.pop_due(now, due, node);
        }
        self.draining.retain(|old| old.next_wakeup().is_some());
        for frame in due.drain(..) {
            if self.path.tx.send(frame.bytes(), frame.destination()).is_err() {
                counters.send_errors += 1;
            }
        }
    }
}

struct Loop {
    wake: OwnedFd,
    inbox: mpsc::Receiver<Command>,
    pods: HashMap<String, Pod>,
    counters: ShellCounters,
    budget: NodeBudget,
    epoch: Instant,
}

impl Loop {
    fn new(wake: OwnedFd, inbox: mpsc::Receiver<Command>, epoch: Instant, budget: NodeBudget) -> Loop {
        Loop { wake, inbox, pods: HashMap::new(), counters: ShellCounters::default(), budget, epoch }
    }

    fn now(&self) -> u64 {
        clock(self.epoch)
    }

    fn run(mut self) {
        let mut fds: Vec<RawFd> = Vec::new();
        // Beside each descriptor after the wake-up pipe's: the pod and the shard it reads.
        let mut owners: Vec<(String, usize)> = Vec::new();
        let mut readable = Vec::new();
        let mut due = Vec::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let Some(changed) = self.read_commands() else { return };
            // The poll set changes only with the pods: rebuilt then, not at every packet.
            if changed || fds.is_empty() {
                fds.clear();
                owners.clear();
                fds.push(self.wake.as_raw_fd());
                for (name, pod) in &self.pods {
                    for (shard, rx) in pod.path.rx.iter().enumerate() {
                        fds.push(rx.as_raw_fd());
                        owners.push((name.clone(), shard));
                    }
                }
            }
            let now = self.now();
            let next = self.pods.values().filter_map(Pod::next_wakeup).min();
            let timeout = next.map(|at| at.saturating_sub(now));
            if let Err(e) = sys::wait_readable(&fds, timeout, &mut readable) {
                tracing::error!(error = %e, "the userspace datapath's poll failed; the loop ends");
                return;
            }
            if readable.first() == Some(&true) {
                let mut drain = [0u8; 64];
                while nix::unistd::read(&self.wake, &mut drain).is_ok_and(|n| n > 0) {}
            }
            for (i, (name, shard)) in owners.iter().enumerate() {
                if readable.get(i + 1) == Some(&true)
                    && let Some(pod) = self.pods.get_mut(name)
                {
                    receive(&mut pod.path, *shard, &mut buf, self.epoch, &mut self.counters, &mut self.budget);
                }
            }
            let now = self.now();
            for pod in self.pods.values_mut() {
                pod.send_due(now, &mut due, &mut self.counters, &mut self.budget);
            }
        }
    }

    /// Applies the commands waiting: whether the pods (or their sockets) changed, `None` once the Shell is gone.
    fn read_commands(&mut self) -> Option<bool> {
        let mut changed = false;
        loop {
            match self.inbox.try_recv() {
                Ok(Command::Attach(name, path)) => {
                    let mut draining = Vec::new();
                    if let Some(old) = self.pods.remove(&name) {
                        self.counters.capture_overruns += old.path.take_dropped();
                        draining = old.draining;
                        draining.push(old.path.pipeline);
                        draining.retain(|p| p.next_wakeup().is_some());
                    }
                    self.pods.insert(name, Pod { path: *path, draining });
                    changed = true;
                }
                Ok(Command::Retune(name, pipeline)) => {
                    let now = clock(self.epoch);
                    if let Some(pod) = self.pods.get_mut(&name) {
                        let old = std::mem::replace(&mut pod.path.pipeline, *pipeline);
                        if let Some(rest) = pod.path.pipeline.take_over(old, now) {
                            pod.draining.push(rest);
                        }
                    }
                }
                Ok(Command::Detach(name)) => {
                    if let Some(old) = self.pods.remove(&name) {
                        self.budget.release(old.held());
                        self.counters.capture_overruns += old.path.take_dropped();
                        changed = true;
                    }
                }
                Ok(Command::Counters(name, reply)) => {
                    if let Some(pod) = self.pods.get(&name) {
                        self.counters.capture_overruns += pod.path.take_dropped();
                    }
                    let totals = ShellCounters {
                        budget_drops: self.budget.drops(),
                        queued_bytes: self.budget.held(),
                        ..self.counters
                    };
                    let answer = self.pods.get(&name).map(|p| (p.path.pipeline.counters().collect(), totals));
                    let _ = reply.send(answer);
                }
                #[cfg(test)]
                Ok(Command::Panic) => panic!("the loop was asked to fail"),
                Err(mpsc::TryRecvError::Empty) => return Some(changed),
                Err(mpsc::TryRecvError::Disconnected) => return None,
            }
        }
    }
}

/// Reads what is waiting on one of the pod's capture sockets (a bounded batch, so that neither a busy pod nor a
/// busy shard holds up the others or the delay line for long) into its pipeline; packets for no destination
/// leave at once.
fn receive(
    path: &mut PodPath,
    shard: usize,
    buf: &mut [u8],
    epoch: Instant,
    counters: &mut ShellCounters,
    node: &mut NodeBudget,
) {
    const BATCH: usize = 64;
    let len = (path.mtu as usize).clamp(68, buf.len());
    for _ in 0..BATCH {
        let got = match path.rx[shard].recv(&mut buf[..len]) {
            Ok(Some(got)) => got,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "reading a pod's captured packets failed");
                return;
            }
        };
        let Some(frame) = Frame::parse(buf[..got.len].to_vec()) else {
            counters.malformed += 1;
            continue;
        };
        if let Pushed::PassThrough(frame) = path.pipeline.push(frame, clock(epoch), node)
            && path.tx.send(frame.bytes(), frame.destination()).is_err()
        {
            counters.send_errors += 1;
        }
    }
}

#[cfg(test)]
mod tests;
