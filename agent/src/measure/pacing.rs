//! When the node sends which probe. Pure.
//!
//! - A ceiling, not a target: the gap between two sends is `1/rate` stretched by a jitter of ±25 % around
//!   `4/3 · 1/rate`, so no two sends are ever closer than `1/rate` (the node never exceeds `rate` probes/s) and
//!   on average it sends `0.75 · rate`. The jitter keeps the probes of many nodes from falling into step.
//! - One send in [`BASELINE_EVERY`] is a baseline probe: the same destinations, from the node's own network
//!   namespace, the path without the pod's impairment. The others go round the sampled pairs in turn.
//! - Probe timeouts come from the configured impairment: see [`timeout`].

use std::time::Duration;

use isthmus_agent_api::{Impairment, Loss};

use isthmus_datapaths::emulator::random::Rng;

use crate::probe_path::ProbePath;

/// One send in this many is a baseline probe.
pub const BASELINE_EVERY: u64 = 4;

/// The shortest timeout: an unimpaired round trip inside a cluster takes well under a millisecond, but a busy
/// node or a rate-limited queue can hold a probe for hundreds.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest: beyond it a probe is lost, whatever the link's latency.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);

/// The next send: which pair (index into the sampled pairs), along which path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub pair: usize,
    pub path: ProbePath,
}

#[derive(Debug, Clone)]
pub struct Pacer {
    pairs: usize,
    nominal_gap: Duration,
    sends: u64,
    next_impaired: usize,
    next_baseline: usize,
    rng: Rng,
}

impl Pacer {
    /// Sends over `pairs` sampled pairs at most `rate` probes per second (`rate` > 0); `seed` makes the
    /// jitter repeatable.
    pub fn new(pairs: usize, rate: f64, seed: u64) -> Self {
        let rate = if rate.is_finite() && rate > 0.0 { rate } else { 1.0 };
        Pacer {
            pairs,
            nominal_gap: Duration::from_secs_f64(4.0 / (3.0 * rate)),
            sends: 0,
            next_impaired: 0,
            next_baseline: 0,
            rng: Rng::new(seed),
        }
    }

    /// The next send and the gap to wait after it; `None` when there is nothing to probe.
    pub fn next_send(&mut self) -> Option<(Slot, Duration)> {
        if self.pairs == 0 {
            return None;
        }
        self.sends += 1;
        let slot = if self.sends.is_multiple_of(BASELINE_EVERY) {
            let pair = self.next_baseline;
            self.next_baseline = (pair + 1) % self.pairs;
            Slot { pair, path: ProbePath::Baseline }
        } else {
            let pair = self.next_impaired;
            self.next_impaired = (pair + 1) % self.pairs;
            Slot { pair, path: ProbePath::Impaired }
        };
        // Uniform in [0.75, 1.25] · nominal.
        let factor = 0.75 + 0.5 * (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        Some((slot, self.nominal_gap.mul_f64(factor)))
    }
}

/// How long to wait for the answer to a probe through `impairment`: 1 s plus four times the one-way latency
/// it adds (latency plus jitter, which bounds netem's delay distribution), at most 10 s. The reverse direction's
/// impairment (on the destination's node) is not known here; four times the forward one covers a symmetric
/// link with room to spare, and a link that is much slower backwards reads as loss, which the operator reports.
pub fn timeout(impairment: &Impairment) -> Duration {
    (MIN_TIMEOUT + one_way(impairment).saturating_mul(4)).min(MAX_TIMEOUT)
}

/// The longest one-way delay `impairment` adds: latency plus jitter.
pub fn one_way(impairment: &Impairment) -> Duration {
    let fields = impairment.fields();
    fields.latency.unwrap_or_default() + fields.jitter.unwrap_or_default()
}

/// Whether the link drops every packet: its probes are never answered, which is what it was asked for, so it
/// reports loss alone and never falls back to another probe kind.
pub fn drops_everything(impairment: &Impairment) -> bool {
    match impairment.fields().loss {
        Some(Loss::Random(c)) => c.percent.value() >= 100.0,
        Some(Loss::GilbertElliott { loss_in_bad, loss_in_good, .. }) => {
            loss_in_bad.value() >= 100.0 && loss_in_good.value() >= 100.0
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::test_util::impairment;
    use isthmus_agent_api::{Correlated, ImpairmentFields, Percent};
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn timeouts_grow_with_the_latency_and_stop_at_the_cap() {
        let with = |latency: u64, jitter: u64| {
            impairment(ImpairmentFields {
                latency: Some(Duration::from_millis(latency)),
                jitter: (jitter > 0).then(|| Duration::from_millis(jitter)),
                ..Default::default()
            })
        };
        assert_eq!(timeout(&with(0, 0)), Duration::from_secs(1));
        assert_eq!(timeout(&with(100, 25)), Duration::from_millis(1500));
        assert_eq!(timeout(&with(5_000, 0)), MAX_TIMEOUT);
    }

    #[test]
    fn only_a_link_that_drops_everything_is_left_without_fallback() {
        let loss = |percent: f64| {
            impairment(ImpairmentFields {
                loss: Some(Loss::Random(Correlated {
                    percent: Percent::new("p", percent).unwrap(),
                    ..Default::default()
                })),
                ..Default::default()
            })
        };
        assert!(drops_everything(&loss(100.0)));
        assert!(!drops_everything(&loss(99.9)));
        assert!(!drops_everything(&impairment(ImpairmentFields { rate_bps: Some(8_000), ..Default::default() })));
        let ge = |bad: f64, good: f64| {
            impairment(ImpairmentFields {
                loss: Some(Loss::GilbertElliott {
                    p: Percent::new("p", 10.0).unwrap(),
                    r: Percent::new("r", 10.0).unwrap(),
                    loss_in_bad: Percent::new("b", bad).unwrap(),
                    loss_in_good: Percent::new("g", good).unwrap(),
                }),
                ..Default::default()
            })
        };
        assert!(drops_everything(&ge(100.0, 100.0)));
        assert!(!drops_everything(&ge(100.0, 0.0)));
    }

    #[test]
    fn an_empty_pacer_sends_nothing() {
        assert_eq!(Pacer::new(0, 10.0, 1).next_send(), None);
    }

    proptest! {
        #[test]
        fn the_rate_is_a_ceiling_a_quarter_is_baseline_and_every_pair_gets_its_turn(
            pairs in 1usize..50, rate in 0.5f64..500.0, seed in any::<u64>(),
        ) {
            let mut pacer = Pacer::new(pairs, rate, seed);
            let sends = 4 * pairs * 8;
            let mut impaired = vec![0usize; pairs];
            let mut baseline = vec![0usize; pairs];
            let mut total = Duration::ZERO;
            let floor = Duration::from_secs_f64(1.0 / rate);
            for _ in 0..sends {
                let (slot, gap) = pacer.next_send().unwrap();
                // Never two sends closer than 1/rate (a nanosecond of float rounding aside).
                prop_assert!(gap + Duration::from_nanos(1) >= floor, "gap {:?} under {:?}", gap, floor);
                prop_assert!(gap <= floor.mul_f64(5.0 / 3.0) + Duration::from_nanos(1));
                total += gap;
                match slot.path {
                    ProbePath::Impaired => impaired[slot.pair] += 1,
                    ProbePath::Baseline => baseline[slot.pair] += 1,
                }
            }
            prop_assert_eq!(baseline.iter().sum::<usize>(), sends / 4);
            // Round robin: every pair equally often on each path.
            prop_assert!(impaired.iter().all(|n| *n == impaired[0]), "{:?}", impaired);
            prop_assert!(baseline.iter().all(|n| *n == baseline[0]), "{:?}", baseline);
            // The mean rate is within the jitter's spread of 0.75 · rate.
            let mean_rate = sends as f64 / total.as_secs_f64();
            prop_assert!(mean_rate <= rate && mean_rate >= 0.6 * rate, "mean {} of {}", mean_rate, rate);
        }

        #[test]
        fn the_same_seed_gives_the_same_sends(pairs in 1usize..20, seed in any::<u64>()) {
            let mut a = Pacer::new(pairs, 10.0, seed);
            let mut b = Pacer::new(pairs, 10.0, seed);
            for _ in 0..50 {
                prop_assert_eq!(a.next_send(), b.next_send());
            }
        }
    }
}
