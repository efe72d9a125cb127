//! Every tolerance of the scenarios, each derived from what it tolerates: the unimpaired path's spread measured
//! in the same run, a statistic's sampling error, or a kernel timer's wake-up, and printed beside the figure.

use isthmus_e2e::{RttReport, RttRun, TestNamespace};

/// netem releases a delayed packet from a timer, which on an emulated node wakes late: the stock-kernel rig's
/// QEMU runs read 20 ms as a median of 20.4–20.7 ms (e2e/kernel/README.md). Allowed per delayed direction.
pub const TIMER_SLACK_MS: f64 = 2.0;
/// netem never delivers a delayed packet early; the lower bounds allow this much clock granularity.
pub const EARLY_MS: f64 = 0.5;
/// Standard errors a statistic may stray from its expectation: 4.5 leaves a false failure about once in 150,000.
pub const SIGMAS: f64 = 4.5;

/// The unimpaired round trip between two pods, measured just before a scenario impairs it.
#[derive(Clone, Copy, Debug)]
pub struct Baseline {
    pub p10: f64,
    pub p90: f64,
    pub loss: f64,
}

impl Baseline {
    pub fn measure(ns: &TestNamespace, from: &str, to_ip: &str) -> Baseline {
        Self::of(&ns.rtt_run(from, to_ip, RttRun::new(300).interval_ms(5)))
    }

    pub fn of(r: &RttReport) -> Baseline {
        let b = Baseline { p10: r.ms("p10"), p90: r.ms("p90"), loss: r.loss_ratio() };
        println!("baseline: {}", r.describe());
        b
    }

    /// The baseline of a scenario that measures an effect of `effect_ms`, taken again (up to three times, 5 s apart)
    /// while the unimpaired path's own spread (p10..p90) exceeds half the effect: a band that wide could not tell
    /// the effect from its absence. A noisy moment passes; a machine busy throughout fails here, saying so, instead
    /// of passing on a band that proves nothing.
    pub fn measure_quiet(ns: &TestNamespace, from: &str, to_ip: &str, effect_ms: f64) -> Baseline {
        Self::quiet_for(effect_ms, || Self::measure(ns, from, to_ip))
    }

    /// [`Self::measure_quiet`] for a baseline taken another way (e.g. under load).
    pub fn quiet_for(effect_ms: f64, mut measure: impl FnMut() -> Baseline) -> Baseline {
        for attempt in 1..=3 {
            let b = measure();
            if b.p90 - b.p10 <= effect_ms / 2.0 || attempt == 3 {
                b.assert_quiet_for(effect_ms);
                return b;
            }
            println!("baseline attempt {attempt}: too noisy for {effect_ms} ms; measuring again in 5 s");
            std::thread::sleep(std::time::Duration::from_secs(5));
        }
        unreachable!("the third attempt returns or fails")
    }

    /// Fails when the unimpaired path's own spread (p10..p90) exceeds half the effect a scenario measures.
    pub fn assert_quiet_for(&self, effect_ms: f64) {
        let spread = self.p90 - self.p10;
        assert!(
            spread <= effect_ms / 2.0,
            "the unimpaired round trip spreads {spread:.1} ms (p10 {:.2}, p90 {:.2}): too noisy to measure {effect_ms} ms; \
             was the machine busy with other work?",
            self.p10,
            self.p90
        );
    }

    /// The band the low end (p10) of a round trip falls in when `added_ms` is added on `delayed_hops`
    /// timer-released hops: the baseline's p10 shifted by the delay (its floor) up to its p90 shifted (its noise)
    /// plus the timers' slack. The low quantile is the one a busy machine cannot move: load only ever lengthens
    /// round trips, and it would have to lengthen nine in ten to raise it.
    pub fn shifted_band(&self, added_ms: f64, delayed_hops: u32) -> (f64, f64) {
        (self.p10 + added_ms - EARLY_MS, self.p90 + added_ms + TIMER_SLACK_MS * f64::from(delayed_hops))
    }
}

/// Asserts `lo <= measured <= hi`, saying what the band is made of.
pub fn within(what: &str, measured: f64, (lo, hi): (f64, f64), why: &str) {
    println!("{what}: {measured:.3} in [{lo:.3}, {hi:.3}]  ({why})");
    assert!(lo <= measured && measured <= hi, "{what}: {measured:.3} outside [{lo:.3}, {hi:.3}] ({why})");
}

/// The band of an observed proportion around `p` over `n` independent trials, widened by `variance_factor`
/// for correlated trials (1 for independent ones).
pub fn proportion_band(p: f64, n: f64, variance_factor: f64) -> (f64, f64) {
    let sigma = (p * (1.0 - p) * variance_factor / n).sqrt();
    (p - SIGMAS * sigma, p + SIGMAS * sigma)
}
