//! The link emulator of the second datapath (for nodes without `sch_netem`): what the kernel tree does to a
//! destination's packets, as pure code over packets and a clock the caller passes in. The socket shell that
//! takes packets out of a pod's egress and puts them back on the wire is a separate layer; this one has no I/O.
//!
//! One [`Emulator`] per (pod, destination), built from the same parameters the tc tree gets ([`netem_for`],
//! [`tbf_for`]), in the tree's order — a TBF whose inner qdisc is netem, so a packet is delayed first and paced
//! after:
//!
//! ```text
//! push ─► too big for the bucket? ─► netem: duplicate? lost? corrupt? queue full? reorder (at once) or delay
//!                                          │ a duplicate goes through push again, without duplication
//! pop  ◄─ token bucket (rate, burst) ◄─────┘ head queue first, then the delay line by departure time
//! ```
//!
//! Without netem (a rate alone) the queue is TBF's byte FIFO; without a rate there is no bucket.

mod bucket;
mod netem;
pub mod random;

use std::collections::VecDeque;

use isthmus_agent_api::{Counters, Impairment};

pub use bucket::TokenBucket;
pub use netem::{Enqueued, NetemDrop, NetemStage};
pub use random::{Correlated, Rng};

use crate::datapath::QueueBound;
use crate::datapath::units::{netem_for, tbf_for};

/// What the emulator needs of a packet.
pub trait Packet: Clone {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Flips bit `bit` (0–7) of byte `byte` (`byte < len()`).
    fn flip_bit(&mut self, byte: usize, bit: u8);
}

impl Packet for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn flip_bit(&mut self, byte: usize, bit: u8) {
        self[byte] ^= 1 << bit;
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropCause {
    /// Larger than the bucket: it could never leave (TBF drops it at enqueue).
    TooBig,
    Lost,
    QueueFull,
}

/// What became of a pushed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    Queued,
    /// Queued, and a copy too.
    Duplicated,
    /// Queued, its copy dropped.
    CopyDropped(DropCause),
    Dropped(DropCause),
}

/// The queue between arrival and the bucket: netem's, or TBF's own byte FIFO when no netem is needed.
enum Queue<P> {
    Netem(NetemStage<P>),
    Fifo { packets: VecDeque<P>, limit_bytes: u64 },
}

pub struct Emulator<P> {
    queue: Queue<P>,
    bucket: Option<TokenBucket>,
    counters: Counters,
}

impl<P: Packet> Emulator<P> {
    /// The emulator for one destination's impairment, its queue held to `bound`, started at `now`.
    pub fn new(imp: &Impairment, bound: QueueBound, seed: u64, now: u64) -> Self {
        let imp = imp.fields();
        let tbf = tbf_for(imp, bound);
        let queue = if imp.needs_netem() {
            Queue::Netem(NetemStage::new(netem_for(imp, bound), seed))
        } else {
            let limit_bytes = tbf.as_ref().map_or(bound.bytes(), |t| u64::from(t.limit_bytes));
            Queue::Fifo { packets: VecDeque::new(), limit_bytes }
        };
        Emulator { queue, bucket: tbf.map(|t| TokenBucket::new(&t, now)), counters: Counters::default() }
    }

    /// Takes over the queue of `old`, the emulator this one replaces for the same destination, as an in-place
    /// `tc qdisc change` keeps a TBF's and a netem's queue: what `old` holds leaves through this emulator, paced
    /// by its bucket (full, as a changed TBF's is), delayed packets at the times they were given; its counters
    /// carry on, and `old` is left empty. False, and nothing taken, when the queues are of different kinds
    /// (netem added or removed: the tc tree replaces its qdiscs then), for the caller to drain `old` apart.
    pub fn absorb(&mut self, old: &mut Emulator<P>) -> bool {
        match (&mut self.queue, &mut old.queue) {
            (Queue::Netem(ours), Queue::Netem(theirs)) => ours.absorb(theirs),
            (Queue::Fifo { packets: ours, .. }, Queue::Fifo { packets: theirs, .. }) => {
                theirs.append(ours);
                std::mem::swap(ours, theirs);
            }
            _ => return false,
        }
        self.counters += std::mem::take(&mut old.counters);
        true
    }

    /// Sent (`packets`, `bytes`), dropped, held back by the bucket (`overlimits`), and what is queued now.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn push(&mut self, packet: P, now: u64) -> PushOutcome {
        match self.enqueue(packet, now, true) {
            Err(drop) => PushOutcome::Dropped(drop),
            Ok(None) => PushOutcome::Queued,
            Ok(Some(copy)) => match self.enqueue(copy, now, false) {
                Ok(_) => PushOutcome::Duplicated,
                Err(drop) => PushOutcome::CopyDropped(drop),
            },
        }
    }

    /// One packet into the queue; `Ok(Some(copy))` when netem asks for a duplicate to go through again.
    fn enqueue(&mut self, packet: P, now: u64, may_duplicate: bool) -> Result<Option<P>, DropCause> {
        let len = packet.len() as u64;
        if self.bucket.as_ref().is_some_and(|b| !b.admits(packet.len())) {
            return Err(self.dropped(DropCause::TooBig));
        }
        let result = match &mut self.queue {
            Queue::Netem(netem) => match netem.enqueue(packet, now, may_duplicate) {
                Enqueued::Queued { duplicate } => Ok(duplicate),
                Enqueued::Dropped(NetemDrop::Lost) => Err(DropCause::Lost),
                Enqueued::Dropped(NetemDrop::QueueFull) => Err(DropCause::QueueFull),
            },
            Queue::Fifo { packets, limit_bytes } => {
                // bfifo accepts while the backlog with this packet stays within the limit.
                if self.counters.backlog_bytes + len <= *limit_bytes {
                    packets.push_back(packet);
                    Ok(None)
                } else {
                    Err(DropCause::QueueFull)
                }
            }
        };
        match result {
            Ok(copy) => {
                self.counters.backlog_packets += 1;
                self.counters.backlog_bytes += len;
                Ok(copy)
            }
            Err(drop) => Err(self.dropped(drop)),
        }
    }

    fn dropped(&mut self, drop: DropCause) -> DropCause {
        self.counters.drops += 1;
        drop
    }

    /// The next packet that may leave at `now`, if any.
    pub fn pop(&mut self, now: u64) -> Option<P> {
        let len = self.peek(now)?.len();
        if let Some(bucket) = &mut self.bucket
            && bucket.take(len, now).is_err()
        {
            self.counters.overlimits += 1;
            return None;
        }
        let packet = match &mut self.queue {
            Queue::Netem(netem) => netem.dequeue(now),
            Queue::Fifo { packets, .. } => packets.pop_front(),
        }?;
        self.counters.backlog_packets -= 1;
        self.counters.backlog_bytes -= packet.len() as u64;
        self.counters.packets += 1;
        self.counters.bytes += packet.len() as u64;
        Some(packet)
    }

    fn peek(&self, now: u64) -> Option<&P> {
        match &self.queue {
            Queue::Netem(netem) => netem.peek(now),
            Queue::Fifo { packets, .. } => packets.front(),
        }
    }

    /// When [`Emulator::pop`] can next return a packet, at the earliest `now`; `None` when nothing is queued.
    pub fn next_wakeup(&self, now: u64) -> Option<u64> {
        let due = match &self.queue {
            Queue::Netem(netem) => netem.next_due()?.max(now),
            Queue::Fifo { packets, .. } => packets.front().map(|_| now)?,
        };
        match (&self.bucket, self.peek(due)) {
            (Some(bucket), Some(p)) => Some(bucket.ready_at(p.len(), due)),
            _ => Some(due),
        }
    }
}

#[cfg(test)]
mod tests;
