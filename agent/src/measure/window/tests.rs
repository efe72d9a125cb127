use isthmus_agent_api::Direction;
use proptest::prelude::*;

use super::*;

const SECOND: u64 = 1_000;

fn link(name: &str) -> Arc<LinkRef> {
    Arc::new(LinkRef { namespace: "ns".into(), name: name.into(), direction: Direction::Forward })
}

fn windows(links: &[(&Arc<LinkRef>, bool)]) -> Windows {
    let mut w = Windows::new(Duration::from_secs(10));
    w.set_links(links.iter().map(|(l, drops)| ((*l).clone(), 2, *drops)));
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
    w.set_links([(other.clone(), 1, false)]);
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
            if open.back() != Some(&w.window_of(*at)) {
                open.push_back(w.window_of(*at));
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
