//! What netem does to each packet, replicated from `net/sched/sch_netem.c` for the parameters isthmus gives it
//! (the same [`Netem`] model the kernel gets): `netem_enqueue`'s decisions in its order, the loss models,
//! `tabledist` without a distribution table, the time-ordered queue and the head queue of reordered packets.
//! Pure: the caller passes the time (nanoseconds on any monotonic clock).
//!
//! Where it differs from the kernel, on purpose: the randomness is seeded, and jitter is drawn by scaling rather
//! than `rnd % (2 * jitter)` (no modulo bias; the API keeps jitter within netem's 31 bits of nanoseconds).

use std::collections::{BinaryHeap, VecDeque};

use super::Packet;
use super::random::{Correlated, Rng};
use crate::datapath::model::{Netem, NetemLoss};

/// Why netem dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetemDrop {
    Lost,
    QueueFull,
}

/// What became of one packet handed to netem.
#[derive(Debug)]
pub enum Enqueued<P> {
    /// Queued; `duplicate` is a copy to hand to the whole pipeline again (netem re-enqueues it at the root).
    Queued {
        duplicate: Option<P>,
    },
    Dropped(NetemDrop),
}

/// A delayed packet, ordered by departure time and then by arrival (equal times leave in arrival order).
struct Delayed<P> {
    time: u64,
    seq: u64,
    packet: P,
}

impl<P> PartialEq for Delayed<P> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<P> Eq for Delayed<P> {}
impl<P> PartialOrd for Delayed<P> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<P> Ord for Delayed<P> {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest departure must come out first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

pub struct NetemStage<P> {
    params: Netem,
    rng: Rng,
    delay_cor: Correlated,
    loss_cor: Correlated,
    duplicate_cor: Correlated,
    reorder_cor: Correlated,
    corrupt_cor: Correlated,
    /// Gilbert–Elliott: in the bad state.
    bad: bool,
    /// Packets delayed since the last reordered one (`q->counter`).
    counter: u32,
    /// Reordered packets: they leave first, at once, the latest first (`__qdisc_enqueue_head`).
    head: VecDeque<P>,
    line: BinaryHeap<Delayed<P>>,
    seq: u64,
}

impl<P: Packet> NetemStage<P> {
    pub fn new(params: Netem, seed: u64) -> Self {
        let loss_rho = match params.loss {
            NetemLoss::Random { correlation, .. } => correlation,
            _ => 0,
        };
        NetemStage {
            rng: Rng::new(seed),
            delay_cor: Correlated::new(params.delay_correlation),
            loss_cor: Correlated::new(loss_rho),
            duplicate_cor: Correlated::new(params.duplicate_correlation),
            reorder_cor: Correlated::new(params.reorder_correlation),
            corrupt_cor: Correlated::new(params.corrupt_correlation),
            bad: false,
            counter: 0,
            head: VecDeque::new(),
            line: BinaryHeap::new(),
            seq: 0,
            params,
        }
    }

    /// Packets held (netem's `qlen`).
    pub fn len(&self) -> usize {
        self.head.len() + self.line.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes over what `old` holds, as `tc qdisc change` keeps a netem's queue: each delayed packet keeps its
    /// departure time and the reordered ones stay at the head, ahead of this stage's own; what arrives from now
    /// on follows this stage's parameters. Equal departure times still leave in arrival order, `old`'s first.
    /// `old` is left empty.
    pub fn absorb(&mut self, old: &mut NetemStage<P>) {
        let mut head = std::mem::take(&mut old.head);
        head.append(&mut self.head);
        self.head = head;
        // `into_sorted_vec` follows the reversed order, the last departure first: each is walked backwards
        let (theirs, ours) = (std::mem::take(&mut old.line), std::mem::take(&mut self.line));
        let ordered = theirs.into_sorted_vec().into_iter().rev().chain(ours.into_sorted_vec().into_iter().rev());
        for d in ordered {
            self.seq += 1;
            self.line.push(Delayed { time: d.time, seq: self.seq, packet: d.packet });
        }
    }

    /// `netem_enqueue`: duplicate, lose, corrupt, check the limit, then reorder or delay. `may_duplicate` is false
    /// for a duplicate coming back through the pipeline (the kernel zeroes the probability while it does that).
    pub fn enqueue(&mut self, mut packet: P, now: u64, may_duplicate: bool) -> Enqueued<P> {
        let mut count = 1;
        if may_duplicate && self.duplicate_cor.event(self.params.duplicate, &mut self.rng) {
            count += 1;
        }
        if self.loss_event() {
            count -= 1;
        }
        if count == 0 {
            return Enqueued::Dropped(NetemDrop::Lost);
        }
        // The copy is taken before corruption: the kernel's clone shares the data, and corrupting unshares it.
        let duplicate = (count > 1).then(|| packet.clone());
        if self.corrupt_cor.event(self.params.corrupt, &mut self.rng) && packet.len() > 0 {
            let byte = self.rng.below(packet.len() as u64) as usize;
            let bit = self.rng.below(8) as u8;
            packet.flip_bit(byte, bit);
        }
        if self.len() >= self.params.limit_packets as usize {
            return Enqueued::Dropped(NetemDrop::QueueFull);
        }
        let gap = self.params.gap;
        if gap == 0 || self.counter < gap - 1 || self.params.reorder < self.reorder_cor.next(&mut self.rng) {
            let delay = self.tabledist();
            let time = now.saturating_add_signed(delay.max(0));
            self.counter += 1;
            self.seq += 1;
            self.line.push(Delayed { time, seq: self.seq, packet });
        } else {
            self.counter = 0;
            self.head.push_front(packet);
        }
        Enqueued::Queued { duplicate }
    }

    /// The next packet that may leave at `now`, without taking it.
    pub fn peek(&self, now: u64) -> Option<&P> {
        if let Some(p) = self.head.front() {
            return Some(p);
        }
        self.line.peek().filter(|d| d.time <= now).map(|d| &d.packet)
    }

    /// Takes the packet [`NetemStage::peek`] shows.
    pub fn dequeue(&mut self, now: u64) -> Option<P> {
        if let Some(p) = self.head.pop_front() {
            return Some(p);
        }
        if self.line.peek()?.time <= now {
            return self.line.pop().map(|d| d.packet);
        }
        None
    }

    /// When the next delayed packet is due (`None` when empty; any time in the past when one is ready).
    pub fn next_due(&self) -> Option<u64> {
        if !self.head.is_empty() {
            return Some(0);
        }
        self.line.peek().map(|d| d.time)
    }

    /// `loss_event`: the independent model with its correlation, or Gilbert–Elliott, deciding the loss in the
    /// state the packet arrived in, after the transition draw (as the kernel does).
    fn loss_event(&mut self) -> bool {
        match self.params.loss {
            NetemLoss::None => false,
            NetemLoss::Random { probability, .. } => self.loss_cor.event(probability, &mut self.rng),
            NetemLoss::GilbertElliott { p, r, h, k1 } => {
                if !self.bad {
                    if self.rng.next_u32() < p {
                        self.bad = true;
                    }
                    self.rng.next_u32() < k1
                } else {
                    if self.rng.next_u32() < r {
                        self.bad = false;
                    }
                    self.rng.next_u32() > h
                }
            }
        }
    }

    /// `tabledist` without a table: uniform in `latency ± jitter`, correlated by `delay_correlation`.
    fn tabledist(&mut self) -> i64 {
        let (mu, sigma) = (self.params.latency_ns, self.params.jitter_ns);
        if sigma <= 0 {
            return mu;
        }
        let rnd = u128::from(self.delay_cor.next(&mut self.rng));
        let offset = ((rnd * (2 * sigma as u128)) >> 32) as i64;
        mu + offset - sigma
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn netem(f: impl FnOnce(&mut Netem)) -> NetemStage<Vec<u8>> {
        let mut n = Netem { limit_packets: 1000, ..Default::default() };
        f(&mut n);
        NetemStage::new(n, 42)
    }

    fn pct(p: f64) -> u32 {
        (p / 100.0 * f64::from(u32::MAX)) as u32
    }

    #[test]
    fn a_packet_waits_its_latency_and_equal_times_keep_their_order() {
        let mut n = netem(|n| n.latency_ns = 20 * MS);
        for i in 0..3u8 {
            assert!(matches!(n.enqueue(vec![i], 0, true), Enqueued::Queued { duplicate: None }));
        }
        assert_eq!(n.next_due(), Some(20 * MS as u64));
        assert!(n.peek(20 * MS as u64 - 1).is_none() && n.dequeue(20 * MS as u64 - 1).is_none());
        let out: Vec<Vec<u8>> = std::iter::from_fn(|| n.dequeue(20 * MS as u64)).collect();
        assert_eq!(out, [vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn jitter_stays_within_its_range_and_covers_it() {
        let mut n = netem(|n| {
            n.latency_ns = 50 * MS;
            n.jitter_ns = 10 * MS;
            n.limit_packets = 100_000;
        });
        for _ in 0..20_000 {
            n.enqueue(vec![0], 0, true);
        }
        let times: Vec<u64> = n.line.iter().map(|d| d.time).collect();
        let (lo, hi) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
        assert!(lo >= 40 * MS as u64 && hi < 60 * MS as u64, "{lo}..{hi}");
        assert!(lo < 40 * MS as u64 + MS as u64 / 10 && hi > 60 * MS as u64 - MS as u64 / 10, "{lo}..{hi}");
    }

    #[test]
    fn jitter_at_the_widest_the_api_allows_spreads_over_its_range() {
        let mut n = netem(|n| {
            n.latency_ns = 3_000 * MS;
            n.jitter_ns = i64::from(i32::MAX);
        });
        for _ in 0..1000 {
            n.enqueue(vec![0], 0, true);
        }
        let (lo, hi) = (n.line.iter().map(|d| d.time).min().unwrap(), n.line.iter().map(|d| d.time).max().unwrap());
        assert!(lo < 900 * MS as u64 && hi > 5_100 * MS as u64, "{lo}..{hi}");
    }

    #[test]
    fn losses_follow_the_models() {
        let lost = |n: &mut NetemStage<Vec<u8>>| {
            let total = 100_000;
            let lost = (0..total).filter(|_| matches!(n.enqueue(vec![0], 0, true), Enqueued::Dropped(_))).count();
            n.line.clear();
            lost as f64 / f64::from(total)
        };
        let mut random = netem(|n| {
            n.loss = NetemLoss::Random { probability: pct(10.0), correlation: 0 };
            n.limit_packets = u32::MAX;
        });
        assert!((lost(&mut random) - 0.10).abs() < 0.005);
        // Stationary loss of Gilbert–Elliott: π_bad · loss_in_bad + π_good · loss_in_good, π_bad = p / (p + r).
        let (p, r, loss_bad, loss_good) = (0.05, 0.25, 0.7, 0.01);
        let mut ge = netem(|n| {
            n.loss = NetemLoss::GilbertElliott {
                p: pct(p * 100.0),
                r: pct(r * 100.0),
                h: pct((1.0 - loss_bad) * 100.0),
                k1: pct(loss_good * 100.0),
            };
            n.limit_packets = u32::MAX;
        });
        let expected = p / (p + r) * loss_bad + r / (p + r) * loss_good;
        assert!((lost(&mut ge) - expected).abs() < 0.01, "expected {expected}");
    }

    #[test]
    fn duplicates_are_uncorrupted_copies_and_corruption_flips_one_bit() {
        let mut n = netem(|n| {
            n.duplicate = u32::MAX;
            n.corrupt = u32::MAX;
        });
        let original = vec![0u8; 64];
        let Enqueued::Queued { duplicate: Some(copy) } = n.enqueue(original.clone(), 0, true) else { panic!() };
        assert_eq!(copy, original, "the copy is taken before corruption");
        let queued = n.dequeue(0).unwrap();
        let flipped: u32 = queued.iter().zip(&original).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(flipped, 1);
        assert!(matches!(n.enqueue(original, 0, false), Enqueued::Queued { duplicate: None }), "a dup is not duped");
    }

    #[test]
    fn the_limit_counts_every_held_packet() {
        let mut n = netem(|n| {
            n.latency_ns = MS;
            n.limit_packets = 2;
        });
        n.enqueue(vec![0], 0, true);
        n.enqueue(vec![1], 0, true);
        assert!(matches!(n.enqueue(vec![2], 0, true), Enqueued::Dropped(NetemDrop::QueueFull)));
        assert_eq!(n.len(), 2);
    }

    #[test]
    fn reordering_sends_every_gapth_packet_at_once() {
        let mut n = netem(|n| {
            n.latency_ns = 10 * MS;
            n.reorder = u32::MAX;
            n.gap = 3;
        });
        for i in 0..7u8 {
            n.enqueue(vec![i], 0, true);
        }
        // Packets 2 and 5 (each third) jump the queue, the later first; the others wait their latency in order.
        let now: Vec<u8> = std::iter::from_fn(|| n.dequeue(0)).map(|p| p[0]).collect();
        assert_eq!(now, [5, 2]);
        let later: Vec<u8> = std::iter::from_fn(|| n.dequeue(10 * MS as u64)).map(|p| p[0]).collect();
        assert_eq!(later, [0, 1, 3, 4, 6]);
    }
}
