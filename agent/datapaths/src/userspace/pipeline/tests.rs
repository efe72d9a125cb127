//! The pipeline driven as its shell drives it: frames pushed at their arrival, popped at every wake-up it asks
//! for.

use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::{Correlated, ImpairmentFields, Percent};
use proptest::prelude::*;

use super::super::sys::Outgoing;
use super::*;

const MS: u64 = 1_000_000;

fn imp(fields: ImpairmentFields) -> Arc<Impairment> {
    Arc::new(Impairment::try_from(fields).expect("a valid impairment"))
}

fn latency(ms: u64) -> Arc<Impairment> {
    imp(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() })
}

/// An IPv4 packet of `len` bytes (at least 28) to `to`, numbered `n` in its payload.
fn v4(to: [u8; 4], n: u16, len: usize) -> Frame {
    let mut b = vec![0u8; len.max(28)];
    b[0] = 0x45;
    b[16..20].copy_from_slice(&to);
    b[20..22].copy_from_slice(&n.to_be_bytes());
    Frame::parse(b).expect("well formed")
}

fn number(f: &Frame) -> u16 {
    u16::from_be_bytes([f.bytes()[20], f.bytes()[21]])
}

fn pipeline(destinations: &[(IpNet, Arc<Impairment>)], seed: u64) -> PodPipeline {
    let bound = crate::datapath::QueueBudget::default().bound(destinations.len());
    PodPipeline::new(destinations.iter().map(|(n, i)| (n, i.as_ref())), bound, seed, 0)
}

/// A node budget no test of the pipeline's timing reaches.
fn unbounded() -> NodeBudget {
    NodeBudget::new(u64::MAX)
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Pushes (time, frame) in order, pops at every wake-up; (time, frame) of each departure.
fn run(p: &mut PodPipeline, arrivals: Vec<(u64, Frame)>) -> Vec<(u64, Frame)> {
    let mut out = Vec::new();
    let mut due = Vec::new();
    let mut arrivals = arrivals.into_iter().peekable();
    let mut now = 0;
    loop {
        while let Some((_, f)) = arrivals.next_if(|(t, _)| *t <= now) {
            if let Pushed::PassThrough(f) = p.push(f, now, &mut unbounded()) {
                out.push((now, f));
            }
        }
        p.pop_due(now, &mut due, &mut unbounded());
        out.extend(due.drain(..).map(|f| (now, f)));
        now = match (p.next_wakeup(), arrivals.peek().map(|(t, _)| *t)) {
            (Some(w), Some(a)) => w.min(a),
            (Some(w), None) => w,
            (None, Some(a)) => a,
            (None, None) => return out,
        }
        .max(now + 1);
    }
}

#[test]
fn parses_the_destination_of_either_family_and_refuses_the_rest() {
    assert_eq!(v4([10, 0, 0, 9], 0, 40).destination(), "10.0.0.9".parse::<IpAddr>().unwrap());
    let mut six = vec![0u8; 48];
    six[0] = 0x60;
    six[24..40].copy_from_slice(&"fd00::7".parse::<Ipv6Addr>().unwrap().octets());
    assert_eq!(Frame::parse(six).unwrap().destination(), "fd00::7".parse::<IpAddr>().unwrap());
    for bad in [vec![], vec![0x45; 10], vec![0x44; 40], vec![0x60; 39], vec![0x20; 60]] {
        assert_eq!(Frame::parse(bad.clone()), Err(bad), "the bytes go back to the pool");
    }
}

#[test]
fn the_longest_prefix_takes_the_packet_and_others_pass_through() {
    let mut p = pipeline(&[(net("10.0.0.0/8"), latency(50)), (net("10.1.2.3/32"), latency(5))], 1);
    let out = run(
        &mut p,
        vec![(0, v4([10, 1, 2, 3], 1, 40)), (0, v4([10, 9, 9, 9], 2, 40)), (0, v4([192, 168, 0, 1], 3, 40))],
    );
    let at: Vec<(u64, u16)> = out.iter().map(|(t, f)| (*t, number(f))).collect();
    assert_eq!(at, vec![(0, 3), (5 * MS, 1), (50 * MS, 2)]);
}

#[test]
fn a_flip_the_receiver_would_refuse_drops_the_packet() {
    let corrupt = imp(ImpairmentFields {
        corrupt: Some(Correlated { percent: Percent::new("corrupt", 100.0).unwrap(), correlation: Percent::ZERO }),
        ..Default::default()
    });
    let mut p = pipeline(&[(net("10.0.0.0/8"), corrupt)], 3);
    let n = 2_000u16;
    let out = run(&mut p, (0..n).map(|i| (u64::from(i), v4([10, 0, 0, 1], i, 40))).collect());
    // Every frame has one bit flipped. Of its 54 bytes (14 Ethernet, 20 IPv4 header, 20 payload), 8 of the
    // Ethernet header's (destination MAC, EtherType) and the 20 of the IPv4 header doom it: 28/54.
    assert_eq!(out.len() as u64 + p.doomed(), u64::from(n));
    let share = p.doomed() as f64 / f64::from(n);
    let sigma = (28.0 / 54.0 * (26.0 / 54.0) / f64::from(n)).sqrt();
    assert!((share - 28.0 / 54.0).abs() < 4.5 * sigma, "{share} of the frames doomed, want 28/54");
}

fn scenario() -> impl Strategy<Value = (Vec<u64>, Vec<(u64, u8, usize)>)> {
    (prop::collection::vec(0u64..40, 1..6), prop::collection::vec((0u64..20 * MS, 0u8..8, 28usize..1500), 0..200))
        .prop_map(|(latencies, mut arrivals)| {
            arrivals.sort_by_key(|a| a.0);
            (latencies, arrivals)
        })
}

proptest! {
    /// With latency alone: every packet leaves, exactly once, no earlier than its destination's delay and in
    /// arrival order per destination; addresses no destination holds pass at once; the timer heap is empty at
    /// the end (stale wake-ups do not pile up).
    #[test]
    fn latency_alone_delays_every_packet_exactly((latencies, arrivals) in scenario()) {
        // destinations 10.0.i.0/24 for i < latencies.len(); address 10.0.k.1 with k up to 7, so some pass
        let dests: Vec<(IpNet, Arc<Impairment>)> = latencies
            .iter()
            .enumerate()
            .map(|(i, ms)| (net(&format!("10.0.{i}.0/24")), latency(*ms)))
            .collect();
        let mut p = pipeline(&dests, 9);
        let frames: Vec<(u64, Frame)> =
            arrivals.iter().enumerate().map(|(n, (t, k, len))| (*t, v4([10, 0, *k, 1], n as u16, *len))).collect();
        let out = run(&mut p, frames);
        prop_assert_eq!(out.len(), arrivals.len());
        let mut seen = vec![false; arrivals.len()];
        let mut last_per_destination = std::collections::HashMap::new();
        for (t, f) in &out {
            let n = usize::from(number(f));
            prop_assert!(!seen[n], "packet {} left twice", n);
            seen[n] = true;
            let (arrived, k, _) = arrivals[n];
            let delay = latencies.get(usize::from(k)).map_or(0, |ms| ms * MS);
            prop_assert_eq!(*t, arrived + delay, "packet {} to 10.0.{}.1", n, k);
            if let Some(prev) = last_per_destination.insert(k, n) {
                prop_assert!(prev < n, "packets to 10.0.{}.1 reordered", k);
            }
        }
        prop_assert!(p.wakeups.is_empty());
    }
}

#[test]
fn the_captures_own_link_chatter_is_stray_and_other_unlisted_unicast_passes() {
    let mut p = pipeline(&[(net("10.0.0.0/24"), latency(10))], 1);
    for to in [[224, 0, 0, 22], [255, 255, 255, 255], [169, 254, 1, 1], [0, 0, 0, 0]] {
        assert_eq!(p.push(v4(to, 0, 64), 0, &mut unbounded()), Pushed::Stray, "{to:?}");
    }
    assert!(matches!(p.push(v4([10, 0, 1, 1], 0, 64), 0, &mut unbounded()), Pushed::PassThrough(_)));
    for to in ["ff02::16", "ff02::1:ff00:1", "fe80::1", "::"] {
        let to: std::net::Ipv6Addr = to.parse().unwrap();
        assert!(!beyond_the_link(IpAddr::V6(to)), "{to}");
    }
    assert!(beyond_the_link("fd77::2".parse().unwrap()) && beyond_the_link("2001:db8::1".parse().unwrap()));
}

fn rate(bps: u64) -> Arc<Impairment> {
    imp(ImpairmentFields { rate_bps: Some(bps), ..Default::default() })
}

/// Pops at every wake-up from `now` on until nothing is left: (time, frame) of each departure.
fn drain(p: &mut PodPipeline, mut now: u64) -> Vec<(u64, Frame)> {
    let (mut out, mut due) = (Vec::new(), Vec::new());
    loop {
        p.pop_due(now, &mut due, &mut unbounded());
        out.extend(due.drain(..).map(|f| (now, f)));
        match p.next_wakeup() {
            Some(w) => now = w.max(now + 1),
            None => return out,
        }
    }
}

#[test]
fn an_edit_paces_what_is_already_queued_at_the_new_rate_through_one_bucket() {
    let dst = net("10.0.0.2/32");
    let mut old = pipeline(&[(dst, rate(8_000_000))], 1);
    for n in 0..20 {
        old.push(v4([10, 0, 0, 2], n, 986), 0, &mut unbounded());
    }
    let mut new = pipeline(&[(dst, rate(1_000_000))], 1);
    let edit = 2 * MS;
    let mut early = Vec::new();
    old.pop_due(edit, &mut early, &mut unbounded());
    assert!(new.take_over(old, edit).is_none(), "nothing of the old pipeline is left to drain beside the new one");
    let out = drain(&mut new, edit);
    assert_eq!(early.len() + out.len(), 20, "every queued packet leaves once");
    let numbers: Vec<u16> = early.iter().chain(out.iter().map(|(_, f)| f)).map(number).collect();
    assert_eq!(numbers, (0..20).collect::<Vec<_>>(), "in their order");
    // 1000-byte frames (986 + the link header) at 1 Mbit/s: 8 ms apart once the new bucket's burst is spent
    let gaps: Vec<u64> = out.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(gaps.iter().rev().take(10).all(|&g| g >= 8 * MS - MS / 100), "paced at the new rate: {gaps:?}");
    let c = new.counters().next().unwrap().1;
    assert_eq!((c.packets, c.backlog_packets, c.backlog_bytes), (20, 0, 0), "the counters carry on: {c:?}");
}

#[test]
fn delayed_packets_keep_their_departure_after_an_edit_and_new_ones_follow_the_new_delay() {
    let dst = net("10.0.0.2/32");
    let mut old = pipeline(&[(dst, latency(100))], 1);
    old.push(v4([10, 0, 0, 2], 1, 100), 0, &mut unbounded());
    let mut new = pipeline(&[(dst, latency(10))], 1);
    assert!(new.take_over(old, 50 * MS).is_none());
    new.push(v4([10, 0, 0, 2], 2, 100), 60 * MS, &mut unbounded());
    let out: Vec<(u64, u16)> = drain(&mut new, 50 * MS).into_iter().map(|(t, f)| (t, number(&f))).collect();
    assert_eq!(out, vec![(70 * MS, 2), (100 * MS, 1)]);
}

#[test]
fn a_destination_gone_or_changed_in_kind_drains_on_its_own_schedule() {
    let (x, y) = (net("10.0.0.2/32"), net("10.0.0.3/32"));
    for replacement in [vec![(y, latency(10))], vec![(x, rate(1_000_000))]] {
        let mut old = pipeline(&[(x, latency(100))], 1);
        old.push(v4([10, 0, 0, 2], 7, 100), 0, &mut unbounded());
        let mut new = pipeline(&replacement, 1);
        let mut rest = new.take_over(old, 10 * MS).expect("the old queue drains apart");
        assert_eq!(new.next_wakeup(), None, "{replacement:?}: the new pipeline holds nothing of it");
        let out: Vec<(u64, u16)> = drain(&mut rest, 10 * MS).into_iter().map(|(t, f)| (t, number(&f))).collect();
        assert_eq!(out, vec![(100 * MS, 7)], "{replacement:?}");
    }
}

/// One step of a node's pods: a packet from pod `pod` to 10.0.0.`k`, an edit of pod `pod`'s destinations, or time
/// passing.
#[derive(Debug, Clone)]
enum Step {
    Packet { pod: usize, k: u8, len: usize },
    Edit { pod: usize },
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..3, 1u8..4, 28usize..1500).prop_map(|(pod, k, len)| Step::Packet { pod, k, len }),
        1 => (0usize..3).prop_map(|pod| Step::Edit { pod }),
        2 => (0u64..5 * MS).prop_map(Step::Wait),
    ]
}

/// A pod's destinations, in one of two versions: an edit switches between them, so that one destination keeps
/// its queue (changed delay), one changes kind (its queue drains apart) and one goes.
fn version(edited: bool) -> Vec<(IpNet, Arc<Impairment>)> {
    let twice = Correlated { percent: Percent::new("duplicate", 50.0).unwrap(), correlation: Percent::ZERO };
    let duplicating = |ms| imp(ImpairmentFields { duplicate: Some(twice), ..latency(ms).fields().clone() });
    if edited {
        vec![(net("10.0.0.1/32"), duplicating(3)), (net("10.0.0.2/32"), latency(2))]
    } else {
        vec![
            (net("10.0.0.1/32"), duplicating(8)),
            (net("10.0.0.2/32"), rate(1_000_000)),
            (net("10.0.0.3/32"), latency(4)),
        ]
    }
}

/// The pods of one node as the loop keeps them: each its pipeline and the ones still draining after an edit.
struct NodePods {
    pods: Vec<(PodPipeline, Vec<PodPipeline>, bool)>,
}

impl NodePods {
    fn held(&self) -> u64 {
        self.pods.iter().map(|(p, draining, _)| p.held() + draining.iter().map(PodPipeline::held).sum::<u64>()).sum()
    }

    fn pop_due(&mut self, now: u64, node: &mut NodeBudget) -> usize {
        let mut due = Vec::new();
        for (p, draining, _) in &mut self.pods {
            p.pop_due(now, &mut due, node);
            for old in draining.iter_mut() {
                old.pop_due(now, &mut due, node);
            }
            draining.retain(|old| old.next_wakeup().is_some());
        }
        due.len()
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.pods
            .iter()
            .flat_map(|(p, draining, _)| std::iter::once(p).chain(draining))
            .filter_map(|p| p.next_wakeup())
            .min()
    }
}

proptest! {
    /// Every pod's pipeline and every draining one queue against one node budget: what the budget holds is
    /// exactly what the pipelines hold, at most the limit plus one duplicate's copy, every packet refused for it is
    /// counted, and nothing is held once everything has left.
    #[test]
    fn the_node_budget_holds_exactly_what_every_pipeline_holds(
        limit in 2_000u64..60_000,
        steps in prop::collection::vec(step(), 1..300),
    ) {
        let mut node = NodeBudget::new(limit);
        let mut pods = NodePods { pods: (0..3).map(|i| (pipeline(&version(false), i), Vec::new(), false)).collect() };
        let (mut now, mut refused, mut largest) = (0u64, 0u64, 0u64);
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Step::Packet { pod, k, len } => {
                    let pushed = pods.pods[pod].0.push(v4([10, 0, 0, k], n as u16, len), now, &mut node);
                    refused += u64::from(pushed == Pushed::OverBudget);
                    // A packet is admitted only while the budget has room for it, so only a copy made with it
                    // goes over: by at most the largest packet's cost.
                    largest = largest.max(super::budget::cost(len + LINK_HEADER));
                    prop_assert!(node.held() <= limit + largest, "{} held of {}", node.held(), limit);
                }
                Step::Edit { pod } => {
                    let (current, draining, edited) = &mut pods.pods[pod];
                    *edited = !*edited;
                    let old = std::mem::replace(current, pipeline(&version(*edited), pod as u64));
                    draining.extend(current.take_over(old, now));
                }
                Step::Wait(d) => {
                    now += d;
                    pods.pop_due(now, &mut node);
                }
            }
            prop_assert_eq!(node.held(), pods.held(), "after step {} ({:?})", n, step);
        }
        prop_assert_eq!(node.drops(), refused);
        while let Some(at) = pods.next_wakeup() {
            now = at.max(now);
            pods.pop_due(now, &mut node);
            now += 1;
        }
        prop_assert_eq!((node.held(), pods.held()), (0, 0));
    }
}
