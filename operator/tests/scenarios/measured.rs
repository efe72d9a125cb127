//! Verification: the agents' windows become `status.measured`, `measuredSummary`, the `Conformant` condition and
//! the operator's per-link metrics; a link with `spec.verify: false` gets none of them.

use std::time::Duration;

use isthmus_agent_api::measure::{LinkMeasurement, ProbeKind, ProbeWindow, RttHistogram};
use isthmus_agent_api::{Direction, LinkRef};
use isthmus_operator::api::measured::Probe;
use isthmus_operator::controller::status::CONFORMANT;
use isthmus_operator::controller::version::unix_millis;

use super::harness::NS;
use super::{client_and_server, condition, link, send_pod};

fn window(rtt: Duration, sent: u64, answered: u64) -> ProbeWindow {
    let mut h = RttHistogram::new();
    (0..answered).for_each(|_| h.record(rtt));
    ProbeWindow { sent, answered, rtt: h }
}

/// One node's last 30 s window of a link direction: `rtt` through the impairment, 0.8 ms without.
fn measurement(link: &str, direction: Direction, rtt: Duration) -> LinkMeasurement {
    let end = unix_millis();
    within(link, direction, rtt, (end - 30_000, end))
}

/// The same over the window `[start, end)`.
fn within(link: &str, direction: Direction, rtt: Duration, (start, end): (u64, u64)) -> LinkMeasurement {
    LinkMeasurement {
        link: LinkRef { namespace: NS.into(), name: link.into(), direction },
        probe: ProbeKind::IcmpEcho,
        pairs: 1,
        impaired: window(rtt, 300, 300),
        baseline: window(Duration::from_micros(800), 300, 300),
        window_start_ms: start,
        window_end_ms: end,
        last_answer_ms: Some(end - 100),
        unmeasurable: None,
    }
}

#[tokio::test]
async fn measured_windows_become_status_conformance_and_metrics() {
    let (s, a1, a2) = client_and_server().await;
    let mut l = link("measured", "client", "server", 50);
    l.spec.symmetric = true;
    s.create(&l).await;
    // Towards another pod, so that it shares no pair with the other link.
    send_pod(&s, "db", "db", "n2", "10.0.2.2").await;
    let mut quiet = link("quiet", "client", "db", 10);
    quiet.spec.verify = Some(false);
    s.create(&quiet).await;

    // 50 ms each way on a 0.8 ms path.
    let rtt = Duration::from_micros(100_800);
    s.agents.set_measured(a1, vec![measurement("measured", Direction::Forward, rtt)]);
    s.agents.set_measured(a2, vec![measurement("measured", Direction::Reverse, rtt)]);
    let (status, reason, message) = s
        .eventually("Conformant=True", || {
            condition(&s, "measured", CONFORMANT).filter(|c| c.0 == "True" && c.1 == "Conformant")
        })
        .await;
    assert!(message.contains("forward: round trip p50") && message.contains("reverse:"), "{status} {reason} {message}");
    let st = s.api.link(&format!("{NS}/measured")).unwrap().status.unwrap();
    let forward = st.measured.as_ref().and_then(|m| m.forward.clone()).expect("forward measured");
    assert_eq!((forward.samples, forward.pairs, forward.probe), (300, 1, Some(Probe::IcmpEcho)));
    assert_eq!(forward.loss.as_deref(), Some("0%"));
    assert!(forward.expected_rtt.as_deref().is_some_and(|e| e.starts_with("100.")), "{forward:?}");
    assert!(st.measured_summary.as_deref().is_some_and(|m| m.contains("ms 0%/") && m.ends_with("ms 0%")), "{st:?}");
    let text = s.metrics.encode();
    let labels = format!(r#"{{namespace="{NS}",link="measured",direction="forward"}}"#);
    assert!(text.contains(&format!("isthmus_link_conformant{labels} 1")), "{text}");
    assert!(text.contains(&format!("isthmus_link_expected_rtt_seconds{labels} 0.1")), "{text}");

    // Verification off: neither a measurement nor a condition, nor a series; and the plan says so.
    let quiet_status = s.eventually("quiet's status", || s.api.link(&format!("{NS}/quiet"))?.status).await;
    assert!(quiet_status.measured.is_none() && quiet_status.measured_summary.is_none());
    assert!(quiet_status.conditions.iter().all(|c| c.type_ != CONFORMANT), "{quiet_status:?}");
    assert!(!text.contains(r#"link="quiet""#), "{text}");
    let plan = s.agents.in_force(a1).unwrap();
    assert_eq!(plan.unverified.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["quiet"]);

    // The forward tree disappears behind the agent's back: the baseline comes through, and at once (not a
    // window later) the link says so.
    s.agents.set_measured(a1, vec![measurement("measured", Direction::Forward, Duration::from_micros(800))]);
    let (_, reason, message) =
        s.eventually("Conformant=False", || condition(&s, "measured", CONFORMANT).filter(|c| c.0 == "False")).await;
    assert_eq!(reason, "Faster", "{message}");
    s.eventually("the series follows", || {
        s.metrics.encode().contains(&format!("isthmus_link_conformant{labels} 0")).then_some(())
    })
    .await;

    // The agents report no window any more: the link is unmeasurable, never conformant.
    s.agents.set_measured(a1, vec![]);
    s.agents.set_measured(a2, vec![]);
    let (_, reason, _) =
        s.eventually("Unmeasurable", || condition(&s, "measured", CONFORMANT).filter(|c| c.1 == "Unmeasurable")).await;
    assert_eq!(reason, "Unmeasurable");
    s.stop().await;
}

/// A link that changes with time is judged against the phase its window lies in (the agents cut windows at the
/// phases), and a window across a change is reported unjudged.
#[tokio::test]
async fn a_window_inside_a_phase_is_judged_against_that_phase() {
    let (s, a1, a2) = client_and_server().await;
    // 30 s phases, 10 ms then 100 ms each way, from an hour ago (a whole minute: every minute starts `near`).
    let now = unix_millis();
    let start = now / 60_000 * 60_000 - 3_600_000;
    let start_at = k8s_openapi::jiff::Timestamp::from_millisecond(start as i64).unwrap();
    let mut l = link("phased", "client", "server", 50);
    l.spec.symmetric = true;
    l.spec.schedule = Some(
        serde_yaml::from_str(&format!(
            "{{startAt: '{start_at}', phases: [{{name: near, duration: 30s, impairment: {{latency: 10ms}}}}, \
             {{name: far, duration: 30s, impairment: {{latency: 100ms}}}}]}}"
        ))
        .unwrap(),
    );
    s.create(&l).await;

    // The latest `far` phase begun, as the agents cut it: a second in, a second and its 100 ms out before its end.
    let far = now / 60_000 * 60_000 + 30_000 - if now % 60_000 < 30_000 { 60_000 } else { 0 };
    let bounds = (far + 1_000, far + 30_000 - 1_100);
    let rtt = Duration::from_micros(200_800);
    s.agents.set_measured(a1, vec![within("phased", Direction::Forward, rtt, bounds)]);
    s.agents.set_measured(a2, vec![within("phased", Direction::Reverse, rtt, bounds)]);
    s.eventually("Conformant=True", || {
        condition(&s, "phased", CONFORMANT).filter(|c| c.0 == "True" && c.1 == "Conformant")
    })
    .await;
    let st = s.api.link(&format!("{NS}/phased")).unwrap().status.unwrap();
    let forward = st.measured.as_ref().and_then(|m| m.forward.clone()).expect("forward measured");
    assert_eq!(forward.phase.as_deref(), Some("far"), "{forward:?}");
    assert!(forward.expected_rtt.as_deref().is_some_and(|e| e.starts_with("200.")), "{forward:?}");

    // A window across the latest change of phase (recent, so that it is not stale): shown, not judged.
    let change = now / 30_000 * 30_000;
    let across = (change - 10_000, change + 10_000);
    s.agents.set_measured(a1, vec![within("phased", Direction::Forward, rtt, across)]);
    s.agents.set_measured(a2, vec![within("phased", Direction::Reverse, rtt, across)]);
    let (status, _, message) =
        s.eventually("Scheduled", || condition(&s, "phased", CONFORMANT).filter(|c| c.1 == "Scheduled")).await;
    assert_eq!(status, "False", "{message}");
    assert!(message.contains("does not lie in one phase"), "{message}");
    s.stop().await;
}
