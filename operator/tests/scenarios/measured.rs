//! Verification: the agents' windows become `status.measured`, `measuredSummary`, the `Conformant` condition and
//! the operator's per-link metrics; a link with `spec.verify: false` gets none of them.

use std::time::Duration;

use isthmus_agent_api::measure::{LinkMeasurement, ProbeKind, ProbeWindow, RttHistogram};
use isthmus_agent_api::{Direction, LinkRef};
use isthmus_operator::api::measured::Probe;
use isthmus_operator::controller::status::CONFORMANT;
use isthmus_operator::controller::version::unix_millis;

use super::harness::{NS, Scenario, dispatch};
use super::{NO_RESYNC, condition, link, send_pod};

fn window(rtt: Duration, sent: u64, answered: u64) -> ProbeWindow {
    let mut h = RttHistogram::new();
    (0..answered).for_each(|_| h.record(rtt));
    ProbeWindow { sent, answered, rtt: h }
}

/// One node's last 30 s window of a link direction: `rtt` through the impairment, 0.8 ms without.
fn measurement(link: &str, direction: Direction, rtt: Duration) -> LinkMeasurement {
    let end = unix_millis();
    LinkMeasurement {
        link: LinkRef { namespace: NS.into(), name: link.into(), direction },
        probe: ProbeKind::IcmpEcho,
        pairs: 1,
        impaired: window(rtt, 300, 300),
        baseline: window(Duration::from_micros(800), 300, 300),
        window_start_ms: end - 30_000,
        window_end_ms: end,
        last_answer_ms: Some(end - 100),
        unmeasurable: None,
    }
}

#[tokio::test]
async fn measured_windows_become_status_conformance_and_metrics() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    let a2 = s.node_with_agent("n2", "10.255.0.2").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n2", "10.0.2.1").await;
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
