//! The indexes the benchmarks plan over, shared by `plan.rs` and `control.rs` so that both measure the same
//! worlds.

use std::collections::BTreeMap;

use isthmus_operator::api::{ImpairmentSpec, NetworkLink, NetworkLinkSpec};
use isthmus_operator::index::{Index, LinkInfo, ObjectKey, PodInfo, PodPhase, ServiceInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: Some(labels(pairs)), match_expressions: None }
}

/// A running dual-stack pod numbered `n` (its addresses follow from it) on `node-<node>`.
pub fn pod(ns: &str, name: &str, app: &str, node: usize, n: u32) -> (ObjectKey, PodInfo) {
    (
        ObjectKey::new(ns, name),
        PodInfo {
            uid: format!("{ns}-{name}-uid"),
            labels: labels(&[("app", app)]),
            node: Some(format!("node-{node:02}")),
            ips: vec![
                format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255).parse().unwrap(),
                format!("fd00::{n:x}").parse().unwrap(),
            ],
            phase: PodPhase::Running,
            terminating: false,
            host_network: false,
        },
    )
}

pub fn link(ns: &str, name: &str, from: LabelSelector, to: LabelSelector) -> (ObjectKey, LinkInfo) {
    let impairment = ImpairmentSpec {
        latency: Some("40ms".into()),
        jitter: Some("2ms".into()),
        bandwidth: Some("100Mbit".into()),
        ..Default::default()
    };
    let spec = NetworkLinkSpec::between(from, to, impairment);
    let mut l = NetworkLink::new(name, spec);
    l.metadata.namespace = Some(ns.into());
    l.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()));
    LinkInfo::from_link(&l)
}

/// The shape of [`apps`]: 10 namespaces of 10 apps, `pods_per_app` pods each, spread round-robin over `nodes`.
pub struct Apps {
    pub pods_per_app: u32,
    pub nodes: usize,
    pub dual_stack: bool,
}

/// 10 namespaces × 10 apps of `pods_per_app` pods; each app has a Service, and each namespace 10 links
/// `app-j → app-(j+1)`: 100 links.
pub fn apps(shape: &Apps) -> Index {
    let mut index = Index::default();
    let mut n = 0;
    for ns_i in 0..10 {
        let ns = format!("ns-{ns_i}");
        index.namespaces.insert(ns.clone(), labels(&[("kubernetes.io/metadata.name", &ns)]));
        for app_i in 0..10 {
            let app = format!("app-{app_i}");
            for pod_i in 0..shape.pods_per_app {
                n += 1;
                let (k, mut v) = pod(&ns, &format!("{app}-{pod_i}"), &app, (n as usize) % shape.nodes, n);
                if !shape.dual_stack {
                    v.ips.truncate(1);
                }
                index.pods.insert(k, v);
            }
            index.services.insert(
                ObjectKey::new(&ns, &app),
                ServiceInfo {
                    selector: labels(&[("app", &app)]),
                    cluster_ips: vec![format!("10.96.{ns_i}.{app_i}").parse().unwrap()],
                },
            );
            let to = format!("app-{}", (app_i + 1) % 10);
            let (k, v) = link(&ns, &format!("link-{app_i}"), selector(&[("app", &app)]), selector(&[("app", &to)]));
            index.links.insert(k, v);
        }
    }
    index
}

/// 1,000 dual-stack pods on 20 nodes, 100 links (issue 5's scale).
pub fn thousand_pods_hundred_links() -> Index {
    apps(&Apps { pods_per_app: 10, nodes: 20, dual_stack: true })
}

/// 10,000 single-stack pods on 100 nodes (100 pods per node, about the kubelet's default most), 100 links of
/// 100 sources × 101 destinations (the next app's pods and its ClusterIP): 1,010,000 pairs, within the default
/// total of 2,000,000.
pub fn ten_thousand_pods_hundred_links() -> Index {
    apps(&Apps { pods_per_app: 100, nodes: 100, dual_stack: false })
}
