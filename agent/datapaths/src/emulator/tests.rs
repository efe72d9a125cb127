//! The whole emulator driven like its shell will drive it: packets pushed at their arrival times, popped at
//! every wake-up it asks for. Properties hold for any impairment: nothing is created or lost unaccounted, no
//! packet leaves before its delay, order holds where nothing may reorder, the rate is never exceeded, the
//! queue stays within its bound.

use std::time::Duration;

use isthmus_agent_api::{Correlated as CorrelatedSpec, ImpairmentFields, Loss, Percent, Reorder};
use proptest::prelude::*;

use super::*;

const MS: u64 = 1_000_000;

fn percent(p: f64) -> Percent {
    Percent::new("p", p).unwrap()
}

/// A packet: its number three times (a corrupted bit changes one copy at most), then padding to its length.
fn packet(n: u16, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(6)];
    for copy in p[..6].chunks_mut(2) {
        copy.copy_from_slice(&n.to_be_bytes());
    }
    p
}

/// The packet's number: the value at least two of its copies agree on.
fn number(p: &[u8]) -> u16 {
    let copies: Vec<u16> = p[..6].chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    if copies[0] == copies[1] || copies[0] == copies[2] { copies[0] } else { copies[1] }
}

/// Pushes `arrivals` (time, length) in order and pops at every wake-up; (time, packet) of each departure.
fn run(e: &mut Emulator<Vec<u8>>, arrivals: &[(u64, usize)]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut now = 0;
    loop {
        while i < arrivals.len() && arrivals[i].0 <= now {
            e.push(packet(i as u16, arrivals[i].1), now);
            i += 1;
        }
        while let Some(p) = e.pop(now) {
            out.push((now, p));
        }
        let next_arrival = arrivals.get(i).map(|a| a.0);
        now = match (e.next_wakeup(now), next_arrival) {
            (Some(w), Some(a)) => w.min(a),
            (Some(w), None) => w,
            (None, Some(a)) => a,
            (None, None) => return out,
        }
        .max(now + 1);
    }
}

fn emulator(fields: ImpairmentFields, bound_bytes: u64) -> Emulator<Vec<u8>> {
    let imp = Impairment::try_from(fields).expect("a valid impairment");
    let budget = crate::datapath::QueueBudget::new(bound_bytes, 64 << 20).unwrap();
    Emulator::new(&imp, budget.bound(1), 7, 0)
}

fn impairment() -> impl Strategy<Value = ImpairmentFields> {
    let ms = |max: u64| (0..=max).prop_map(Duration::from_millis);
    (
        ms(50),
        prop::option::of(ms(20)),
        prop::option::of(0.0..30.0f64),
        prop::option::of(0.0..20.0f64),
        prop::option::of(0.0..20.0f64),
        prop::option::of((1.0..50.0f64, 1u32..5)),
        prop::option::of(100_000u64..100_000_000),
    )
        .prop_map(|(latency, jitter, loss, duplicate, corrupt, reorder, rate)| {
            let latency = if reorder.is_some() { latency.max(Duration::from_millis(1)) } else { latency };
            ImpairmentFields {
                latency: Some(latency),
                jitter: jitter.filter(|j| *j <= latency),
                loss: loss.map(|p| Loss::Random(CorrelatedSpec { percent: percent(p), correlation: Percent::ZERO })),
                duplicate: duplicate.map(|p| CorrelatedSpec { percent: percent(p), correlation: Percent::ZERO }),
                corrupt: corrupt.map(|p| CorrelatedSpec { percent: percent(p), correlation: Percent::ZERO }),
                reorder: reorder.map(|(p, gap)| Reorder { percent: percent(p), correlation: Percent::ZERO, gap }),
                rate_bps: rate,
                ..Default::default()
            }
        })
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, usize)>> {
    prop::collection::vec((0u64..5 * MS, 64usize..=1514), 1..200).prop_map(|mut v| {
        let mut t = 0;
        for a in &mut v {
            t += a.0 / 10;
            a.0 = t;
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn packets_are_accounted_for_and_none_leaves_early(fields in impairment(), arrivals in arrivals()) {
        let mut e = emulator(fields.clone(), 16 << 20);
        let out = run(&mut e, &arrivals);
        let c = e.counters();
        prop_assert_eq!((c.backlog_packets, c.backlog_bytes), (0, 0), "everything left in the end");
        prop_assert_eq!(c.packets as usize, out.len());
        let duplicates = out.len() as i64 + c.drops as i64 - arrivals.len() as i64;
        prop_assert!(duplicates >= 0, "more packets vanished than were dropped");
        if fields.duplicate.is_none() {
            prop_assert_eq!(duplicates, 0, "packets appeared from nowhere");
        }
        let latency = fields.latency.unwrap_or_default().as_nanos() as u64;
        let jitter = fields.jitter.unwrap_or_default().as_nanos() as u64;
        for (t, p) in &out {
            let arrived = arrivals[number(p) as usize].0;
            let reordered = fields.reorder.is_some();
            if !reordered {
                prop_assert!(*t >= arrived + latency.saturating_sub(jitter), "left at {} before its delay", t);
            }
        }
    }

    #[test]
    fn order_holds_without_jitter_reordering_or_duplication(latency in 0u64..50, rate in prop::option::of(100_000u64..10_000_000), arrivals in arrivals()) {
        let fields = ImpairmentFields {
            latency: Some(Duration::from_millis(latency)),
            rate_bps: rate,
            ..Default::default()
        };
        let mut e = emulator(fields, 16 << 20);
        let out = run(&mut e, &arrivals);
        let numbers: Vec<u16> = out.iter().map(|(_, p)| number(p)).collect();
        prop_assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{:?}", numbers);
    }

    #[test]
    fn the_rate_is_never_exceeded(rate in 100_000u64..100_000_000, latency in 0u64..20, arrivals in arrivals()) {
        let fields = ImpairmentFields {
            latency: Some(Duration::from_millis(latency)),
            rate_bps: Some(rate),
            ..Default::default()
        };
        let burst = crate::datapath::units::burst_bytes(&fields);
        let mut e = emulator(fields, 16 << 20);
        let out = run(&mut e, &arrivals);
        let Some(first) = out.first().map(|(t, _)| *t) else { return Ok(()) };
        let mut bytes = 0u64;
        for (t, p) in &out {
            bytes += p.len() as u64;
            let allowed = burst + 1514 + ((t - first) as u128 * rate as u128 / 8 / 1_000_000_000) as u64;
            prop_assert!(bytes <= allowed, "{} bytes by {} > {}", bytes, t, allowed);
        }
    }

    #[test]
    fn the_queue_stays_within_its_bound(bound_frames in 1u64..20, arrivals in arrivals()) {
        let fields = ImpairmentFields { latency: Some(Duration::from_secs(3600)), ..Default::default() };
        let mut e = emulator(fields, bound_frames * 1514);
        for (i, (t, len)) in arrivals.iter().enumerate() {
            e.push(packet(i as u16, *len), *t);
            prop_assert!(e.counters().backlog_packets <= bound_frames);
        }
    }
}

#[test]
fn a_rate_alone_queues_bytes_up_to_the_bound_and_paces() {
    let fields = ImpairmentFields { rate_bps: Some(8_000_000), ..Default::default() };
    let mut e = emulator(fields, 10 * 1514);
    let verdicts: Vec<PushOutcome> = (0..20).map(|i| e.push(packet(i, 1514), 0)).collect();
    assert_eq!(verdicts.iter().filter(|v| **v == PushOutcome::Queued).count(), 10, "ten frames fit the bound");
    assert_eq!(verdicts[10], PushOutcome::Dropped(DropCause::QueueFull));
    let out = run(&mut e, &[]);
    assert_eq!(out.len(), 10);
    // 1 MB/s: after the burst, one 1514-byte frame every 1.514 ms.
    let last_two: Vec<u64> = out.iter().rev().take(2).map(|(t, _)| *t).collect();
    let spacing = last_two[0] - last_two[1];
    assert!((1_500_000..=1_530_000).contains(&spacing), "{spacing}");
}

#[test]
fn loss_and_duplication_rates_match_their_settings() {
    let fields = ImpairmentFields {
        latency: Some(Duration::from_millis(1)),
        loss: Some(Loss::Random(CorrelatedSpec { percent: percent(5.0), correlation: Percent::ZERO })),
        duplicate: Some(CorrelatedSpec { percent: percent(10.0), correlation: Percent::ZERO }),
        ..Default::default()
    };
    let mut e = emulator(fields, 1 << 30);
    let n = 50_000;
    let mut counts = std::collections::BTreeMap::new();
    for i in 0..n {
        *counts.entry(format!("{:?}", e.push(packet(i as u16, 100), i * 1000))).or_insert(0) += 1;
        while e.pop(i * 1000).is_some() {}
    }
    let share = |k: &str| f64::from(*counts.get(k).unwrap_or(&0)) / n as f64;
    // netem draws duplication first, then loss, which cancels one copy: a duplicated packet that is then
    // "lost" is sent once. Net: lost = p_loss · (1 − p_dup); duplicated = p_dup · (1 − p_loss) (its copy too
    // may be lost, rarely).
    assert!((share("Dropped(Lost)") - 0.05 * 0.9).abs() < 0.005, "{counts:?}");
    let duplicated = share("Duplicated") + share("CopyDropped(Lost)");
    assert!((duplicated - 0.1 * 0.95).abs() < 0.006, "{counts:?}");
}
