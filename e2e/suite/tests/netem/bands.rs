//! Every bound of the scenarios, each derived from what it tolerates: the unimpaired path measured in the same
//! run, a statistic's sampling error, or a kernel timer's wake-up, and printed beside the figure.
//!
//! Gates use what netem guarantees: a delayed packet is never released early, and load only lengthens a round
//! trip, so an impaired round trip takes at least the delay whatever the machine is doing. Not the baseline's
//! fastest round trip plus the delay: that minimum bounds the path's floor from above, not from below — a loaded
//! baseline read 3.7 ms where the same path later answered in under 3.6 ms, and a gate built on it failed a link
//! that was in force (stop 37's CI, `edit_and_delete`). Reports use the whole of the baseline's spread (p10..p90),
//! which a busy machine moves.

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
        Self::of(&Self::quiet_run(ns, from, to_ip))
    }

    /// The first of up to three runs of 300 probes that lost none, else the least lossy. The path between two pods
    /// loses nothing of its own, so a baseline that lost probes was taken while the machine stalled a pod (stop
    /// 40's CI, vm provider: 15 % lost, round trips p50 647 ms against 6 ms in the windows around it), and its loss
    /// added to a link's would expect from the link what the stall did.
    pub fn quiet_run(ns: &TestNamespace, from: &str, to_ip: &str) -> RttReport {
        const ATTEMPTS: usize = 3;
        let mut runs = Vec::with_capacity(ATTEMPTS);
        for _ in 0..ATTEMPTS {
            let r = ns.rtt_run(from, to_ip, RttRun::new(300).interval_ms(5));
            if r.count("lost") == 0 {
                return r;
            }
            println!("baseline discarded (the machine stalled a pod): {}", r.describe());
            runs.push(r);
        }
        runs.into_iter().min_by_key(|r| r.count("lost")).expect("a run")
    }

    pub fn of(r: &RttReport) -> Baseline {
        let b = Baseline { p10: r.ms("p10"), p90: r.ms("p90"), loss: r.loss_ratio() };
        println!("baseline: {}", r.describe());
        b
    }

    /// The band the low end (p10) of a round trip falls in when `added_ms` is added on `delayed_hops`
    /// timer-released hops on a quiet machine: the baseline's p10 shifted by the delay up to its p90 shifted plus
    /// the timers' slack. For reports: a busy machine moves the upper end.
    pub fn shifted_band(&self, added_ms: f64, delayed_hops: u32) -> (f64, f64) {
        (self.p10 + added_ms - EARLY_MS, self.p90 + added_ms + TIMER_SLACK_MS * f64::from(delayed_hops))
    }
}

/// The least any round trip can take with `added_ms` of netem delay on the way, less the clock's granularity.
/// A gate compares a low quantile (p10) with it: nine in ten round trips would have to be released early for a
/// link in force to fail it; a round trip under it was not delayed by `added_ms`.
pub fn delay_floor(added_ms: f64) -> f64 {
    added_ms - EARLY_MS
}

/// The band of an observed proportion around `p` over `n` independent trials, widened by `variance_factor`
/// for correlated trials (1 for independent ones).
pub fn proportion_band(p: f64, n: f64, variance_factor: f64) -> (f64, f64) {
    let sigma = (p * (1.0 - p) * variance_factor / n).sqrt();
    (p - SIGMAS * sigma, p + SIGMAS * sigma)
}
