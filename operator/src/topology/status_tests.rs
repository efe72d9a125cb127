use super::*;
use crate::api::measured::{DirectionMeasured, MeasuredStatus};
use crate::topology::spec::{DEFAULT_PRIORITY, NetworkTopologySpec, RegionSpec};

fn expansion() -> Expansion {
    let spec = NetworkTopologySpec {
        region_label: Some("r".into()),
        regions: ["eu", "us"].map(|n| RegionSpec { name: n.into(), pod_selector: None, dataset_region: None }).to_vec(),
        dataset: None,
        default: Some(crate::api::ImpairmentSpec { latency: Some("40ms".into()), ..Default::default() }),
        intra_region: None,
        links: vec![],
        routing: None,
        priority: DEFAULT_PRIORITY,
        verify: None,
    };
    crate::topology::expand("w", &spec).unwrap()
}

fn child(ready: bool, sources: u32, rtt: Option<&str>) -> ChildState {
    let cond = Condition {
        type_: READY.into(),
        status: if ready { "True" } else { "False" }.into(),
        reason: if ready { "Applied" } else { "Failed" }.into(),
        message: "m".into(),
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    };
    let measured = rtt.map(|r| MeasuredStatus {
        forward: Some(DirectionMeasured { rtt_p50: Some(r.into()), ..Default::default() }),
        reverse: None,
    });
    let status = NetworkLinkStatus {
        observed_generation: Some(1),
        conditions: vec![cond],
        source_pods: sources,
        pairs_applied: if ready { 2 } else { 0 },
        pairs_failed: if ready { 0 } else { 2 },
        measured,
        ..Default::default()
    };
    ChildState { in_sync: true, status: Some(status), generation: Some(1) }
}

fn status_of(
    children: &BTreeMap<String, ChildState>,
    taken: &[String],
    refused: &[(String, String)],
) -> NetworkTopologyStatus {
    let exp = expansion();
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
    topology_status(&StatusInput {
        generation: Some(2),
        expansion: Ok(&exp),
        children,
        taken,
        refused,
        previous: None,
        now: &now,
    })
}

fn reason(s: &NetworkTopologyStatus) -> (&str, &str) {
    (s.conditions[0].status.as_str(), s.conditions[0].reason.as_str())
}

#[test]
fn ready_when_every_link_is_with_counts_and_the_matrix() {
    let mut children = BTreeMap::new();
    children.insert("w.eu.eu".into(), child(true, 3, Some("0.4ms")));
    children.insert("w.eu.us".into(), child(true, 3, Some("80.9ms")));
    children.insert("w.us.eu".into(), child(true, 2, None));
    children.insert("w.us.us".into(), child(true, 2, None));
    let s = status_of(&children, &[], &[]);
    assert_eq!(reason(&s), ("True", "Applied"));
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.summary.as_deref(), Some("2 regions, 5 pods"));
    assert_eq!((s.links, s.links_ready, s.pairs_applied, s.pairs_failed), (4, 4, 8, 0));
    assert_eq!(s.matrix[0].configured, ["0", "80ms"]);
    assert_eq!(s.matrix[0].measured, ["0.4ms", "80.9ms"]);
    assert_eq!(s.matrix[1].measured, ["-", "-"]);
    assert_eq!(cell_duration("80.9ms"), Some(std::time::Duration::from_micros(80_900)));
    assert_eq!(cell_duration("-"), None);
}

#[test]
fn not_ready_says_which_link_and_why() {
    let mut children = BTreeMap::new();
    for name in ["w.eu.eu", "w.us.eu", "w.us.us"] {
        children.insert(name.into(), child(true, 1, None));
    }
    let s = status_of(&children, &[], &[]);
    assert_eq!(reason(&s), ("False", "Pending"));
    assert!(s.conditions[0].message.contains("1 of 4 links still to write"), "{:?}", s.conditions[0]);
    children.insert("w.eu.us".into(), child(false, 1, None));
    let s = status_of(&children, &[], &[]);
    assert_eq!(reason(&s), ("False", "LinksNotReady"));
    assert!(s.conditions[0].message.contains("w.eu.us: Failed: m"), "{:?}", s.conditions[0]);
    children.get_mut("w.eu.us").unwrap().generation = Some(2);
    children.get_mut("w.eu.us").unwrap().status.as_mut().unwrap().pairs_failed = 0;
    let s = status_of(&children, &[], &[]);
    assert_eq!(reason(&s), ("False", "Pending"), "a status of an older generation is not Ready");
    let s = status_of(&children, &["w.eu.us".into()], &[]);
    assert_eq!(reason(&s), ("False", "NameTaken"));
    let s = status_of(&children, &[], &[("w.eu.us".into(), "denied".into())]);
    assert_eq!(reason(&s), ("False", "LinkRefused"));
    assert!(s.conditions[0].message.contains("w.eu.us: denied"));
}

#[test]
fn an_invalid_spec_names_the_field_and_keeps_transition_times() {
    let err = TopologyError { field: "spec.links[0]".into(), message: "no".into() };
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
    let none = BTreeMap::new();
    let input = |previous| StatusInput {
        generation: Some(3),
        expansion: Err(&err),
        children: &none,
        taken: &[],
        refused: &[],
        previous,
        now: &now,
    };
    let s = topology_status(&input(None));
    assert_eq!(reason(&s), ("False", "InvalidSpec"));
    assert_eq!(s.conditions[0].message, "spec.links[0]: no");
    let mut earlier = s.clone();
    earlier.conditions[0].last_transition_time = Time(k8s_openapi::jiff::Timestamp::from_second(7).unwrap());
    let again = topology_status(&input(Some(&earlier)));
    assert_eq!(again.conditions[0].last_transition_time, earlier.conditions[0].last_transition_time);
}
