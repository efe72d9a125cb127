use isthmus_agent_api::Direction;
use proptest::prelude::*;

use super::*;

const SECOND: u64 = 1_000;

fn link(name: &str) -> Arc<LinkRef> {
    Arc::new(LinkRef { namespace: "ns".into(), name: name.into(), direction: Direction::Forward })
}

fn probed(link: &Arc<LinkRef>, pairs: u32, drops_everything: bool) -> Probed {
    Probed { link: link.clone(), pairs, drops_everything, one_way: Duration::ZERO, timeline: None }
}

fn windows(links: &[(&Arc<LinkRef>, bool)]) -> Windows {
    let mut w = Windows::new(Duration::from_secs(10));
    w.set_links(links.iter().map(|(l, drops)| probed(l, 2, *drops)));
    w
}

const GRACE: Duration = Duration::from_secs(1);

#[test]
fn a_probe_counts_in_the_window_it_was_sent_in_and_windows_close_after_the_grace() {
    let wan = link("wan");
    let mut w = windows(&[(&wan, false)]);
    let t0 = 1_000_000 * SECOND;
    w.sent(&wan, ProbePath::Impaired, t0 + 9_900);
    w.sent(&wan, ProbePath::Baseline, t0 + 9_950);
    // Answered after the window's end: still the first window's.
    w.answered(&wan, ProbePath::Impaired, t0 + 9_900, Duration::from_millis(300), t0 + 10_200);
    w.sent(&wan, ProbePath::Impaired, t0 + 10_100);
    assert!(!w.close(t0 + 10_500, GRACE), "not before end + grace");
    assert!(w.measurements().is_empty(), "nothing complete yet");
    assert!(w.close(t0 + 11_000, GRACE));
    let m = w.measurements();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].window_start_ms, m[0].window_end_ms), (t0, t0 + 10_000));
    assert_eq!((m[0].impaired.sent, m[0].impaired.answered, m[0].baseline.sent), (1, 1, 1));
    assert_eq!(m[0].last_answer_ms, Some(t0 + 10_200));
    assert_eq!((m[0].probe, m[0].pairs, &m[0].unmeasurable), (ProbeKind::IcmpEcho, 2, &None));
    // The next window's only probe went unanswered over ICMP: withheld (TCP gets a window first), and windows
    // with nothing sent for the link keep the last one.
    w.close(t0 + 40_000, GRACE);
    assert_eq!(w.measurements()[0].window_start_ms, t0);
    assert_eq!(w.kind(&wan), ProbeKind::TcpSyn);
    // Answers for closed windows are ignored.
    w.answered(&wan, ProbePath::Impaired, t0 + 10_100, Duration::from_millis(1), t0 + 40_000);
    w.sent(&wan, ProbePath::Impaired, t0 + 50_000);
    w.close(t0 + 70_000, GRACE);
    let m = w.measurements();
    assert_eq!((m[0].window_start_ms, m[0].probe, m[0].impaired.answered), (t0 + 50_000, ProbeKind::TcpSyn, 0));
}

#[test]
fn duplicates_never_count_more_answers_than_probes() {
    let wan = link("wan");
    let mut w = windows(&[(&wan, false)]);
    w.sent(&wan, ProbePath::Impaired, 5);
    for _ in 0..3 {
        w.answered(&wan, ProbePath::Impaired, 5, Duration::from_millis(1), 6);
    }
    w.close(20 * SECOND, GRACE);
    assert_eq!(w.measurements()[0].impaired.answered, 1);
}

#[test]
fn silence_falls_back_to_tcp_then_reports_no_answer_and_a_lossy_link_never_falls_back() {
    let (quiet, dead) = (link("quiet"), link("dead"));
    let mut w = windows(&[(&quiet, false), (&dead, true)]);
    let mut at = 0;
    let mut window = |w: &mut Windows, answer: bool| {
        for l in [&quiet, &dead] {
            w.sent(l, ProbePath::Impaired, at);
            if answer {
                w.answered(l, ProbePath::Impaired, at, Duration::from_millis(1), at + 1);
            }
        }
        at += 10 * SECOND;
        w.close(at + GRACE.as_millis() as u64, GRACE);
    };
    window(&mut w, false);
    assert_eq!(w.kind(&quiet), ProbeKind::TcpSyn, "no ICMP answer: TCP next");
    assert_eq!(w.kind(&dead), ProbeKind::IcmpEcho, "100 % loss configured: its silence is the answer");
    let m = w.measurements();
    assert_eq!(
        m.iter().map(|m| m.link.name.as_str()).collect::<Vec<_>>(),
        ["dead"],
        "a silent ICMP window is not a measurement"
    );
    assert_eq!((m[0].impaired.sent, m[0].impaired.answered, &m[0].unmeasurable), (1, 0, &None));
    window(&mut w, false);
    let quiet_m = w.measurements().into_iter().find(|m| m.link.name == "quiet").unwrap();
    assert_eq!(quiet_m.probe, ProbeKind::TcpSyn);
    assert_eq!(quiet_m.unmeasurable.as_ref().map(|u| u.reason), Some(UnmeasurableReason::NoAnswer));
    assert_eq!(w.kind(&quiet), ProbeKind::IcmpEcho, "tries ICMP again");
    window(&mut w, true);
    let quiet_m = w.measurements().into_iter().find(|m| m.link.name == "quiet").unwrap();
    assert_eq!((quiet_m.probe, quiet_m.unmeasurable), (ProbeKind::IcmpEcho, None));
}

#[test]
fn a_socket_failure_is_unmeasurable_until_probes_go_out_and_links_leave_with_the_plan() {
    let (wan, other) = (link("wan"), link("other"));
    let mut w = windows(&[(&wan, false), (&other, false)]);
    w.failed(&wan, "socket: permission denied".into());
    let m = w.measurements();
    assert_eq!(m.len(), 1);
    let u = m[0].unmeasurable.as_ref().unwrap();
    assert_eq!((u.reason, u.message.as_str()), (UnmeasurableReason::ProbeFailed, "socket: permission denied"));
    w.sent(&other, ProbePath::Impaired, 0);
    w.answered(&other, ProbePath::Impaired, 0, Duration::from_millis(1), 1);
    w.set_links([probed(&other, 1, false)]);
    w.close(20 * SECOND, GRACE);
    let m = w.measurements();
    assert_eq!(m.iter().map(|m| (m.link.name.as_str(), m.pairs)).collect::<Vec<_>>(), [("other", 1)]);
    w.set_links([]);
    assert!(w.measurements().is_empty());
}

/// Counts the probes of the link's last complete window once per window: the test closes windows one at a time,
/// as the agent's tick does, since two windows closing in one call leave only the later one to be seen.
fn observe(w: &Windows, last_start: &mut Option<u64>, seen: &mut u64) -> Result<(), TestCaseError> {
    if let Some(m) = w.measurements().first()
        && Some(m.window_start_ms) != *last_start
    {
        *last_start = Some(m.window_start_ms);
        prop_assert_eq!(m.window_end_ms - m.window_start_ms, 10 * SECOND);
        prop_assert!(m.impaired.answered <= m.impaired.sent);
        *seen += m.impaired.sent;
    }
    Ok(())
}

proptest! {
    #[test]
    fn every_probe_lands_in_exactly_one_window(sends in proptest::collection::vec((0u64..100_000, any::<bool>()), 0..200)) {
        let wan = link("wan");
        let mut w = windows(&[(&wan, false)]);
        let mut sends = sends;
        sends.sort();
        let (mut seen, mut last_start) = (0u64, None);
        let grace_ms = GRACE.as_millis() as u64;
        // Windows with probes in them, not yet closed, oldest first; each closes at its own end + grace.
        let mut open: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        for (at, answer) in &sends {
            while let Some(&start) = open.front() && start + 10 * SECOND + grace_ms <= *at {
                w.close(start + 10 * SECOND + grace_ms, GRACE);
                observe(&w, &mut last_start, &mut seen)?;
                open.pop_front();
            }
            w.sent(&wan, ProbePath::Impaired, *at);
            if *answer {
                w.answered(&wan, ProbePath::Impaired, *at, Duration::from_millis(2), *at + 2);
            }
            let start = w.window_of(&wan, *at).expect("a link without a schedule counts every probe").0;
            if open.back() != Some(&start) {
                open.push_back(start);
            }
        }
        for start in open {
            w.close(start + 10 * SECOND + grace_ms, GRACE);
            observe(&w, &mut last_start, &mut seen)?;
        }
        let sent = sends.len() as u64;
        let answered = sends.iter().filter(|(_, answer)| *answer).count() as u64;
        // Windows with only unanswered ICMP are withheld, so the total seen is at most what was sent; with every
        // probe answered it is exactly that.
        prop_assert!(seen <= sent);
        if answered == sent {
            prop_assert_eq!(seen, sent);
        }
    }
}

mod phases {
    use isthmus_agent_api::schedule::{End, Phase, TimelineFields};
    use isthmus_agent_api::test_util::impairment;
    use isthmus_agent_api::{Correlated, ImpairmentFields, Loss, Percent};

    use super::*;

    const START: u64 = 1_000_000 * SECOND;

    fn phase(name: &str, fields: ImpairmentFields) -> Phase {
        Phase { duration_ms: 20 * SECOND, impairment: Arc::new(impairment(fields)), name: name.into() }
    }

    /// 20 s phases from START, repeating: `near` at 10 ms, `far` at 200 ms, `down` dropping everything.
    fn timeline() -> Arc<Timeline> {
        let latency = |ms| ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() };
        let all = Percent::new("loss", 100.0).unwrap();
        let down = ImpairmentFields {
            loss: Some(Loss::Random(Correlated { percent: all, correlation: Percent::ZERO })),
            ..Default::default()
        };
        let fields = TimelineFields {
            start_unix_ms: START,
            phases: vec![phase("near", latency(10)), phase("far", latency(200)), phase("down", down)],
            end: End::Repeat,
            jitter: None,
        };
        Arc::new(Timeline::try_from(fields).unwrap())
    }

    fn scheduled(link: &Arc<LinkRef>) -> Windows {
        let mut w = Windows::new(Duration::from_secs(30));
        let one_way = Duration::from_millis(5);
        w.set_links([Probed { timeline: Some(timeline()), one_way, ..probed(link, 1, false) }]);
        w
    }

    #[test]
    fn windows_are_cut_at_phases_less_the_settling_time_and_the_latency_out() {
        let wan = link("wan");
        let w = scheduled(&wan);
        let settle = PHASE_SETTLE.as_millis() as u64;
        let bounds = |at| w.window_of(&wan, at);
        // START is 10 s past an epoch window's start. Before it: that window, ending a settling time and the
        // link's own 5 ms out before the first phase.
        assert_eq!(bounds(START - 10 * SECOND), Some((START - 10 * SECOND, START - settle - 5)));
        assert_eq!(bounds(START - settle - 5), None, "too near the first phase");
        // `near`: from a settling time in to a settling time and its 10 ms out before `far`.
        assert_eq!(bounds(START), None);
        assert_eq!(bounds(START + settle - 1), None);
        assert_eq!(bounds(START + settle), Some((START + settle, START + 20 * SECOND - settle - 10)));
        assert_eq!(bounds(START + 20 * SECOND - settle - 10), None);
        // `far` ends 200 ms earlier still.
        let far = START + 20 * SECOND;
        assert_eq!(bounds(far + 5 * SECOND), Some((far + settle, far + 20 * SECOND - settle - 200)));
        // An epoch window's end cuts `down` in two.
        let (down, epoch) = (START + 40 * SECOND, START + 50 * SECOND);
        assert_eq!(bounds(down + settle), Some((down + settle, epoch)));
        assert_eq!(bounds(epoch), Some((epoch, down + 20 * SECOND - settle)));
        // The next cycle's `near` has windows of its own.
        let next = START + 60 * SECOND;
        assert_eq!(bounds(next + 5 * SECOND).map(|b| b.0), Some(next + settle));
    }

    #[test]
    fn a_phase_that_drops_everything_reports_its_loss_and_keeps_icmp() {
        let wan = link("wan");
        let mut w = scheduled(&wan);
        let (down, near) = (START + 40 * SECOND, START + 60 * SECOND);
        for at in [down + 2 * SECOND, down + 3 * SECOND] {
            w.sent(&wan, ProbePath::Impaired, at);
        }
        // Sent in the settling time: not counted anywhere.
        w.sent(&wan, ProbePath::Impaired, down + 100);
        w.close(START + 51 * SECOND + GRACE.as_millis() as u64, GRACE);
        let m = w.measurements();
        assert_eq!((m[0].window_start_ms, m[0].window_end_ms), (down + SECOND, START + 50 * SECOND));
        assert_eq!((m[0].impaired.sent, m[0].impaired.answered), (2, 0));
        assert_eq!(w.kind(&wan), ProbeKind::IcmpEcho, "the phase drops everything: its silence is the answer");
        // The same silence in `near` is a reason to try TCP.
        w.sent(&wan, ProbePath::Impaired, near + 2 * SECOND);
        w.close(near + 20 * SECOND, GRACE);
        assert_eq!(w.kind(&wan), ProbeKind::TcpSyn);
        // An answer finds its window from the send time alone.
        w.sent(&wan, ProbePath::Impaired, near + 25 * SECOND);
        w.answered(&wan, ProbePath::Impaired, near + 25 * SECOND, Duration::from_millis(20), near + 25 * SECOND + 20);
        w.close(near + 40 * SECOND, GRACE);
        let m = w.measurements();
        assert_eq!((m[0].window_start_ms, m[0].impaired.answered), (near + 20 * SECOND + SECOND, 1));
    }

    proptest! {
        /// Whatever the instant and the window length, a counted probe's window holds it, lies in one phase
        /// instance and keeps the settling time from both of its changes.
        #[test]
        fn a_counted_probe_has_a_window_inside_one_phase(at in START - 30 * SECOND..START + 200 * SECOND, length_s in 1u64..100) {
            let t = timeline();
            let settle = PHASE_SETTLE.as_millis() as u64;
            if let Some((from, to)) = window_bounds(length_s * SECOND, Some((&t, Duration::from_millis(5))), at) {
                prop_assert!(from <= at && at < to && to - from <= length_s * SECOND);
                let (first, last) = (t.position(from), t.position(to - 1));
                prop_assert_eq!(first, last);
                match first {
                    Position::In { since_ms, next_ms, .. } => {
                        prop_assert!(from >= since_ms + settle);
                        prop_assert!(to + settle <= next_ms.unwrap());
                    }
                    Position::Before { next_ms } => prop_assert!(to + settle <= next_ms),
                    Position::Over { .. } => prop_assert!(false, "the timeline repeats"),
                }
            }
        }
    }
}
