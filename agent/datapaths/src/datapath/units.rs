//! An impairment in the kernel's units and back: the TBF (rate, bucket, queue) and the netem (delays,
//! probabilities on the u32 scale, queue from the bandwidth-delay product) that implement it, and the impairment
//! an installed pair implements. The one place where user units become kernel units. Every queue is held to a
//! [`QueueBound`] (`super::queue`), the user's own `queueLimit` included.

use std::time::Duration;

use isthmus_agent_api::{Correlated, Impairment, ImpairmentError, ImpairmentFields, Loss, Percent, Reorder};

use super::model::*;
use super::psched::{self, PSCHED_SHIFT};
pub use super::queue::FRAME_BYTES;
use super::queue::QueueBound;

/// Default TBF bucket: what the rate delivers in this time, but never less than [`MIN_BURST_BYTES`].
pub const DEFAULT_BURST_TIME: Duration = Duration::from_millis(5);
pub const MIN_BURST_BYTES: u64 = 3200;
/// TBF's own queue (rate-only destinations): the bucket plus this much time at the rate.
pub const DEFAULT_TBF_QUEUE_TIME: Duration = Duration::from_millis(100);
/// netem's queue never goes below the kernel's and tc's default.
pub const MIN_NETEM_LIMIT: u64 = 1000;
/// For netem without a rate, the queue is sized as if the link ran at this speed.
pub const ASSUMED_LINE_BYTES_PER_SEC: u64 = 10_000_000_000 / 8;

/// The TBF for an impairment with a rate; its queue (bytes) held to `bound`.
pub fn tbf_for(imp: &ImpairmentFields, bound: QueueBound) -> Option<Tbf> {
    let rate_bps = imp.rate_bps?;
    let rate = (rate_bps / 8).max(1);
    let burst = burst_bytes(imp);
    let limit = match imp.queue_limit_packets {
        Some(packets) if !imp.needs_netem() => u64::from(packets) * FRAME_BYTES,
        _ => burst + bytes_in(rate, DEFAULT_TBF_QUEUE_TIME),
    };
    Some(Tbf {
        rate_bytes_per_sec: rate,
        // `check_representable` refuses a bucket past the kernel's 32 bits before anything is built; saturating
        // here keeps a miss from wrapping to a tiny bucket.
        buffer_ticks: u32::try_from(tbf_buffer_ticks(rate, burst)).unwrap_or(u32::MAX),
        limit_bytes: limit.min(bound.bytes()).min(u64::from(u32::MAX)) as u32,
        peak: None,
    })
}

/// The bucket in bytes: the user's, or [`DEFAULT_BURST_TIME`] at the rate (at least [`MIN_BURST_BYTES`]).
pub fn burst_bytes(imp: &ImpairmentFields) -> u64 {
    match (imp.burst_bytes, imp.rate_bps) {
        (Some(b), _) => u64::from(b),
        (None, Some(rate_bps)) => bytes_in((rate_bps / 8).max(1), DEFAULT_BURST_TIME).max(MIN_BURST_BYTES),
        (None, None) => 0,
    }
}

fn bytes_in(rate_bytes_per_sec: u64, time: Duration) -> u64 {
    (u128::from(rate_bytes_per_sec) * time.as_nanos() / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}

/// What the kernel dumps as TBF's `buffer` when given `TCA_TBF_BURST = burst`: the time to send `burst` bytes
/// at `rate` (kernel `psched_ratecfg_precompute` + `psched_l2t_ns`), in 64 ns psched ticks.
pub fn tbf_buffer_ticks(rate_bytes_per_sec: u64, burst: u64) -> u64 {
    // The codec's replica of the kernel arithmetic, widened: a default burst is computed in u64 before the
    // representability check.
    let (mult, shift) = psched::rate_mult_shift(rate_bytes_per_sec);
    ((u128::from(burst) * u128::from(mult)) >> shift) as u64 >> PSCHED_SHIFT
}

/// Bytes the kernel's TBF bucket holds for `ticks` at `rate` (inverse of [`tbf_buffer_ticks`], rounded).
pub fn tbf_burst_bytes(rate_bytes_per_sec: u64, ticks: u32) -> u64 {
    (u128::from(ticks) * 64 * u128::from(rate_bytes_per_sec)).div_ceil(1_000_000_000) as u64
}

/// netem's queue: the user's limit, or the bandwidth-delay product in frames with 50 % margin, at least 1,000;
/// either held to `bound` (at least one packet).
pub fn netem_limit(imp: &ImpairmentFields, bound: QueueBound) -> u32 {
    let wanted = match imp.queue_limit_packets {
        Some(packets) => u64::from(packets),
        None => {
            let rate = imp.rate_bps.map(|r| (r / 8).max(1)).unwrap_or(ASSUMED_LINE_BYTES_PER_SEC);
            let delay = imp.latency.unwrap_or_default() + imp.jitter.unwrap_or_default();
            (bytes_in(rate, delay) * 3 / 2).div_ceil(FRAME_BYTES).max(MIN_NETEM_LIMIT)
        }
    };
    wanted.min(u64::from(bound.packets())).max(1) as u32
}

/// A user's explicit queue limit that `bound` cuts: what was asked for and what is installed, in packets. `None`
/// when nothing was asked for, it fits, or no queue is installed for it (neither netem nor a rate).
pub fn queue_cap(imp: &ImpairmentFields, bound: QueueBound) -> Option<(u32, u32)> {
    let requested = imp.queue_limit_packets?;
    let installed = if imp.needs_netem() {
        netem_limit(imp, bound)
    } else {
        let tbf = tbf_for(imp, bound)?;
        (u64::from(tbf.limit_bytes) / FRAME_BYTES).max(1) as u32
    };
    (installed < requested).then_some((requested, installed))
}

/// The netem for an impairment, canonical so that it equals what the kernel dumps back: probabilities whose
/// event is off carry no correlation, reordering without a gap gets gap 1 (as tc does; with gap 0 the kernel
/// never reorders).
pub fn netem_for(imp: &ImpairmentFields, bound: QueueBound) -> Netem {
    let jitter = imp.jitter.filter(|j| !j.is_zero());
    let correlated = |c: Option<Correlated>| match c {
        Some(c) if !c.percent.is_zero() => (c.percent.to_kernel(), c.correlation.to_kernel()),
        _ => (0, 0),
    };
    let (duplicate, duplicate_correlation) = correlated(imp.duplicate);
    let (corrupt, corrupt_correlation) = correlated(imp.corrupt);
    let (reorder, reorder_correlation, gap) = match imp.reorder {
        Some(r) if !r.percent.is_zero() => (r.percent.to_kernel(), r.correlation.to_kernel(), r.gap.max(1)),
        _ => (0, 0, 0),
    };
    let loss = match imp.loss {
        Some(Loss::Random(c)) if !c.percent.is_zero() => {
            NetemLoss::Random { probability: c.percent.to_kernel(), correlation: c.correlation.to_kernel() }
        }
        Some(Loss::Random(_)) | None => NetemLoss::None,
        // Kernel (sch_netem.c loss_gilb_ell): in the bad state a packet is lost when random > h, so h is the
        // delivery probability there; in the good state lost when random < k1, so k1 is the loss probability.
        Some(Loss::GilbertElliott { p, r, loss_in_bad, loss_in_good }) => NetemLoss::GilbertElliott {
            p: p.to_kernel(),
            r: r.to_kernel(),
            h: u32::MAX - loss_in_bad.to_kernel(),
            k1: loss_in_good.to_kernel(),
        },
    };
    Netem {
        latency_ns: imp.latency.map(|d| d.as_nanos() as i64).unwrap_or(0),
        jitter_ns: jitter.map(|d| d.as_nanos() as i64).unwrap_or(0),
        limit_packets: netem_limit(imp, bound),
        gap,
        duplicate,
        delay_correlation: if jitter.is_some() { imp.jitter_correlation.unwrap_or_default().to_kernel() } else { 0 },
        loss,
        duplicate_correlation,
        reorder,
        reorder_correlation,
        corrupt,
        corrupt_correlation,
    }
}

fn percent_from_kernel(v: u32) -> Percent {
    // Round to 1e-6 % so values written by `Percent::to_kernel` read back as the number the user gave.
    let p = (f64::from(v) / f64::from(u32::MAX) * 100.0 * 1e6).round() / 1e6;
    Percent::new("percent", p.clamp(0.0, 100.0)).unwrap_or(Percent::ZERO)
}

/// The impairment an installed TBF/netem pair implements, as far as the kernel's units allow (rates are
/// whole bytes per second; an explicit burst equal to the default reads back as the default). An error when
/// what is installed is not a valid impairment. A queue equal to what `bound` makes of the impairment reads back
/// as no `queueLimit`.
pub fn impairment_of(
    tbf: Option<&Tbf>,
    netem: Option<&Netem>,
    bound: QueueBound,
) -> Result<Impairment, ImpairmentError> {
    let mut imp = ImpairmentFields::default();
    if let Some(t) = tbf.filter(|t| !super::tree::is_segmenting(t, bound)) {
        imp.rate_bps = Some(t.rate_bytes_per_sec * 8);
        let burst = tbf_burst_bytes(t.rate_bytes_per_sec, t.buffer_ticks);
        let default_ticks = tbf_buffer_ticks(t.rate_bytes_per_sec, burst_bytes(&imp));
        if u64::from(t.buffer_ticks) != default_ticks {
            imp.burst_bytes = Some(burst.min(u64::from(u32::MAX)) as u32);
        }
    }
    if let Some(n) = netem {
        let ns = |v: i64| (v > 0).then(|| Duration::from_nanos(v as u64));
        imp.latency = ns(n.latency_ns);
        imp.jitter = ns(n.jitter_ns);
        if imp.jitter.is_some() && n.delay_correlation != 0 {
            imp.jitter_correlation = Some(percent_from_kernel(n.delay_correlation));
        }
        let corr = |p: u32, c: u32| {
            (p != 0).then(|| Correlated { percent: percent_from_kernel(p), correlation: percent_from_kernel(c) })
        };
        imp.duplicate = corr(n.duplicate, n.duplicate_correlation);
        imp.corrupt = corr(n.corrupt, n.corrupt_correlation);
        imp.reorder = (n.reorder != 0).then(|| Reorder {
            percent: percent_from_kernel(n.reorder),
            correlation: percent_from_kernel(n.reorder_correlation),
            gap: if n.gap <= 1 { 0 } else { n.gap },
        });
        imp.loss = match n.loss {
            NetemLoss::None => None,
            NetemLoss::Random { probability, correlation } => Some(Loss::Random(Correlated {
                percent: percent_from_kernel(probability),
                correlation: percent_from_kernel(correlation),
            })),
            NetemLoss::GilbertElliott { p, r, h, k1 } => Some(Loss::GilbertElliott {
                p: percent_from_kernel(p),
                r: percent_from_kernel(r),
                loss_in_bad: percent_from_kernel(u32::MAX - h),
                loss_in_good: percent_from_kernel(k1),
            }),
        };
        if netem_limit(&ImpairmentFields { queue_limit_packets: None, ..imp.clone() }, bound) != n.limit_packets {
            imp.queue_limit_packets = Some(n.limit_packets);
        }
    } else if let Some(t) = tbf {
        let default_limit = tbf_for(&imp, bound).map(|d| d.limit_bytes);
        if default_limit != Some(t.limit_bytes) {
            imp.queue_limit_packets = Some((u64::from(t.limit_bytes) / FRAME_BYTES).max(1) as u32);
        }
    }
    Impairment::try_from(imp)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::datapath::queue::QueueBudget;

    const OPEN: QueueBound = QueueBound::UNBOUNDED;

    fn ms(v: u64) -> Option<Duration> {
        Some(Duration::from_millis(v))
    }

    #[test]
    fn tbf_buffer_matches_kernel_arithmetic() {
        // 10 Mbit/s = 1,250,000 B/s; 15,000 bytes take 12 ms = 187,500 ticks (kernel rounds down via mult/shift).
        let ticks = tbf_buffer_ticks(1_250_000, 15_000);
        assert!((187_490..=187_500).contains(&ticks), "{ticks}");
        assert!(tbf_burst_bytes(1_250_000, ticks as u32).abs_diff(15_000) <= 1);
        let imp = ImpairmentFields { rate_bps: Some(10_000_000), ..Default::default() };
        assert_eq!(burst_bytes(&imp), 6250);
        let slow = ImpairmentFields { rate_bps: Some(64_000), ..Default::default() };
        assert_eq!(burst_bytes(&slow), MIN_BURST_BYTES);
        let tbf = tbf_for(&imp, OPEN).unwrap();
        assert_eq!(tbf.rate_bytes_per_sec, 1_250_000);
        assert_eq!(tbf.limit_bytes, 6250 + 125_000);
    }

    #[test]
    fn netem_limit_follows_bandwidth_delay_product() {
        let fast_long = ImpairmentFields { rate_bps: Some(1_000_000_000), latency: ms(100), ..Default::default() };
        // 125 MB/s × 100 ms = 12.5 MB, × 1.5 margin = 18.75 MB = 12,385 frames of 1,514 bytes.
        assert_eq!(netem_limit(&fast_long, OPEN), 12_385);
        let short = ImpairmentFields { rate_bps: Some(1_000_000), latency: ms(1), ..Default::default() };
        assert_eq!(netem_limit(&short, OPEN), 1000);
        let explicit = ImpairmentFields { latency: ms(100), queue_limit_packets: Some(50), ..Default::default() };
        assert_eq!(netem_limit(&explicit, OPEN), 50);
        let no_rate = ImpairmentFields { latency: ms(100), jitter: ms(20), ..Default::default() };
        assert_eq!(netem_limit(&no_rate, OPEN), (1_250_000_000u64 * 120 / 1000 * 3 / 2).div_ceil(FRAME_BYTES) as u32);
    }

    #[test]
    fn netem_is_canonical_and_reads_back() {
        let p = |v| Percent::new("p", v).unwrap();
        let imp = ImpairmentFields {
            latency: ms(50),
            jitter: ms(5),
            jitter_correlation: Some(p(25.0)),
            loss: Some(Loss::GilbertElliott { p: p(1.0), r: p(10.0), loss_in_bad: p(70.0), loss_in_good: p(0.5) }),
            duplicate: Some(Correlated { percent: p(0.0), correlation: p(30.0) }),
            corrupt: Some(Correlated { percent: p(0.1), correlation: p(0.0) }),
            reorder: Some(Reorder { percent: p(25.0), correlation: p(50.0), gap: 0 }),
            rate_bps: Some(100_000_000),
            burst_bytes: Some(64_000),
            queue_limit_packets: None,
        };
        let n = netem_for(&imp, OPEN);
        assert_eq!(n.latency_ns, 50_000_000);
        assert_eq!((n.duplicate, n.duplicate_correlation), (0, 0), "no correlation without duplication");
        assert_eq!(n.gap, 1, "reorder without gap is gap 1, as tc sends");
        let NetemLoss::GilbertElliott { h, k1, .. } = n.loss else { panic!() };
        assert_eq!(h, u32::MAX - p(70.0).to_kernel());
        assert_eq!(k1, p(0.5).to_kernel());
        let back = impairment_of(tbf_for(&imp, OPEN).as_ref(), Some(&n), OPEN).unwrap();
        let expected = ImpairmentFields { duplicate: None, ..imp };
        assert_eq!(back.fields(), &expected);
        assert_eq!(netem_for(back.fields(), OPEN), n);
    }

    #[test]
    fn every_queue_is_held_to_the_bound() {
        let bound = QueueBudget::DEFAULT.bound(1);
        assert_eq!(bound.packets(), 11_081);
        // An hour of latency without a rate: the product at the assumed 10 Gbit/s is 4.5 TB.
        let hour = ImpairmentFields { latency: Some(Duration::from_secs(3600)), ..Default::default() };
        assert_eq!(netem_limit(&hour, OPEN), u32::MAX);
        assert_eq!(netem_limit(&hour, bound), 11_081);
        assert_eq!(queue_cap(&hour, bound), None, "a derived limit is not a cap of the user's");
        let asked = ImpairmentFields { queue_limit_packets: Some(1_000_000), ..hour.clone() };
        assert_eq!(netem_limit(&asked, bound), 11_081);
        assert_eq!(queue_cap(&asked, bound), Some((1_000_000, 11_081)));
        let fits = ImpairmentFields { queue_limit_packets: Some(500), ..hour };
        assert_eq!((netem_limit(&fits, bound), queue_cap(&fits, bound)), (500, None));
        // TBF alone: its byte limit, derived (10 Gbit/s: 125 MB for 100 ms) or asked for.
        let fast = ImpairmentFields { rate_bps: Some(10_000_000_000), ..Default::default() };
        assert_eq!(u64::from(tbf_for(&fast, bound).unwrap().limit_bytes), bound.bytes());
        let queue = ImpairmentFields { queue_limit_packets: Some(100_000), ..fast };
        assert_eq!(queue_cap(&queue, bound), Some((100_000, 11_081)));
        let no_queue = ImpairmentFields { queue_limit_packets: Some(100_000), ..Default::default() };
        assert_eq!(queue_cap(&no_queue, bound), None, "nothing queues without netem or a rate");
        // A capped queue reads back as the impairment without a queue limit, under the same bound.
        let n = netem_for(&asked, bound);
        let back = impairment_of(None, Some(&n), bound).unwrap();
        assert_eq!(back.fields().queue_limit_packets, None);
        assert_eq!(netem_for(back.fields(), bound), n);
    }

    fn fields() -> impl Strategy<Value = ImpairmentFields> {
        (
            proptest::option::of(0u64..=3_600_000),
            proptest::option::of(8u64..=100_000_000_000),
            proptest::option::of(1u32..=u32::MAX),
        )
            .prop_map(|(latency_ms, rate_bps, queue_limit_packets)| ImpairmentFields {
                latency: latency_ms.map(Duration::from_millis),
                rate_bps,
                queue_limit_packets,
                ..Default::default()
            })
    }

    fn bound() -> impl Strategy<Value = QueueBound> {
        (1usize..=4095, FRAME_BYTES..=1u64 << 34)
            .prop_map(|(n, per_destination)| QueueBudget::new(per_destination, 1 << 40).unwrap().bound(n))
    }

    proptest! {
        #[test]
        fn queues_never_exceed_their_bound(imp in fields(), bound in bound()) {
            let packets = netem_limit(&imp, bound);
            prop_assert!((1..=bound.packets()).contains(&packets));
            prop_assert_eq!(netem_for(&imp, bound).limit_packets, packets);
            if let Some(tbf) = tbf_for(&imp, bound) {
                prop_assert!(u64::from(tbf.limit_bytes) <= bound.bytes());
            }
            if let Some((requested, installed)) = queue_cap(&imp, bound) {
                prop_assert!(installed < requested && Some(requested) == imp.queue_limit_packets);
            }
        }

        #[test]
        fn queues_grow_with_the_bound(imp in fields(), a in bound(), b in bound()) {
            let (small, large) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(netem_limit(&imp, small) <= netem_limit(&imp, large));
            let tbf_limit = |bound| tbf_for(&imp, bound).map(|t| t.limit_bytes);
            prop_assert!(tbf_limit(small) <= tbf_limit(large));
            prop_assert!(netem_limit(&imp, large) <= netem_limit(&imp, OPEN));
        }
    }
}
