//! TBF's token bucket, replicated from `net/sched/sch_tbf.c` for the parameters isthmus gives it (the same
//! [`Tbf`] model the kernel gets): tokens are nanoseconds of transmit time at the rate, the bucket holds
//! `buffer` of them, and a packet leaves when the tokens cover its transmit time. Pure.

use crate::datapath::model::Tbf;
use crate::datapath::psched::{NSEC_PER_TICK, tbf_burst_for_ticks, transmit_ns};

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_bytes_per_sec: u64,
    /// The bucket, in nanoseconds of transmit time.
    buffer_ns: i64,
    /// The largest packet that can ever leave (the burst): larger ones are dropped at enqueue.
    max_size: u32,
    tokens_ns: i64,
    /// When tokens were last taken (`q->t_c`).
    checked: u64,
}

impl TokenBucket {
    /// A full bucket at `now`, as the kernel starts one. The codec sends the burst (`TCA_TBF_BURST`) that maps
    /// to the model's ticks; the kernel keeps it as the largest packet and makes the bucket exactly its transmit
    /// time (not the ticks, which are rounded down), so a packet of the burst's size always fits.
    pub fn new(tbf: &Tbf, now: u64) -> Self {
        let rate = tbf.rate_bytes_per_sec;
        let max_size = tbf_burst_for_ticks(rate, tbf.buffer_ticks)
            .unwrap_or_else(|| (u64::from(tbf.buffer_ticks) * NSEC_PER_TICK * rate / 1_000_000_000) as u32);
        let buffer_ns = transmit_ns(rate, max_size).min(i64::MAX as u64) as i64;
        TokenBucket {
            rate_bytes_per_sec: tbf.rate_bytes_per_sec,
            buffer_ns,
            max_size,
            tokens_ns: buffer_ns,
            checked: now,
        }
    }

    /// Whether a packet of `len` bytes can ever leave (TBF drops it at enqueue otherwise).
    pub fn admits(&self, len: usize) -> bool {
        len <= self.max_size as usize
    }

    /// The tokens a packet of `len` bytes would leave at `now`: not negative when it may leave.
    fn tokens_after(&self, len: usize, now: u64) -> i64 {
        let elapsed = now.saturating_sub(self.checked).min(self.buffer_ns as u64) as i64;
        let tokens = (elapsed + self.tokens_ns).min(self.buffer_ns);
        let cost = transmit_ns(self.rate_bytes_per_sec, len.min(u32::MAX as usize) as u32);
        tokens - cost.min(i64::MAX as u64) as i64
    }

    /// Takes the tokens for a packet of `len` bytes at `now`, or says when they will be there.
    pub fn take(&mut self, len: usize, now: u64) -> Result<(), u64> {
        let after = self.tokens_after(len, now);
        if after >= 0 {
            self.tokens_ns = after;
            self.checked = now;
            Ok(())
        } else {
            Err(now.saturating_add(after.unsigned_abs()))
        }
    }

    /// When a packet of `len` bytes could leave, at the earliest `now`.
    pub fn ready_at(&self, len: usize, now: u64) -> u64 {
        let after = self.tokens_after(len, now);
        if after >= 0 { now } else { now.saturating_add(after.unsigned_abs()) }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::datapath::units::tbf_buffer_ticks;

    const SEC: u64 = 1_000_000_000;

    fn bucket(rate_bytes_per_sec: u64, burst: u64) -> TokenBucket {
        let tbf = Tbf {
            rate_bytes_per_sec,
            buffer_ticks: tbf_buffer_ticks(rate_bytes_per_sec, burst) as u32,
            limit_bytes: 0,
            peak: None,
        };
        TokenBucket::new(&tbf, 0)
    }

    #[test]
    fn a_full_bucket_sends_its_burst_then_paces_at_the_rate() {
        let mut b = bucket(125_000, 15_140); // 1 Mbit/s, ten full frames
        let mut now = 0;
        let sent = (0..10).filter(|_| b.take(1514, now).is_ok()).count();
        assert_eq!(sent, 10, "the burst leaves at once");
        let wait = b.take(1514, now).unwrap_err();
        assert!((12_000_000..=12_200_000).contains(&wait), "one frame's time at 1 Mbit/s: {wait}");
        now = wait;
        assert!(b.take(1514, now).is_ok());
        assert_eq!(b.ready_at(1514, now), now + transmit_ns(125_000, 1514));
    }

    #[test]
    fn packets_larger_than_the_burst_are_never_admitted() {
        let b = bucket(125_000, 3000);
        assert!(b.admits(1514) && !b.admits(9000));
    }

    proptest! {
        /// Over any stretch of time, what leaves is at most the burst plus the rate times the stretch.
        #[test]
        fn output_never_exceeds_burst_plus_rate(
            rate in 1_000u64..1_000_000_000,
            burst_frames in 1u64..50,
            sizes in prop::collection::vec(64usize..=1514, 1..300),
            start in 0u64..SEC,
        ) {
            let burst = burst_frames * 1514;
            let mut b = bucket(rate, burst);
            let mut now = start;
            let mut sent: Vec<(u64, usize)> = Vec::new();
            for len in sizes {
                now = match b.take(len, now) {
                    Ok(()) => now,
                    Err(at) => {
                        prop_assert!(at > now);
                        prop_assert!(b.take(len, at).is_ok(), "ready when it said");
                        at
                    }
                };
                sent.push((now, len));
            }
            let first = sent[0].0;
            let mut bytes = 0u64;
            for (t, len) in &sent {
                bytes += *len as u64;
                let allowed = burst + 1514 + (u128::from(t - first) * u128::from(rate) / u128::from(SEC)) as u64;
                prop_assert!(bytes <= allowed, "{bytes} bytes by {t} > {allowed}");
            }
        }
    }
}
