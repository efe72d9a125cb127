//! One pod's captured packets through its destinations' emulators: pure, over packets and a clock passed in.
//!
//! A packet is matched to the destination with the longest prefix that holds its destination address (the capture
//! routes it the same way), goes through that destination's [`Emulator`], and leaves when the emulator lets it.
//! A timer heap holds one wake-up per destination with packets waiting, so a pod with thousands of
//! destinations costs a heap operation per packet, not a scan.

use ipnet::IpNet;
use isthmus_agent_api::{Counters, Impairment};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::budget::{self, NodeBudget};
use crate::datapath::QueueBound;
use crate::emulator::{Emulator, Packet, PushOutcome};

/// The Ethernet header the pod's interface puts before each packet. The kernel's qdiscs count it in a packet's
/// length (rates, queue bytes, netem's choice of the byte to corrupt); the emulator does the same, so both
/// datapaths give one impairment one meaning.
pub const LINK_HEADER: usize = 14;

/// A captured IP packet on its way through the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    bytes: Vec<u8>,
    destination: IpAddr,
    /// The bytes of the IPv4 header, which the kernel rewrites (length, checksum) when the packet is sent again.
    v4_header: usize,
    /// A corrupted bit that makes the receiver drop the packet, which the raw socket's rewrite would hide.
    doomed: bool,
}

impl Frame {
    /// The bytes given back, for the buffer pool, when they do not start with a well-formed IPv4 or IPv6 header.
    pub fn parse(bytes: Vec<u8>) -> Result<Frame, Vec<u8>> {
        match Frame::header(&bytes) {
            Some((destination, v4_header)) => Ok(Frame { bytes, destination, v4_header, doomed: false }),
            None => Err(bytes),
        }
    }

    /// The destination and the IPv4 header's length (0 for IPv6).
    fn header(bytes: &[u8]) -> Option<(IpAddr, usize)> {
        match bytes.first()? >> 4 {
            4 => {
                let header = usize::from(bytes[0] & 0x0f) * 4;
                let octets: [u8; 4] = bytes.get(16..20)?.try_into().ok()?;
                (header >= 20 && bytes.len() >= header).then_some((IpAddr::V4(Ipv4Addr::from(octets)), header))
            }
            6 => {
                let octets: [u8; 16] = bytes.get(24..40)?.try_into().ok()?;
                Some((IpAddr::V6(Ipv6Addr::from(octets)), 0))
            }
            _ => None,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

impl super::sys::Outgoing for Frame {
    fn packet(&self) -> &[u8] {
        &self.bytes
    }

    fn destination(&self) -> IpAddr {
        self.destination
    }
}

impl Packet for Frame {
    /// On the wire: with its Ethernet header.
    fn len(&self) -> usize {
        LINK_HEADER + self.bytes.len()
    }

    /// netem flips a bit anywhere in the Ethernet frame. The receiver drops a frame whose destination MAC or
    /// EtherType changed, and a packet whose IPv4 header checksum fails; the raw socket that sends the packet on
    /// writes its own Ethernet header and a fresh IPv4 checksum, so such a flip is remembered and the packet
    /// dropped here instead. A flipped source MAC changes nothing; IPv6 has no header checksum, so its flips
    /// travel, as with netem.
    fn flip_bit(&mut self, byte: usize, bit: u8) {
        match byte.checked_sub(LINK_HEADER) {
            None => self.doomed |= !(6..12).contains(&byte),
            Some(at) => {
                self.bytes[at] ^= 1 << bit;
                self.doomed |= at < self.v4_header;
            }
        }
    }
}

/// What the pipeline did with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// To a destination's emulator, with its verdict.
    Emulated(PushOutcome),
    /// No destination holds its address (a route the capture has not yet withdrawn): it goes on unchanged.
    PassThrough(Frame),
    /// For a destination, but the node's queues hold their budget: dropped, and counted by the budget.
    OverBudget,
    /// Not the pod's traffic: what the capture's own interface sends when it comes up (IPv6 neighbour
    /// discovery, multicast reports, anything to a multicast or link-local address). Dropped: on the pod's
    /// interface it would carry the capture's address, and the pod's traffic reaches the capture only through
    /// routes to unicast destinations beyond the link.
    Stray,
}

/// Whether a packet for no destination may go on to the pod's interface (see [`Pushed::Stray`]).
fn beyond_the_link(destination: IpAddr) -> bool {
    match destination {
        IpAddr::V4(a) => !(a.is_multicast() || a.is_broadcast() || a.is_link_local() || a.is_unspecified()),
        IpAddr::V6(a) => !(a.is_multicast() || a.is_unicast_link_local() || a.is_unspecified()),
    }
}

struct Destination {
    net: IpNet,
    emulator: Emulator<Frame>,
    /// The wake-up of this destination in the heap that is current (older entries for it are skipped).
    scheduled: Option<u64>,
}

/// One pod's destinations and their emulators.
pub struct PodPipeline {
    /// Longest prefix first, so the first match is the longest.
    destinations: Vec<Destination>,
    wakeups: BinaryHeap<Reverse<(u64, usize)>>,
    /// Packets a bit flip doomed (see [`Frame::flip_bit`]).
    doomed: u64,
}

impl PodPipeline {
    /// Emulators for `destinations` (at most one per prefix), each queue held to `bound`, started at `now`;
    /// `seed` makes the random draws of a run repeatable.
    pub fn new<'a>(
        destinations: impl IntoIterator<Item = (&'a IpNet, &'a Impairment)>,
        bound: QueueBound,
        seed: u64,
        now: u64,
    ) -> Self {
        let mut destinations: Vec<Destination> = destinations
            .into_iter()
            .enumerate()
            .map(|(i, (net, imp))| Destination {
                net: *net,
                emulator: Emulator::new(imp, bound, seed.wrapping_add(i as u64), now),
                scheduled: None,
            })
            .collect();
        destinations.sort_by_key(|d| Reverse(d.net.prefix_len()));
        PodPipeline { destinations, wakeups: BinaryHeap::new(), doomed: 0 }
    }

    fn find(&self, address: IpAddr) -> Option<usize> {
        self.destinations.iter().position(|d| d.net.contains(&address))
    }

    /// A captured packet into its destination's emulator, if the node's queues have room for it.
    pub fn push(&mut self, frame: Frame, now: u64, node: &mut NodeBudget) -> Pushed {
        let Some(i) = self.find(frame.destination) else {
            return if beyond_the_link(frame.destination) { Pushed::PassThrough(frame) } else { Pushed::Stray };
        };
        if !node.admit(frame.len()) {
            return Pushed::OverBudget;
        }
        let emulator = &mut self.destinations[i].emulator;
        let before = budget::held(&emulator.counters());
        let verdict = emulator.push(frame, now);
        node.changed(before, budget::held(&emulator.counters()));
        self.reschedule(i, now);
        Pushed::Emulated(verdict)
    }

    /// Puts the destination's next wake-up in the heap when it is earlier than the one there.
    fn reschedule(&mut self, i: usize, now: u64) {
        let d = &mut self.destinations[i];
        if let Some(at) = d.emulator.next_wakeup(now)
            && d.scheduled.is_none_or(|s| at < s)
        {
            d.scheduled = Some(at);
            self.wakeups.push(Reverse((at, i)));
        }
    }

    /// Takes over the queues of `old`, the pipeline this one replaces, for every destination both have
    /// ([`Emulator::absorb`]: an edit changes a destination in place, as the tc tree changes its qdiscs, so a
    /// lowered rate paces what is already queued and no second bucket sends beside the new one). Returns what is
    /// left of `old` that still holds packets — destinations this one lacks, or whose queue changed kind — to
    /// drain on its own schedule.
    pub fn take_over(&mut self, old: PodPipeline, now: u64) -> Option<PodPipeline> {
        self.doomed += old.doomed;
        let mut left = Vec::new();
        for Destination { net, mut emulator, .. } in old.destinations {
            let taken = self.destinations.iter().position(|d| d.net == net).filter(|&i| {
                let ours = &mut self.destinations[i];
                ours.emulator.absorb(&mut emulator)
            });
            match taken {
                Some(i) => {
                    self.destinations[i].scheduled = None;
                    self.reschedule(i, now);
                }
                None => left.push(Destination { net, emulator, scheduled: None }),
            }
        }
        let mut rest = PodPipeline { destinations: left, wakeups: BinaryHeap::new(), doomed: 0 };
        for i in 0..rest.destinations.len() {
            rest.reschedule(i, now);
        }
        rest.next_wakeup().is_some().then_some(rest)
    }

    /// Appends to `out` every packet that may leave at `now`, in departure order per destination, and gives the
    /// node's budget back what they held.
    pub fn pop_due(&mut self, now: u64, out: &mut Vec<Frame>, node: &mut NodeBudget) {
        while let Some(&Reverse((at, i))) = self.wakeups.peek() {
            if at > now {
                break;
            }
            self.wakeups.pop();
            if self.destinations[i].scheduled != Some(at) {
                continue;
            }
            self.destinations[i].scheduled = None;
            let emulator = &mut self.destinations[i].emulator;
            let before = budget::held(&emulator.counters());
            while let Some(frame) = emulator.pop(now) {
                if frame.doomed {
                    self.doomed += 1;
                } else {
                    out.push(frame);
                }
            }
            node.changed(before, budget::held(&emulator.counters()));
            self.reschedule(i, now);
        }
    }

    /// When [`PodPipeline::pop_due`] next has something to do; `None` while nothing is queued.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.wakeups.peek().map(|Reverse((at, _))| *at)
    }

    /// Each destination's counters, longest prefix first.
    pub fn counters(&self) -> impl Iterator<Item = (IpNet, Counters)> + '_ {
        self.destinations.iter().map(|d| (d.net, d.emulator.counters()))
    }

    /// What the pipeline's queues hold, as the node's budget counts it.
    pub fn held(&self) -> u64 {
        self.destinations.iter().map(|d| budget::held(&d.emulator.counters())).sum()
    }

    /// Packets dropped because a corrupted bit would have made their receiver drop them.
    pub fn doomed(&self) -> u64 {
        self.doomed
    }
}

#[cfg(test)]
mod tests;
