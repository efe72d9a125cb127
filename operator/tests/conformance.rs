//! The conformance judge: every reason, the numbers in its messages, and properties over generated links and
//! windows (merging is exact, an ideal measurement always conforms, a shifted one is called out).

use std::time::Duration;

use isthmus_agent_api::measure::{ProbeKind, ProbeWindow, RttHistogram, Unmeasurable, UnmeasurableReason};
use isthmus_agent_api::{Correlated, Direction, Impairment, ImpairmentFields, Loss, Percent};
use isthmus_operator::api::measured::{ConformanceReason, DirectionMeasured};
use isthmus_operator::measure::expect::wilson_99;
use isthmus_operator::measure::{Judged, Merged, RoundTrip, judge, overall, summary, unjudged_scheduled};
use proptest::prelude::*;

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v / 1e3)
}

fn impairment(latency_ms: f64, jitter_ms: f64, loss_percent: f64) -> Impairment {
    Impairment::try_from(ImpairmentFields {
        latency: Some(ms(latency_ms)),
        jitter: (jitter_ms > 0.0).then(|| ms(jitter_ms)),
        loss: (loss_percent > 0.0).then(|| {
            Loss::Random(Correlated {
                percent: Percent::new("loss", loss_percent).unwrap(),
                correlation: Percent::ZERO,
            })
        }),
        ..Default::default()
    })
    .unwrap()
}

/// A window whose answers are spread evenly over `centre ± spread` (the quantiles of a uniform distribution).
fn window(centre: Duration, spread: Duration, sent: u64, answered: u64) -> ProbeWindow {
    let mut rtt = RttHistogram::new();
    for i in 0..answered {
        let u = (i as f64 + 0.5) / answered as f64 * 2.0 - 1.0;
        rtt.record(Duration::from_secs_f64((centre.as_secs_f64() + u * spread.as_secs_f64()).max(0.0)));
    }
    ProbeWindow { sent, answered, rtt }
}

fn merged(impaired: ProbeWindow, baseline: Duration) -> Merged {
    Merged {
        probe: Some(ProbeKind::IcmpEcho),
        pairs: 4,
        baseline: window(baseline, Duration::ZERO, 50, 50),
        impaired,
        window: Duration::from_secs(30),
        last_answer_ms: Some(1_700_000_000_123),
        nodes: 2,
        ..Default::default()
    }
}

fn input<'a>(out: &'a Impairment, back: Option<&'a Impairment>) -> Judged<'a> {
    Judged { path: RoundTrip { out, back }, ipv6: false, applied: true }
}

const BASE: f64 = 0.8;

#[test]
fn a_link_that_does_what_it_says_conforms_and_reports_its_numbers() {
    let (out, back) = (impairment(60.0, 0.0, 0.0), impairment(40.0, 0.0, 0.0));
    let m = merged(window(ms(100.8), ms(0.2), 300, 300), ms(BASE));
    let v = judge(input(&out, Some(&back)), Some(&m));
    assert_eq!(v.reason, ConformanceReason::Conformant, "{}", v.message);
    assert_eq!(v.conformant(), Some(true));
    assert_eq!(v.expected_added_rtt, ms(100.0));
    let d = v.measured.unwrap();
    assert_eq!((d.samples, d.pairs), (300, 4));
    assert_eq!(d.loss.as_deref(), Some("0%"));
    assert_eq!(d.window.as_deref(), Some("30s"));
    assert_eq!(d.expected_rtt.as_deref(), Some("100.8ms"), "the baseline as the histogram reads it back, 4 digits");
    assert!(d.loss_interval.as_deref().unwrap().starts_with("0%–2.1"), "{:?}", d.loss_interval);
    assert_eq!(d.last_sample.unwrap().0.as_second(), 1_700_000_000);
    assert!(v.message.contains("300 probes over 4 pairs in 30s"), "{}", v.message);
}

#[test]
fn too_slow_and_too_fast_say_by_how_much() {
    let out = impairment(50.0, 0.0, 0.0);
    let slow = judge(input(&out, None), Some(&merged(window(ms(80.0), ms(1.0), 200, 200), ms(BASE))));
    assert_eq!(slow.reason, ConformanceReason::Slower);
    assert!(slow.message.contains("expected 50.8ms ±"), "{}", slow.message);
    assert!(slow.message.starts_with("round trip p50 79.") || slow.message.starts_with("round trip p50 80."));
    // The impairment not in force: the baseline comes back.
    let fast = judge(input(&out, None), Some(&merged(window(ms(BASE), ms(0.1), 200, 200), ms(BASE))));
    assert_eq!(fast.reason, ConformanceReason::Faster, "{}", fast.message);
    assert_eq!(fast.conformant(), Some(false));
}

#[test]
fn loss_is_judged_by_its_99_percent_interval() {
    let clean = impairment(10.0, 0.0, 0.0);
    let lossy = judge(input(&clean, None), Some(&merged(window(ms(10.8), ms(0.1), 300, 270), ms(BASE))));
    assert_eq!(lossy.reason, ConformanceReason::Lossier, "{}", lossy.message);
    assert!(lossy.message.contains("loss 10% (99% interval"), "{}", lossy.message);
    let ten = impairment(10.0, 0.0, 10.0);
    let fine = judge(input(&ten, None), Some(&merged(window(ms(10.8), ms(0.1), 300, 270), ms(BASE))));
    assert_eq!(fine.reason, ConformanceReason::Conformant, "{}", fine.message);
    let less = judge(input(&ten, None), Some(&merged(window(ms(10.8), ms(0.1), 300, 300), ms(BASE))));
    assert_eq!(less.reason, ConformanceReason::LessLossy, "{}", less.message);
    // Both directions' loss: 1 − 0.9 · 0.9 = 19 %.
    let both = judge(input(&ten, Some(&ten)), Some(&merged(window(ms(20.8), ms(0.1), 1000, 810), ms(BASE))));
    assert_eq!(both.reason, ConformanceReason::Conformant, "{}", both.message);
    assert!((both.expected_loss - 0.19).abs() < 1e-12);
    // Everything lost, as configured: only the loss can be judged, and it conforms.
    let all = impairment(10.0, 0.0, 100.0);
    let gone = judge(input(&all, None), Some(&merged(window(ms(1.0), ms(0.0), 300, 0), ms(BASE))));
    assert_eq!(gone.reason, ConformanceReason::Conformant, "{}", gone.message);
}

#[test]
fn what_cannot_be_measured_is_never_conformant() {
    let out = impairment(10.0, 0.0, 0.0);
    let good = merged(window(ms(10.8), ms(0.1), 300, 300), ms(BASE));
    let cases: Vec<(Judged<'_>, Option<Merged>, &str)> = vec![
        (Judged { applied: false, ..input(&out, None) }, Some(good.clone()), "no pair of this direction is applied"),
        (input(&out, None), None, "no agent has reported"),
        (input(&out, None), Some(Merged { stale_nodes: 1, ..Default::default() }), "stale"),
        (
            input(&out, None),
            Some(Merged {
                unmeasurable_nodes: 1,
                unmeasurable: Some(Unmeasurable { reason: UnmeasurableReason::NoAnswer, message: "filtered".into() }),
                ..Default::default()
            }),
            "NoAnswer: filtered",
        ),
        (input(&out, None), Some(merged(ProbeWindow::default(), ms(BASE))), "no probe was sent"),
        (input(&out, None), Some(merged(window(ms(1.0), ms(0.0), 300, 0), ms(BASE))), "no probe was answered"),
        (
            input(&out, None),
            Some(Merged { baseline: ProbeWindow { sent: 9, ..Default::default() }, ..good.clone() }),
            "baseline got no answer",
        ),
    ];
    for (i, (judged, m, text)) in cases.into_iter().enumerate() {
        let v = judge(judged, m.as_ref());
        assert_eq!(v.reason, ConformanceReason::Unmeasurable, "case {i}: {}", v.message);
        assert_eq!(v.conformant(), None);
        assert!(v.message.contains(text), "case {i}: {}", v.message);
    }
}

#[test]
fn a_scheduled_link_keeps_its_numbers_but_is_not_judged_against_its_own_impairment() {
    let out = impairment(40.0, 0.0, 0.0);
    // Half the window at 40 ms, half in a 100 % loss phase: against the link's own impairment, Lossier.
    let v = judge(input(&out, None), Some(&merged(window(ms(40.0 + BASE), ms(0.1), 300, 150), ms(BASE))));
    assert_eq!(v.reason, ConformanceReason::Lossier);
    let s = unjudged_scheduled(v.clone());
    assert_eq!((s.reason, s.conformant()), (ConformanceReason::Scheduled, None));
    assert!(s.message.contains("spec.schedule"), "{}", s.message);
    assert_eq!(s.measured, v.measured, "what was measured stays");
    let nothing = judge(Judged { applied: false, ..input(&out, None) }, None);
    assert_eq!(unjudged_scheduled(nothing).reason, ConformanceReason::Unmeasurable, "nothing measured says so");
}

#[test]
fn the_condition_names_the_first_direction_that_fails() {
    let out = impairment(10.0, 0.0, 0.0);
    let ok = judge(input(&out, None), Some(&merged(window(ms(10.8), ms(0.1), 300, 300), ms(BASE))));
    let slow = judge(input(&out, None), Some(&merged(window(ms(30.0), ms(0.1), 300, 300), ms(BASE))));
    let unknown = judge(input(&out, None), None);
    let (reason, message) = overall(&[(Direction::Forward, &ok), (Direction::Reverse, &slow)]);
    assert_eq!(reason, ConformanceReason::Slower);
    assert!(message.starts_with("forward: round trip") && message.contains("; reverse: round trip"), "{message}");
    assert_eq!(overall(&[(Direction::Forward, &unknown), (Direction::Reverse, &slow)]).0, ConformanceReason::Slower);
    assert_eq!(
        overall(&[(Direction::Forward, &ok), (Direction::Reverse, &unknown)]).0,
        ConformanceReason::Unmeasurable
    );
    assert_eq!(overall(&[(Direction::Forward, &ok)]), (ConformanceReason::Conformant, ok.message.clone()));
    assert_eq!(overall(&[]).0, ConformanceReason::Unmeasurable);
}

#[test]
fn the_measured_column_shows_each_direction() {
    let d = |p50: &str, loss: &str| DirectionMeasured {
        rtt_p50: Some(p50.into()),
        loss: Some(loss.into()),
        ..Default::default()
    };
    let (fwd, rev) = (d("121.437ms", "0.4%"), d("80.24ms", "0%"));
    assert_eq!(summary(Some(&fwd), None).as_deref(), Some("121ms 0.4%"));
    assert_eq!(summary(Some(&fwd), Some(Some(&rev))).as_deref(), Some("121ms 0.4%/80.2ms 0%"));
    assert_eq!(summary(Some(&d("950us", "1%")), Some(None)).as_deref(), Some("0.95ms 1%/-"));
    let lost = DirectionMeasured { loss: Some("100%".into()), ..Default::default() };
    assert_eq!(summary(Some(&lost), None).as_deref(), Some("- 100%"));
    assert_eq!(summary(None, None), None);
    // What the judge writes reads back in the column.
    let out = impairment(120.0, 0.0, 0.0);
    let v = judge(input(&out, None), Some(&merged(window(ms(121.0), ms(0.0), 1000, 996), ms(BASE))));
    let text = summary(v.measured.as_ref(), None).unwrap();
    assert!(text.ends_with("ms 0.4%") && (text.starts_with("12") || text.starts_with("11")), "{text}");
}

proptest! {
    /// Answers spread evenly over the configured jitter around the expected RTT, with the expected share lost,
    /// always conform, whatever the latency, jitter, loss and sample size.
    #[test]
    fn an_ideal_measurement_conforms(
        latency in 0.0f64..2000.0, jitter_share in 0.0f64..1.0, back in proptest::option::of(0.0f64..500.0),
        loss in 0.0f64..60.0, sent in 20u64..3000, base in 0.05f64..5.0,
    ) {
        let out = impairment(latency, latency * jitter_share, loss);
        let back = back.map(|b| impairment(b, 0.0, 0.0));
        let path = input(&out, back.as_ref());
        let expected = ms(base) + path.path.added_rtt(ProbeKind::IcmpEcho, false);
        let answered = sent - (path.path.expected_loss() * sent as f64).round() as u64;
        prop_assume!(answered > 0);
        let m = merged(window(expected, path.path.widest_jitter(), sent, answered), ms(base));
        let v = judge(path, Some(&m));
        prop_assert_eq!(v.reason, ConformanceReason::Conformant, "{}", v.message);
    }

    /// Shifting every answer later by more than the tolerance is `Slower`, earlier `Faster`; never the other.
    #[test]
    fn a_shift_beyond_the_tolerance_is_called_out(
        latency in 1.0f64..1000.0, jitter_share in 0.0f64..0.5, sent in 50u64..1000, later in any::<bool>(),
    ) {
        let out = impairment(latency, latency * jitter_share, 0.0);
        let path = input(&out, None);
        let expected = ms(BASE + latency);
        let tolerance = isthmus_operator::measure::expect::rtt_tolerance(
            path.path.widest_jitter(),
            sent,
            expected,
            isthmus_operator::measure::expect::PathNoise::default(),
        );
        // Beyond the tolerance plus the histogram's 1 % reading error.
        let shift = tolerance.mul_f64(1.05) + expected.mul_f64(0.03);
        let centre = if later { expected + shift } else { expected.saturating_sub(shift) };
        prop_assume!(!centre.is_zero());
        let v = judge(path, Some(&merged(window(centre, path.path.widest_jitter(), sent, sent), ms(BASE))));
        let want = if later { ConformanceReason::Slower } else { ConformanceReason::Faster };
        prop_assert_eq!(v.reason, want, "{}", v.message);
    }

    /// Nodes' windows merged give the verdict of one window holding all their probes.
    #[test]
    fn merging_nodes_changes_no_verdict(
        a in proptest::collection::vec(1u64..200_000, 1..80), b in proptest::collection::vec(1u64..200_000, 0..80),
        lost_a in 0u64..20, lost_b in 0u64..20, latency in 0.0f64..150.0,
    ) {
        let fill = |xs: &[u64], lost: u64| {
            let mut w = ProbeWindow { sent: xs.len() as u64 + lost, answered: xs.len() as u64, ..Default::default() };
            xs.iter().for_each(|us| w.rtt.record(Duration::from_micros(*us)));
            w
        };
        let out = impairment(latency, 0.0, 1.0);
        let mut split = merged(fill(&a, lost_a), ms(BASE));
        split.impaired.merge(&fill(&b, lost_b));
        let all: Vec<u64> = a.iter().chain(&b).copied().collect();
        let whole = merged(fill(&all, lost_a + lost_b), ms(BASE));
        prop_assert_eq!(judge(input(&out, None), Some(&split)), judge(input(&out, None), Some(&whole)));
    }

    /// The Wilson interval holds the observed ratio, stays within [0, 1] and narrows with more probes.
    #[test]
    fn wilson_intervals_are_sound(lost in 0u64..1000, extra in 0u64..1000) {
        let sent = lost + extra;
        prop_assume!(sent > 0);
        let (lo, hi) = wilson_99(lost, sent).unwrap();
        let ratio = lost as f64 / sent as f64;
        prop_assert!(0.0 <= lo && lo <= ratio + 1e-12 && ratio <= hi + 1e-12 && hi <= 1.0, "{lo} {ratio} {hi}");
        let (lo4, hi4) = wilson_99(lost * 4, sent * 4).unwrap();
        prop_assert!(hi4 - lo4 <= hi - lo + 1e-12);
    }
}
