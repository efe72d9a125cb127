use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::api::LossSpec;
use crate::topology::dataset::DatasetRegion;
use crate::topology::spec::{DEFAULT_PRIORITY, Dataset, RegionLinkSpec, RegionSpec, RoutingSpec};

fn region(name: &str) -> RegionSpec {
    RegionSpec { name: name.into(), pod_selector: None, dataset_region: None }
}

fn topology(regions: &[&str]) -> NetworkTopologySpec {
    NetworkTopologySpec {
        region_label: Some("isthmus.dev/region".into()),
        regions: regions.iter().map(|r| region(r)).collect(),
        dataset: None,
        default: None,
        intra_region: None,
        links: vec![],
        routing: None,
        priority: DEFAULT_PRIORITY,
        verify: None,
    }
}

fn latency(ms: u64) -> ImpairmentSpec {
    ImpairmentSpec { latency: Some(exact_duration(Duration::from_millis(ms))), ..Default::default() }
}

fn link(from: &str, to: &str, imp: Option<ImpairmentSpec>, rtt: Option<&str>) -> RegionLinkSpec {
    RegionLinkSpec { from: from.into(), to: to.into(), impairment: imp, round_trip: rtt.map(Into::into) }
}

fn ms(exp: &Expansion, from: &str, to: &str) -> Duration {
    let i = exp.regions.iter().position(|r| r == from).unwrap();
    let j = exp.regions.iter().position(|r| r == to).unwrap();
    exp.latency(i, j)
}

#[test]
fn a_child_per_ordered_pair_with_the_regions_selectors() {
    let mut spec = topology(&["eu", "us", "ap"]);
    spec.default = Some(latency(50));
    spec.intra_region = Some(latency(1));
    let exp = expand("world", &spec).unwrap();
    assert_eq!(exp.children.len(), 9);
    let c = exp.child(0, 1);
    assert_eq!((c.name.as_str(), c.from.as_str(), c.to.as_str()), ("world.eu.us", "eu", "us"));
    let sel = |r: &str| Some(BTreeMap::from([("isthmus.dev/region".to_owned(), r.to_owned())]));
    assert_eq!(c.spec.from.pod_selector.match_labels, sel("eu"));
    assert_eq!(c.spec.to.pod_selector.as_ref().unwrap().match_labels, sel("us"));
    assert!(c.spec.one_way && !c.spec.has_reverse());
    assert_eq!(c.spec.priority, DEFAULT_PRIORITY);
    assert_eq!(ms(&exp, "eu", "us"), Duration::from_millis(50));
    assert_eq!(ms(&exp, "ap", "ap"), Duration::from_millis(1));
    assert_eq!(exp.round_trip(0, 1), Duration::from_millis(100));
    assert_eq!(c.labels("world")[TOPOLOGY_LABEL], "world");
}

#[test]
fn without_default_pairs_are_claimed_unimpaired() {
    let exp = expand("w", &topology(&["a", "b"])).unwrap();
    assert_eq!(exp.child(0, 1).spec.impairment, Some(ImpairmentSpec::default()));
    assert_eq!(exp.round_trip(0, 1), Duration::ZERO);
}

#[test]
fn layers_override_field_by_field() {
    let mut spec = topology(&["eu", "us", "ap"]);
    spec.default = Some(ImpairmentSpec { bandwidth: Some("1Gbit".into()), ..latency(50) });
    spec.links = vec![
        link("eu", "us", None, Some("80ms")),
        link("us", "ap", Some(ImpairmentSpec { loss: Some(loss("1%")), ..Default::default() }), None),
        link("ap", "eu", Some(latency(70)), None),
        link("eu", "ap", None, Some("150ms")),
    ];
    let exp = expand("w", &spec).unwrap();
    // roundTrip is split into halves, the reverse pair takes its half where it has no link of its own.
    assert_eq!(ms(&exp, "eu", "us"), Duration::from_millis(40));
    assert_eq!(ms(&exp, "us", "eu"), Duration::from_millis(40));
    // the reverse pair's own link wins over the roundTrip's half.
    assert_eq!(ms(&exp, "eu", "ap"), Duration::from_millis(75));
    assert_eq!(ms(&exp, "ap", "eu"), Duration::from_millis(70));
    // a link that sets only loss keeps the default's latency and bandwidth.
    let us_ap = exp.child(1, 2).spec.impairment.clone().unwrap();
    assert_eq!(us_ap.latency.unwrap().0, "50ms");
    assert_eq!(us_ap.bandwidth.unwrap().0, "1Gbit");
    assert_eq!(us_ap.loss.unwrap().percent.unwrap().0, "1%");
}

fn loss(p: &str) -> LossSpec {
    LossSpec { percent: Some(p.into()), correlation: None, gilbert_elliott: None }
}

#[test]
fn the_dataset_gives_half_its_round_trip_each_way() {
    let mut spec = topology(&["eu", "us", "lab"]);
    spec.dataset = Some(Dataset::Azure);
    spec.default = Some(latency(5));
    spec.regions[0].dataset_region = Some(DatasetRegion("westeurope".into()));
    spec.regions[1].dataset_region = Some(DatasetRegion("eastus".into()));
    let exp = expand("w", &spec).unwrap();
    let table = dataset::table(Dataset::Azure);
    assert_eq!(ms(&exp, "eu", "us"), table.round_trip("westeurope", "eastus").unwrap() / 2);
    assert_eq!(ms(&exp, "us", "eu"), table.round_trip("eastus", "westeurope").unwrap() / 2);
    assert_eq!(ms(&exp, "eu", "lab"), Duration::from_millis(5), "a region outside the dataset takes the default");
}

#[test]
fn hubs_route_spokes_through_the_nearest_hub() {
    let mut spec = topology(&["hub1", "hub2", "a", "b"]);
    spec.routing = Some(RoutingSpec { hubs: vec!["hub1".into(), "hub2".into()] });
    spec.default = Some(latency(100));
    spec.links = vec![
        link("a", "hub1", Some(ImpairmentSpec { loss: Some(loss("1%")), ..latency(10) }), None),
        link(
            "hub1",
            "b",
            Some(ImpairmentSpec { loss: Some(loss("1%")), bandwidth: Some("10Mbit".into()), ..latency(20) }),
            None,
        ),
        link("a", "hub2", Some(latency(5)), None),
    ];
    let exp = expand("w", &spec).unwrap();
    assert_eq!(ms(&exp, "a", "b"), Duration::from_millis(30), "via hub1: 10 + 20, not 5 + 100 via hub2");
    let ab = exp.child(2, 3).spec.impairment.clone().unwrap();
    assert_eq!(ab.loss.unwrap().percent.unwrap().0, "1.99%");
    assert_eq!(ab.bandwidth.unwrap().0, "10Mbit");
    assert_eq!(ms(&exp, "b", "a"), Duration::from_millis(200), "b → a: two default legs");
    assert_eq!(ms(&exp, "a", "hub2"), Duration::from_millis(5), "a hub is reached directly");
}

#[test]
fn errors_name_the_field() {
    let mut spec = topology(&["h", "a", "b"]);
    spec.routing = Some(RoutingSpec { hubs: vec!["h".into()] });
    spec.links = vec![link("a", "b", Some(latency(1)), None)];
    let e = expand("w", &spec).unwrap_err();
    assert_eq!(e.field, "spec.links[0]");
    assert!(e.message.contains("spokes"), "{e}");

    spec.links = vec![link(
        "a",
        "h",
        Some(ImpairmentSpec {
            reorder: None,
            duplicate: Some(crate::api::CorrelatedSpec { percent: "1%".into(), correlation: None }),
            ..latency(1)
        }),
        None,
    )];
    let e = expand("w", &spec).unwrap_err();
    assert_eq!(e.field, "spec.routing.hubs");
    assert!(e.message.contains("duplicate") && e.message.contains("a → b goes through h"), "{e}");

    let mut spec = topology(&["a", "b"]);
    spec.links = vec![link("a", "c", Some(latency(1)), None)];
    assert_eq!(expand("w", &spec).unwrap_err().field, "spec.links[0].to");

    spec.links = vec![link("a", "b", Some(ImpairmentSpec { jitter: Some("5ms".into()), ..Default::default() }), None)];
    let e = expand("w", &spec).unwrap_err();
    assert_eq!(e.field, "spec.links[0].impairment.jitter", "{e}");
    assert!(e.message.starts_with("a → b: "), "{e}");

    assert_eq!(expand(&"x".repeat(64), &topology(&["a"])).unwrap_err().field, "metadata.name");
    let mut spec = topology(&["a"]);
    spec.regions[0].pod_selector = Some(LabelSelector::default());
    assert_eq!(expand("w", &spec).unwrap_err().field, "spec.regions[0].podSelector");
    let mut spec = topology(&["a", "a"]);
    spec.regions[1].name = "a".into();
    assert_eq!(expand("w", &spec).unwrap_err().field, "spec.regions[1].name");
}

/// A random topology: regions, some of them hubs, a default, and links among them that respect the routing.
fn arb_topology() -> impl Strategy<Value = NetworkTopologySpec> {
    (
        2usize..8,
        0usize..3,
        proptest::collection::vec((0usize..8, 0usize..8, 1u64..300, any::<bool>()), 0..20),
        1u64..200,
    )
        .prop_map(|(n, hubs, links, default)| {
            let names: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
            let mut spec = topology(&names.iter().map(String::as_str).collect::<Vec<_>>());
            let hubs: Vec<usize> = (0..hubs.min(n - 1)).collect();
            if !hubs.is_empty() {
                spec.routing = Some(RoutingSpec { hubs: hubs.iter().map(|&h| names[h].clone()).collect() });
            }
            spec.default = Some(latency(default));
            let mut seen = BTreeSet::new();
            for (a, b, ms, rtt) in links {
                let (a, b) = (a % n, b % n);
                let spokes = a != b && !hubs.is_empty() && !hubs.contains(&a) && !hubs.contains(&b);
                if spokes || !seen.insert((a, b)) {
                    continue;
                }
                let (imp, rtt) = if rtt { (None, Some(format!("{ms}ms"))) } else { (Some(latency(ms)), None) };
                spec.links.push(RegionLinkSpec {
                    from: names[a].clone(),
                    to: names[b].clone(),
                    impairment: imp,
                    round_trip: rtt.map(|r| r.as_str().into()),
                });
            }
            spec
        })
}

proptest! {
    #[test]
    fn every_ordered_pair_is_covered_exactly_once(spec in arb_topology()) {
        let exp = expand("t", &spec).unwrap();
        let n = spec.regions.len();
        let pairs: BTreeSet<(String, String)> = exp.children.iter().map(|c| (c.from.clone(), c.to.clone())).collect();
        let names: BTreeSet<&String> = exp.children.iter().map(|c| &c.name).collect();
        prop_assert_eq!(exp.children.len(), n * n);
        prop_assert_eq!(pairs.len(), n * n);
        prop_assert_eq!(names.len(), n * n);
        for c in &exp.children {
            prop_assert!(c.spec.resolve().is_ok());
        }
    }

    #[test]
    fn spoke_paths_are_the_shortest_sum_of_their_legs(spec in arb_topology()) {
        let exp = expand("t", &spec).unwrap();
        let hubs: Vec<usize> = spec.routing.iter().flat_map(|r| &r.hubs).map(|h| exp.regions.iter().position(|r| r == h).unwrap()).collect();
        let n = exp.regions.len();
        for i in 0..n {
            for j in 0..n {
                if i == j || hubs.is_empty() || hubs.contains(&i) || hubs.contains(&j) {
                    continue;
                }
                let best = hubs.iter().map(|&h| exp.latency(i, h) + exp.latency(h, j)).min().unwrap();
                prop_assert_eq!(exp.latency(i, j), best);
            }
        }
    }
}
