//! The memory the userspace datapath's queues may hold on one node: every pod's pipeline and every pipeline still
//! draining after an edit together, against one budget below the agent's own memory limit. Pure.
//!
//! Why: the per-destination and per-pod bounds ([`crate::datapath::QueueBudget`]) bound the kernel's queues one
//! interface at a time, but the userspace datapath's queues live in the agent's memory: four pods flooding a long
//! link, or an edit under load (the old pipeline keeps its packets until they leave), could hold more than the
//! agent's limit, and the kernel would kill the agent, and with it every pod's impairment on the node. The node's
//! budget is checked at every packet a pipeline would queue; past it the packet is dropped and counted.

use isthmus_agent_api::Counters;

/// What the loop holds per queued packet beyond its bytes: its slot in a delay line or FIFO (the frame's own
/// fields and its departure time), twice over because a growing queue's capacity runs up to double its length, and
/// the allocator's header of its buffer. An upper estimate (checked in the tests below), so that a flood of small
/// packets is bounded as surely as one of large ones.
pub const PACKET_OVERHEAD: u64 = 192;
/// The least budget the agent accepts: a few maximal IP packets.
pub const MIN_BYTES: u64 = 1 << 20;
/// The budget where the agent knows no memory limit of its own.
pub const DEFAULT_BYTES: u64 = 128 << 20;
/// What the agent keeps for itself (its plans, trees, TLS, measurements, and the runtime) beside the queues when
/// it knows its memory limit.
pub const AGENT_RESERVE: u64 = 32 << 20;

/// The memory held by queued packets with these counters.
pub fn held(counters: &Counters) -> u64 {
    counters.backlog_bytes + counters.backlog_packets * PACKET_OVERHEAD
}

/// The memory one more queued packet of `len` bytes takes.
pub fn cost(len: usize) -> u64 {
    len as u64 + PACKET_OVERHEAD
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeBudgetError {
    #[error("--userspace-queue-bytes: {0} bytes is less than the least budget ({MIN_BYTES} bytes)")]
    BelowMinimum(u64),
    #[error(
        "--userspace-queue-bytes: {bytes} bytes leave less than {AGENT_RESERVE} bytes of the agent's memory limit \
         ({limit} bytes, resources.limits.memory) for the agent itself: lower agent.queue.userspaceBytes or raise \
         agent.resources.limits.memory"
    )]
    AboveLimit { bytes: u64, limit: u64 },
}

/// The node's budget from the flag (`explicit`) and the agent's memory limit, where it knows one: an explicit
/// budget must leave [`AGENT_RESERVE`] of the limit; without one, half the limit (at least [`MIN_BYTES`]), or
/// [`DEFAULT_BYTES`] with no limit known.
pub fn resolve(explicit: Option<u64>, memory_limit: Option<u64>) -> Result<u64, NodeBudgetError> {
    match (explicit, memory_limit) {
        (Some(bytes), _) if bytes < MIN_BYTES => Err(NodeBudgetError::BelowMinimum(bytes)),
        (Some(bytes), Some(limit)) if bytes.saturating_add(AGENT_RESERVE) > limit => {
            Err(NodeBudgetError::AboveLimit { bytes, limit })
        }
        (Some(bytes), _) => Ok(bytes),
        (None, Some(limit)) => Ok((limit / 2).max(MIN_BYTES)),
        (None, None) => Ok(DEFAULT_BYTES),
    }
}

/// What the node's queues hold, against their budget. The loop owns the one instance and passes it to every
/// pipeline's push and pop, so that a packet is admitted against everything queued on the node, draining
/// pipelines included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBudget {
    limit: u64,
    held: u64,
    /// Packets dropped because the budget was reached.
    drops: u64,
}

impl NodeBudget {
    pub fn new(limit: u64) -> Self {
        NodeBudget { limit, held: 0, drops: 0 }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What the node's queues hold now. At most the limit, plus one packet's copy when a duplicating
    /// destination queued a packet and its copy at once.
    pub fn held(&self) -> u64 {
        self.held
    }

    pub fn drops(&self) -> u64 {
        self.drops
    }

    /// Whether a packet of `len` bytes may be queued; counts a drop when not.
    pub fn admit(&mut self, len: usize) -> bool {
        let fits = self.held.saturating_add(cost(len)) <= self.limit;
        self.drops += u64::from(!fits);
        fits
    }

    /// A queue went from holding `before` to holding `after` (see [`held`]).
    pub fn changed(&mut self, before: u64, after: u64) {
        self.held = (self.held + after).saturating_sub(before);
    }

    /// A pipeline holding `held` was dropped with its packets.
    pub fn release(&mut self, held: u64) {
        self.held = self.held.saturating_sub(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_from_the_flag_and_the_memory_limit() {
        assert_eq!(resolve(None, None), Ok(DEFAULT_BYTES));
        assert_eq!(resolve(None, Some(256 << 20)), Ok(128 << 20), "half the agent's limit");
        assert_eq!(resolve(None, Some(1 << 20)), Ok(MIN_BYTES));
        assert_eq!(resolve(Some(200 << 20), Some(256 << 20)), Ok(200 << 20));
        assert_eq!(resolve(Some(224 << 20), Some(256 << 20)), Ok(224 << 20), "exactly the reserve left");
        assert_eq!(resolve(Some(4 << 30), None), Ok(4 << 30), "no limit known: as asked");
        let text = resolve(Some((224 << 20) + 1), Some(256 << 20)).unwrap_err().to_string();
        assert!(text.contains("--userspace-queue-bytes") && text.contains("268435456"), "{text}");
        let text = resolve(Some(1000), None).unwrap_err().to_string();
        assert!(text.contains("--userspace-queue-bytes") && text.contains("1000 bytes"), "{text}");
    }

    #[test]
    fn a_packet_is_admitted_while_it_fits_and_counted_when_it_does_not() {
        let mut b = NodeBudget::new(cost(1000) * 2);
        assert!(b.admit(1000));
        b.changed(0, cost(1000));
        assert!(b.admit(1000));
        b.changed(cost(1000), 2 * cost(1000));
        assert!(!b.admit(1), "full");
        assert_eq!((b.held(), b.drops()), (b.limit(), 1));
        b.changed(2 * cost(1000), cost(1000));
        assert!(b.admit(1000), "room again once a packet left");
        b.release(cost(1000));
        assert_eq!(b.held(), 0);
        b.release(1);
        assert_eq!(b.held(), 0, "never below nothing");
    }

    #[test]
    fn the_overhead_covers_what_a_queued_packet_takes_beyond_its_bytes() {
        // A delay line's slot: the frame, its departure time and sequence; up to twice over (a queue's capacity
        // doubles as it grows); and the allocator's header of the frame's buffer (16 bytes on glibc and musl).
        let slot = std::mem::size_of::<crate::userspace::pipeline::Frame>() + 2 * std::mem::size_of::<u64>();
        let most = 2 * slot + 16;
        assert!(most as u64 <= PACKET_OVERHEAD, "{most} bytes per packet beyond its own");
    }
}
