//! What a link's configuration predicts for one probed round trip, and how far a measurement may stray from it
//! before it disagrees (docs/networklink.md#measured).
//!
//! A probe from a `from` pod takes the forward impairment out and, when the link has a reverse direction, the
//! reverse impairment back (a one-way link: whatever the plan applies on the way back, `Planner::way_back`);
//! probing the reverse direction swaps them. The prediction:
//! - RTT = baseline p50 + latency out + latency back + the probe's serialization at each direction's bandwidth;
//! - loss = 1 − (1 − out)(1 − back), where a direction's loss is its mean packet loss (Gilbert–Elliott: the
//!   stationary bad-state share p/(p+r) weighs the bad state's loss) combined with corruption (a corrupted probe
//!   or answer is dropped by the receiving kernel's checksum, so it counts as lost).

use std::time::Duration;

use isthmus_agent_api::measure::ProbeKind;
use isthmus_agent_api::{Impairment, Loss};

/// An ICMP echo on the wire, Ethernet header included: 14 + 20 (IPv4) + 8 (ICMP) + 56 (ping's payload).
pub const ICMP_ECHO_BYTES_V4: u32 = 98;
/// The same over IPv6 (40-byte header).
pub const ICMP_ECHO_BYTES_V6: u32 = 118;
/// A TCP SYN with the usual options (MSS, SACK, timestamps, window scale): 14 + 20 + 40.
pub const TCP_SYN_BYTES_V4: u32 = 74;
pub const TCP_SYN_BYTES_V6: u32 = 94;

/// The z of a two-sided 99 % interval, for the Wilson score interval of the loss.
pub const Z_99: f64 = 2.575_829_303_548_901;
/// How many standard errors of the median the measured RTT may be off (≈ 99.7 % two-sided for a normal
/// sampling distribution, which the median's is for the sample sizes a window collects).
pub const RTT_STANDARD_ERRORS: f64 = 3.0;
/// The tolerance's floor: scheduling and timer noise of the two probing paths and the histogram's 1 % buckets
/// make any two medians of one path differ by about this much.
pub const RTT_FLOOR: Duration = Duration::from_millis(1);
/// And, relative to the expected RTT, for the buckets' width and the kernel's timer slack at long delays.
pub const RTT_FLOOR_RELATIVE: f64 = 0.02;

/// The impairments a round trip crosses: out (the probed direction) and back (the other one, if in force).
#[derive(Debug, Clone, Copy)]
pub struct RoundTrip<'a> {
    pub out: &'a Impairment,
    pub back: Option<&'a Impairment>,
}

impl RoundTrip<'_> {
    /// The configured part of the RTT (no baseline): latencies plus the probe's serialization at each
    /// direction's bandwidth.
    pub fn added_rtt(&self, probe: ProbeKind, ipv6: bool) -> Duration {
        let bytes = probe_bytes(probe, ipv6);
        self.legs().map(|i| i.fields().latency.unwrap_or_default() + serialization(i, bytes)).sum()
    }

    /// The round trip's loss probability.
    pub fn expected_loss(&self) -> f64 {
        1.0 - self.legs().map(|i| 1.0 - direction_loss(i)).product::<f64>()
    }

    /// The widest configured jitter of the two directions (± this much, uniform).
    pub fn widest_jitter(&self) -> Duration {
        self.legs().map(|i| i.fields().jitter.unwrap_or_default()).max().unwrap_or_default()
    }

    fn legs(&self) -> impl Iterator<Item = &Impairment> {
        std::iter::once(self.out).chain(self.back)
    }
}

pub fn probe_bytes(probe: ProbeKind, ipv6: bool) -> u32 {
    match (probe, ipv6) {
        (ProbeKind::IcmpEcho, false) => ICMP_ECHO_BYTES_V4,
        (ProbeKind::IcmpEcho, true) => ICMP_ECHO_BYTES_V6,
        (ProbeKind::TcpSyn, false) => TCP_SYN_BYTES_V4,
        (ProbeKind::TcpSyn, true) => TCP_SYN_BYTES_V6,
    }
}

fn serialization(i: &Impairment, bytes: u32) -> Duration {
    match i.fields().rate_bps {
        Some(bps) if bps > 0 => Duration::from_secs_f64(f64::from(bytes) * 8.0 / bps as f64),
        _ => Duration::ZERO,
    }
}

/// One direction's mean loss, corruption included, as a probability.
pub fn direction_loss(i: &Impairment) -> f64 {
    let f = i.fields();
    let loss = match &f.loss {
        None => 0.0,
        Some(Loss::Random(c)) => c.percent.value() / 100.0,
        Some(Loss::GilbertElliott { p, r, loss_in_bad, loss_in_good }) => {
            let (p, r) = (p.value() / 100.0, r.value() / 100.0);
            // Stationary share of the bad state; a chain that never leaves its start (good) state has none.
            let bad = if p + r > 0.0 { p / (p + r) } else { 0.0 };
            bad * loss_in_bad.value() / 100.0 + (1.0 - bad) * loss_in_good.value() / 100.0
        }
    };
    let corrupt = f.corrupt.map_or(0.0, |c| c.percent.value() / 100.0);
    1.0 - (1.0 - loss) * (1.0 - corrupt)
}

/// The unimpaired path's own noise, from the baseline probes of the same window: how widely their round trips
/// spread (p90 − p10) and how many were answered.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PathNoise {
    pub spread: Duration,
    pub answered: u64,
}

/// p90 − p10 of a normal distribution in standard deviations (2 · 1.2816).
const P10_P90_SIGMAS: f64 = 2.563_103;
/// The standard error of a median of n normal samples is this many σ/√n (√(π/2)).
const MEDIAN_SE_FACTOR: f64 = 1.253_314;

/// How far the measured median RTT may be from the expected one, as the sum of
/// - the floor;
/// - `3 · J / √n` for the configured jitter: with uniform ±J per direction the round trip's density at its median
///   is 1/(2·J_max), so the median of n answered probes has a standard error of J_max/√n;
/// - `3 · 1.2533 · σ · √(1/n + 1/m)` for the path's own noise, which moves both medians the expected RTT is made
///   of (the impaired one over n probes and the baseline's over m): σ from the baseline's p90 − p10 (÷ 2.563, as
///   for a normal spread). On a quiet node it is microseconds; on a busy or emulated one it keeps scheduling noise
///   from reading as a misconfigured link.
pub fn rtt_tolerance(jitter: Duration, answered: u64, expected: Duration, noise: PathNoise) -> Duration {
    let n = answered.max(1) as f64;
    let sampling = RTT_STANDARD_ERRORS * jitter.as_secs_f64() / n.sqrt();
    let sigma = noise.spread.as_secs_f64() / P10_P90_SIGMAS;
    let m = noise.answered.max(1) as f64;
    let path = RTT_STANDARD_ERRORS * MEDIAN_SE_FACTOR * sigma * (1.0 / n + 1.0 / m).sqrt();
    RTT_FLOOR + expected.mul_f64(RTT_FLOOR_RELATIVE) + Duration::from_secs_f64(sampling + path)
}

/// The Wilson score interval of a loss ratio (`lost` of `sent`) at 99 % confidence; `None` for no probes.
pub fn wilson_99(lost: u64, sent: u64) -> Option<(f64, f64)> {
    if sent == 0 {
        return None;
    }
    let n = sent as f64;
    let p = lost.min(sent) as f64 / n;
    let z2 = Z_99 * Z_99;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z_99 / denominator * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // With no loss (or only loss) the bound is exactly 0 (1) in arithmetic, but `centre − half` rounds to a few
    // 1e-17 for some n, which would call a lossless link that expects no loss `Lossier`.
    let low = if lost == 0 { 0.0 } else { (centre - half).max(0.0) };
    let high = if lost >= sent { 1.0 } else { (centre + half).min(1.0) };
    Some((low, high))
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::{Correlated, ImpairmentFields, Percent};

    use super::*;

    fn imp(f: ImpairmentFields) -> Impairment {
        Impairment::try_from(f).unwrap()
    }

    fn pct(v: f64) -> Percent {
        Percent::new("t", v).unwrap()
    }

    #[test]
    fn latencies_and_serialization_add_up() {
        let out = imp(ImpairmentFields {
            latency: Some(Duration::from_millis(60)),
            rate_bps: Some(1_000_000),
            ..Default::default()
        });
        let back = imp(ImpairmentFields { latency: Some(Duration::from_millis(40)), ..Default::default() });
        let rt = RoundTrip { out: &out, back: Some(&back) };
        // 98 bytes at 1 Mbit/s: 784 µs.
        assert_eq!(rt.added_rtt(ProbeKind::IcmpEcho, false), Duration::from_micros(100_784));
        assert_eq!(rt.added_rtt(ProbeKind::IcmpEcho, true), Duration::from_micros(100_944));
        let one_way = RoundTrip { out: &out, back: None };
        assert_eq!(one_way.added_rtt(ProbeKind::TcpSyn, false), Duration::from_micros(60_592));
    }

    #[test]
    fn loss_combines_directions_models_and_corruption() {
        let random = imp(ImpairmentFields {
            loss: Some(Loss::Random(Correlated { percent: pct(10.0), correlation: pct(0.0) })),
            ..Default::default()
        });
        let corrupt = imp(ImpairmentFields {
            corrupt: Some(Correlated { percent: pct(10.0), correlation: pct(0.0) }),
            ..Default::default()
        });
        let rt = RoundTrip { out: &random, back: Some(&corrupt) };
        assert!((rt.expected_loss() - 0.19).abs() < 1e-12);
        // p = 1 %, r = 9 %: a tenth of the time in the bad state, which loses half; the good state loses 1 %.
        let ge = |p, r, bad, good| {
            imp(ImpairmentFields {
                loss: Some(Loss::GilbertElliott {
                    p: pct(p),
                    r: pct(r),
                    loss_in_bad: pct(bad),
                    loss_in_good: pct(good),
                }),
                ..Default::default()
            })
        };
        assert!((direction_loss(&ge(1.0, 9.0, 50.0, 1.0)) - (0.1 * 0.5 + 0.9 * 0.01)).abs() < 1e-12);
        // A chain that never moves stays in its first (good) state.
        let stuck = ge(0.0, 0.0, 100.0, 2.0);
        assert!((direction_loss(&stuck) - 0.02).abs() < 1e-12);
        assert_eq!(RoundTrip { out: &Impairment::default(), back: None }.expected_loss(), 0.0);
    }

    #[test]
    fn the_tolerance_shrinks_with_samples_and_grows_with_jitter() {
        let expected = Duration::from_millis(100);
        let floor = RTT_FLOOR + Duration::from_millis(2);
        let quiet = PathNoise::default();
        assert_eq!(rtt_tolerance(Duration::ZERO, 300, expected, quiet), floor);
        // ±10 ms over 100 answers: 3 · 10 ms / 10 = 3 ms above the floor.
        let t = rtt_tolerance(Duration::from_millis(10), 100, expected, quiet);
        assert!((t.as_secs_f64() - (floor + Duration::from_millis(3)).as_secs_f64()).abs() < 1e-9, "{t:?}");
        assert!(rtt_tolerance(Duration::from_millis(10), 400, expected, quiet) < t);
    }

    #[test]
    fn a_noisy_path_widens_the_tolerance_by_its_medians_standard_errors() {
        let expected = Duration::from_millis(100);
        let floor = rtt_tolerance(Duration::ZERO, 100, expected, PathNoise::default());
        // A baseline spreading 25.63 ms (σ = 10 ms), 100 impaired and 100 baseline answers:
        // 3 · 1.2533 · 10 ms · √(2/100) = 5.317 ms.
        let noise = PathNoise { spread: Duration::from_secs_f64(0.025_631_03), answered: 100 };
        let t = rtt_tolerance(Duration::ZERO, 100, expected, noise);
        assert!(((t - floor).as_secs_f64() - 0.005_317).abs() < 1e-5, "{:?}", t - floor);
        let more = PathNoise { answered: 400, ..noise };
        assert!(rtt_tolerance(Duration::ZERO, 400, expected, more) < t, "more samples, tighter");
    }

    #[test]
    fn no_loss_and_all_loss_have_exact_bounds_for_every_count() {
        for n in 1..=5_000 {
            assert_eq!(wilson_99(0, n).unwrap().0, 0.0, "n = {n}");
            assert_eq!(wilson_99(n, n).unwrap().1, 1.0, "n = {n}");
        }
    }

    #[test]
    fn wilson_intervals_match_known_values() {
        assert_eq!(wilson_99(0, 0), None);
        let (lo, hi) = wilson_99(0, 300).unwrap();
        assert_eq!(lo, 0.0);
        // z² / (n + z²) for no losses.
        assert!((hi - Z_99 * Z_99 / (300.0 + Z_99 * Z_99)).abs() < 1e-9, "{hi}");
        let (lo, hi) = wilson_99(30, 300).unwrap();
        assert!(lo < 0.1 && 0.1 < hi && lo > 0.06 && hi < 0.16, "{lo} {hi}");
        assert_eq!(wilson_99(300, 300).unwrap().1, 1.0);
    }
}
