//! The loop's thread: wait for captured packets or the next departure, read what waits in batches into the
//! pods' pipelines, send what is due in batches.
//!
//! One system call moves up to [`IoBatch`] packets (`recvmmsg`, `sendmmsg`), and the packets' buffers come
//! from a pool ([`Buffers`]), so the loop's own cost per packet is small beside the kernel's: what remains is
//! the kernel's work for each packet sent, the receiver's included when it sits on the same node (its softirq
//! runs in the sending thread).

use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::Instant;

use super::budget::NodeBudget;
use super::buffers::Buffers;
use super::pipeline::{Frame, PodPipeline, Pushed};
use super::sys::{MsgHeaders, PollSet};
use super::{Command, PodPath, ShellCounters, clock};

/// How many packets one system call moves at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoBatch(NonZeroUsize);

impl IoBatch {
    /// What the agent runs with: a pass reads at most this many packets from each socket anyway.
    pub const DEFAULT: IoBatch = IoBatch(NonZeroUsize::new(PASS).unwrap());
    /// A packet per call, as `recvfrom` and `sendto` move them: the benchmark's reference.
    pub const ONE: IoBatch = IoBatch(NonZeroUsize::MIN);

    pub fn get(self) -> usize {
        self.0.get()
    }
}

/// The most packets a pass reads from one capture socket, so that neither a busy pod nor a busy shard holds up
/// the others or the delay line for long.
const PASS: usize = 64;

/// Bytes of buffer capacity the pool keeps between passes: a few hundred packets at the usual MTUs.
const POOL_BYTES: usize = 1 << 20;

/// A pod in the loop: its path, and what its earlier pipelines still hold for destinations the current one took
/// no queue from (`Shell::retune`), sent through the path's socket as those scheduled it.
pub(super) struct Pod {
    name: String,
    pub(super) path: PodPath,
    pub(super) draining: Vec<PodPipeline>,
    /// What leaves in this pass: packets for no destination as they arrive, then those due.
    outgoing: Vec<Frame>,
}

impl Pod {
    fn new(name: String, path: PodPath, draining: Vec<PodPipeline>) -> Pod {
        Pod { name, path, draining, outgoing: Vec::new() }
    }

    fn pipelines(&self) -> impl Iterator<Item = &PodPipeline> {
        std::iter::once(&self.path.pipeline).chain(&self.draining)
    }

    pub(super) fn next_wakeup(&self) -> Option<u64> {
        self.pipelines().filter_map(PodPipeline::next_wakeup).min()
    }

    /// What the pod's pipelines hold, draining ones included.
    pub(super) fn held(&self) -> u64 {
        self.pipelines().map(PodPipeline::held).sum()
    }

    /// Sends what waits in `outgoing` and every packet due at `now`, from the current pipeline and the
    /// draining ones; forgets those drained; gives the packets' buffers back.
    fn send(&mut self, now: u64, io: &mut Io, counters: &mut ShellCounters, node: &mut NodeBudget) {
        self.path.pipeline.pop_due(now, &mut self.outgoing, node);
        for old in &mut self.draining {
            old.pop_due(now, &mut self.outgoing, node);
        }
        self.draining.retain(|old| old.next_wakeup().is_some());
        for chunk in self.outgoing.chunks(io.batch.get()) {
            counters.send_errors += self.path.tx.send_batch(chunk, &mut io.headers);
        }
        for frame in self.outgoing.drain(..) {
            io.buffers.give(frame.into_bytes());
        }
    }
}

/// What the loop's system calls reuse from pass to pass.
struct Io {
    batch: IoBatch,
    headers: MsgHeaders,
    /// Buffers ready for the next `recvmmsg`, one per packet it may read.
    slots: Vec<Vec<u8>>,
    /// Which slots the last read filled with an IP packet.
    got: Vec<usize>,
    buffers: Buffers,
}

pub(super) struct Loop {
    wake: OwnedFd,
    inbox: mpsc::Receiver<Command>,
    /// In no order: a pod's place changes only with the pods, when the poll set is rebuilt.
    pods: Vec<Pod>,
    counters: ShellCounters,
    budget: NodeBudget,
    epoch: Instant,
    io: Io,
}

impl Loop {
    pub(super) fn new(
        wake: OwnedFd,
        inbox: mpsc::Receiver<Command>,
        epoch: Instant,
        budget: NodeBudget,
        batch: IoBatch,
    ) -> Loop {
        let io = Io {
            batch,
            headers: MsgHeaders::default(),
            slots: vec![Vec::new(); batch.get()],
            got: Vec::with_capacity(batch.get()),
            buffers: Buffers::new(POOL_BYTES),
        };
        Loop { wake, inbox, pods: Vec::new(), counters: ShellCounters::default(), budget, epoch, io }
    }

    fn now(&self) -> u64 {
        clock(self.epoch)
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.pods.iter().position(|pod| pod.name == name)
    }

    pub(super) fn run(mut self) {
        let mut poll = PollSet::default();
        // Beside each descriptor after the wake-up pipe's: the pod's place in `pods` and the shard it reads.
        let mut owners: Vec<(usize, usize)> = Vec::new();
        let mut first = true;
        loop {
            let Some(changed) = self.read_commands() else { return };
            // The poll set changes only with the pods: rebuilt then, not at every packet.
            if changed || std::mem::take(&mut first) {
                owners.clear();
                for (at, pod) in self.pods.iter().enumerate() {
                    owners.extend((0..pod.path.rx.len()).map(|shard| (at, shard)));
                }
                let sockets = owners.iter().map(|&(at, shard)| self.pods[at].path.rx[shard].as_raw_fd());
                poll.set(std::iter::once(self.wake.as_raw_fd()).chain(sockets));
            }
            let now = self.now();
            let next = self.pods.iter().filter_map(Pod::next_wakeup).min();
            if let Err(e) = poll.wait(next.map(|at| at.saturating_sub(now))) {
                tracing::error!(error = %e, "the userspace datapath's poll failed; the loop ends");
                return;
            }
            if poll.readable(0) {
                let mut drain = [0u8; 64];
                while nix::unistd::read(&self.wake, &mut drain).is_ok_and(|n| n > 0) {}
            }
            for (i, &(at, shard)) in owners.iter().enumerate() {
                if poll.readable(i + 1) {
                    receive(&mut self.pods[at], shard, &mut self.io, self.epoch, &mut self.counters, &mut self.budget);
                }
            }
            let now = self.now();
            for pod in &mut self.pods {
                pod.send(now, &mut self.io, &mut self.counters, &mut self.budget);
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
                    if let Some(at) = self.find(&name) {
                        let old = self.pods.swap_remove(at);
                        self.counters.capture_overruns += old.path.take_dropped();
                        draining = old.draining;
                        draining.push(old.path.pipeline);
                        draining.retain(|p| p.next_wakeup().is_some());
                    }
                    self.pods.push(Pod::new(name, *path, draining));
                    changed = true;
                }
                Ok(Command::Retune(name, pipeline)) => {
                    let now = clock(self.epoch);
                    if let Some(at) = self.find(&name) {
                        let pod = &mut self.pods[at];
                        let old = std::mem::replace(&mut pod.path.pipeline, *pipeline);
                        if let Some(rest) = pod.path.pipeline.take_over(old, now) {
                            pod.draining.push(rest);
                        }
                    }
                }
                Ok(Command::Detach(name)) => {
                    if let Some(at) = self.find(&name) {
                        let old = self.pods.swap_remove(at);
                        self.budget.release(old.held());
                        self.counters.capture_overruns += old.path.take_dropped();
                        changed = true;
                    }
                }
                Ok(Command::Counters(name, reply)) => {
                    let pod = self.find(&name).map(|at| &self.pods[at]);
                    if let Some(pod) = pod {
                        self.counters.capture_overruns += pod.path.take_dropped();
                    }
                    let totals = ShellCounters {
                        budget_drops: self.budget.drops(),
                        queued_bytes: self.budget.held(),
                        ..self.counters
                    };
                    let answer = pod.map(|p| (p.path.pipeline.counters().collect(), totals));
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

/// Reads what waits on one of the pod's capture sockets, at most [`PASS`] packets, into its pipeline; packets
/// for no destination join what leaves in this pass.
fn receive(
    pod: &mut Pod,
    shard: usize,
    io: &mut Io,
    epoch: Instant,
    counters: &mut ShellCounters,
    node: &mut NodeBudget,
) {
    let len = (pod.path.mtu as usize).clamp(68, 65_536);
    let mut read = 0;
    while read < PASS {
        let want = io.batch.get().min(PASS - read);
        io.got.clear();
        let n = match pod.path.rx[shard].recv_batch(&mut io.slots[..want], len, &mut io.headers, &mut io.got) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading a pod's captured packets failed");
                return;
            }
        };
        let now = clock(epoch);
        for &i in &io.got {
            let bytes = std::mem::replace(&mut io.slots[i], io.buffers.take());
            let frame = match Frame::parse(bytes) {
                Ok(frame) => frame,
                Err(bytes) => {
                    counters.malformed += 1;
                    io.buffers.give(bytes);
                    continue;
                }
            };
            if let Pushed::PassThrough(frame) = pod.path.pipeline.push(frame, now, node) {
                pod.outgoing.push(frame);
            }
        }
        read += n;
        if n < want {
            return;
        }
    }
}
