//! How much the queues of one interface may hold: the agent's byte budgets (per destination, per pod) and the
//! bound they put on each destination's queues. Pure.
//!
//! Why: netem orphans the packets it queues (they no longer count against the sender's socket), so a queue sized
//! from a bandwidth-delay product — at 3,600 s of latency and no rate, billions of packets — lets one pod that
//! floods UDP hold node memory without limit. Every queue the datapath installs is therefore bounded in bytes:
//! - a destination's queue holds at most the per-destination budget;
//! - the per-pod budget (one interface of one pod) is split evenly over the interface's destinations, so that
//!   the destinations' queues together hold at most the per-pod budget — a fixed share, not first come first
//!   served, so that one destination's traffic never takes another's queue away;
//! - netem counts packets, not bytes: its limit is the bound divided by the interface's full frame (its MTU plus
//!   the Ethernet header; [`FRAME_BYTES`] until the interface is known), at least one packet. A packet larger than
//!   a frame (a GSO super-packet, up to 64 KiB) would still count as one, so the tree puts a TBF whose largest
//!   packet is a frame ahead of every netem: it cuts GSO packets into frames before netem counts them
//!   (`tree.rs`).

use super::handles::MAX_DESTINATIONS;

/// Frame size that turns bytes into netem's packet count and a queue limit in packets into TBF's bytes:
/// Ethernet's 1,500-byte MTU plus its 14-byte header.
pub const FRAME_BYTES: u64 = 1514;
/// Default budget of one destination's queue: 16 MiB, 11,081 full frames; 1 Gbit/s for 134 ms.
pub const DEFAULT_BYTES_PER_DESTINATION: u64 = 16 << 20;
/// Default budget of one pod's interface, shared by its destinations: 64 MiB.
pub const DEFAULT_BYTES_PER_POD: u64 = 64 << 20;
/// The smallest per-pod budget: one frame for each destination an interface may have, so that no share is ever
/// below one packet and the shares never add up to more than the budget.
pub const MIN_BYTES_PER_POD: u64 = MAX_DESTINATIONS as u64 * FRAME_BYTES;

/// The agent's queue budgets, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBudget {
    per_destination: u64,
    per_pod: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueBudgetError {
    #[error("queue bytes per destination: {0} bytes is less than one frame ({FRAME_BYTES} bytes)")]
    DestinationBelowFrame(u64),
    #[error(
        "queue bytes per pod: {0} bytes is less than one frame for each of the {MAX_DESTINATIONS} destinations an \
         interface may have ({MIN_BYTES_PER_POD} bytes)"
    )]
    PodBelowMinimum(u64),
}

impl Default for QueueBudget {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl QueueBudget {
    pub const DEFAULT: QueueBudget =
        QueueBudget { per_destination: DEFAULT_BYTES_PER_DESTINATION, per_pod: DEFAULT_BYTES_PER_POD };

    pub fn new(per_destination: u64, per_pod: u64) -> Result<Self, QueueBudgetError> {
        if per_destination < FRAME_BYTES {
            return Err(QueueBudgetError::DestinationBelowFrame(per_destination));
        }
        if per_pod < MIN_BYTES_PER_POD {
            return Err(QueueBudgetError::PodBelowMinimum(per_pod));
        }
        Ok(Self { per_destination, per_pod })
    }

    pub fn per_destination(&self) -> u64 {
        self.per_destination
    }

    pub fn per_pod(&self) -> u64 {
        self.per_pod
    }

    /// The bound on each destination's queue on an interface with `destinations` destinations: the
    /// per-destination budget or an even share of the per-pod one, whichever is smaller, at least one frame.
    pub fn bound(&self, destinations: usize) -> QueueBound {
        let share = self.per_pod / destinations.max(1) as u64;
        QueueBound { bytes: self.per_destination.min(share).max(FRAME_BYTES), frame: FRAME_BYTES }
    }
}

/// The most one destination's queues may hold, and the largest frame its interface sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueBound {
    bytes: u64,
    frame: u64,
}

impl QueueBound {
    /// No bound beyond the kernel's field widths.
    pub const UNBOUNDED: QueueBound = QueueBound { bytes: u64::MAX, frame: FRAME_BYTES };

    pub fn bytes(self) -> u64 {
        self.bytes
    }

    /// The interface's full frame: its MTU plus the Ethernet header.
    pub fn frame(self) -> u64 {
        self.frame
    }

    /// The bound on an interface whose MTU is `mtu`.
    pub fn with_mtu(self, mtu: u32) -> QueueBound {
        QueueBound { frame: u64::from(mtu) + ETHERNET_HEADER_BYTES, ..self }
    }

    /// netem's limit: the full frames that fit in the bound, at least one.
    pub fn packets(self) -> u32 {
        (self.bytes / self.frame).clamp(1, u64::from(u32::MAX)) as u32
    }
}

/// What an Ethernet frame adds to the MTU (no VLAN tag: pods' interfaces carry none).
pub const ETHERNET_HEADER_BYTES: u64 = 14;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let b = QueueBudget::DEFAULT;
        assert_eq!(QueueBudget::new(b.per_destination(), b.per_pod()), Ok(b));
        assert_eq!(b.bound(1).bytes(), DEFAULT_BYTES_PER_DESTINATION);
        assert_eq!(b.bound(1).packets(), 11_081);
        assert_eq!(b.bound(8).bytes(), DEFAULT_BYTES_PER_POD / 8, "eight destinations share the pod's budget");
        assert_eq!(b.bound(0), b.bound(1));
        let text = QueueBudget::new(1000, DEFAULT_BYTES_PER_POD).unwrap_err().to_string();
        assert!(text.contains("per destination") && text.contains("1514"), "{text}");
        let text = QueueBudget::new(FRAME_BYTES, MIN_BYTES_PER_POD - 1).unwrap_err().to_string();
        assert!(text.contains("per pod") && text.contains("4095"), "{text}");
        assert_eq!(QueueBound::UNBOUNDED.packets(), u32::MAX);
    }

    fn budget() -> impl Strategy<Value = QueueBudget> {
        (FRAME_BYTES..=1u64 << 40, MIN_BYTES_PER_POD..=1u64 << 42)
            .prop_map(|(d, p)| QueueBudget::new(d, p).expect("in range"))
    }

    proptest! {
        #[test]
        fn bounds_hold_and_are_at_least_one_packet(budget in budget(), n in 1usize..=MAX_DESTINATIONS) {
            let bound = budget.bound(n);
            prop_assert!(bound.bytes() <= budget.per_destination());
            prop_assert!(bound.bytes() * n as u64 <= budget.per_pod(), "the shares fit the pod's budget");
            prop_assert!(bound.packets() >= 1);
            prop_assert!(u64::from(bound.packets()) * FRAME_BYTES <= bound.bytes(), "full frames fit the bound");
        }

        #[test]
        fn bounds_are_monotone(budget in budget(), n in 1usize..MAX_DESTINATIONS, more in 0u64..1 << 30) {
            prop_assert!(budget.bound(n + 1) <= budget.bound(n), "more destinations never get more each");
            let bigger = QueueBudget::new(budget.per_destination() + more, budget.per_pod() + more).unwrap();
            prop_assert!(bigger.bound(n) >= budget.bound(n));
            prop_assert!(bigger.bound(n).packets() >= budget.bound(n).packets());
        }
    }
}
