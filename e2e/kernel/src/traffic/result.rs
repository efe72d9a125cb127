//! What a stream's receiver saw, and the figures read from it: delay, loss and its bursts, duplication,
//! corruption, order, goodput. Pure: no sockets, no clock.

use std::time::Duration;

use anyhow::Context;
use isthmus_test_kit::bursts;

use crate::stats::Summary;

#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub seq: u32,
    pub sent_ns: u64,
    pub received_ns: u64,
}

impl Arrival {
    pub fn delay_ms(&self) -> f64 {
        (self.received_ns as f64 - self.sent_ns as f64) / 1e6
    }
}

#[derive(Debug, Default)]
pub struct StreamResult {
    pub sent: u32,
    pub payload: usize,
    /// Intact datagrams in arrival order (duplicates included).
    pub arrivals: Vec<Arrival>,
    pub corrupted: u32,
    pub send_errors: u32,
    /// Datagrams the receiving socket's kernel queue dropped (`SK_MEMINFO_DROPS`): lost at the receiver, not on
    /// the link.
    pub receiver_drops: u32,
    /// From the first send to the last: a guest starved of CPU sends slower than asked.
    pub send_elapsed: Duration,
}

impl StreamResult {
    pub fn delays_ms(&self) -> Vec<f64> {
        self.first_arrivals().iter().map(Arrival::delay_ms).collect()
    }

    pub fn delay(&self) -> anyhow::Result<Summary> {
        Summary::of(&self.delays_ms()).context("no packet arrived")
    }

    /// The first intact copy of every sequence number that arrived.
    pub fn first_arrivals(&self) -> Vec<Arrival> {
        let mut seen = vec![false; self.sent as usize];
        self.arrivals
            .iter()
            .filter(|a| {
                let s = &mut seen[a.seq as usize];
                !std::mem::replace(s, true)
            })
            .copied()
            .collect()
    }

    pub fn unique_received(&self) -> usize {
        self.first_arrivals().len()
    }

    pub fn lost(&self) -> usize {
        self.sent as usize - self.unique_received()
    }

    pub fn loss_ratio(&self) -> f64 {
        self.lost() as f64 / f64::from(self.sent.max(1))
    }

    pub fn duplicates(&self) -> usize {
        self.arrivals.len() - self.unique_received()
    }

    pub fn duplicate_ratio(&self) -> f64 {
        self.duplicates() as f64 / f64::from(self.sent.max(1))
    }

    pub fn corrupt_ratio(&self) -> f64 {
        f64::from(self.corrupted) / f64::from(self.sent.max(1))
    }

    /// Arrivals that came after a packet sent later than them.
    pub fn out_of_order(&self) -> usize {
        let mut highest = None;
        let mut late = 0;
        for a in self.first_arrivals() {
            match highest {
                Some(h) if a.seq < h => late += 1,
                _ => highest = Some(a.seq),
            }
        }
        late
    }

    /// Lengths of the runs of consecutive lost sequence numbers.
    pub fn loss_bursts(&self) -> Vec<usize> {
        let mut got = vec![false; self.sent as usize];
        for a in &self.arrivals {
            got[a.seq as usize] = true;
        }
        bursts::runs(got)
    }

    /// Payload bits per second the sender managed to offer.
    pub fn offered_bps(&self) -> f64 {
        (u64::from(self.sent) * self.payload as u64 * 8) as f64 / self.send_elapsed.as_secs_f64().max(1e-9)
    }

    /// Payload bits per second at the receiver, over the arrivals after `skip` of the stream (to leave out a
    /// token bucket's initial burst).
    pub fn goodput_bps(&self, skip: Duration) -> Option<f64> {
        let first = self.arrivals.first()?.received_ns + skip.as_nanos() as u64;
        let window: Vec<&Arrival> = self.arrivals.iter().filter(|a| a.received_ns >= first).collect();
        if window.len() < 10 {
            return None;
        }
        let span = (window.last()?.received_ns - window[0].received_ns) as f64 / 1e9;
        Some(((window.len() - 1) * self.payload * 8) as f64 / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(seq: u32, delay_ms: u64) -> Arrival {
        Arrival {
            seq,
            sent_ns: u64::from(seq) * 1_000_000,
            received_ns: u64::from(seq) * 1_000_000 + delay_ms * 1_000_000,
        }
    }

    fn result(sent: u32, seqs: &[u32]) -> StreamResult {
        StreamResult {
            sent,
            payload: 100,
            arrivals: seqs.iter().map(|s| arrival(*s, 5)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn loss_duplicates_and_order_from_sequence_numbers() {
        // 10 sent; 3, 4 and 8 lost; 5 duplicated; 7 arrives before 6
        let r = result(10, &[0, 1, 2, 5, 5, 7, 6, 9]);
        assert_eq!(r.unique_received(), 7);
        assert_eq!(r.lost(), 3);
        assert_eq!(r.duplicates(), 1);
        assert_eq!(r.out_of_order(), 1);
        assert_eq!(r.loss_bursts(), vec![2, 1]);
        assert!((r.loss_ratio() - 0.3).abs() < 1e-9);
        assert!((r.duplicate_ratio() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn delays_count_each_sequence_number_once() {
        let mut r = result(3, &[0, 1, 2]);
        r.arrivals.push(arrival(1, 50));
        assert_eq!(r.delays_ms(), vec![5.0, 5.0, 5.0]);
    }

    #[test]
    fn goodput_skips_the_start_and_counts_payload_bits() {
        // 1000-byte payloads every ms for 100 ms: 8 Mbit/s
        let arrivals = (0..100u32).map(|s| arrival(s, 1)).collect();
        let r = StreamResult { sent: 100, payload: 1000, arrivals, ..Default::default() };
        let bps = r.goodput_bps(Duration::from_millis(20)).unwrap();
        assert!((bps - 8e6).abs() < 1.0, "{bps}");
    }
}
