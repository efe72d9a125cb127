//! Builders for synthetic Kubernetes objects fed to the index, the way watch events would deliver them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use isthmus_operator::api::{ImpairmentSpec, NetworkLink, NetworkLinkSpec};
use isthmus_operator::index::{LinkInfo, ObjectKey, PodInfo, PodPhase, ServiceInfo};
use isthmus_operator::plan::Planner;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: Some(labels(pairs)), match_expressions: None }
}

/// A running pod with its own network.
pub fn pod(ns: &str, name: &str, app: &str, node: &str, ips: &[&str]) -> (ObjectKey, PodInfo) {
    (
        ObjectKey::new(ns, name),
        PodInfo {
            uid: format!("uid-{ns}-{name}"),
            labels: labels(&[("app", app)]),
            node: Some(node.into()),
            ips: ips.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect(),
            phase: PodPhase::Running,
            terminating: false,
            host_network: false,
        },
    )
}

/// A planner that knows running pods `(name, app, node, ip)` of namespace `ns`, and nothing else yet.
pub fn planner_with(pods: &[(&str, &str, &str, &str)]) -> Planner {
    let mut planner = Planner::new();
    for (name, app, node, ip) in pods {
        let (k, v) = pod("ns", name, app, node, &[ip]);
        planner.upsert_pod(k, v);
    }
    planner
}

pub fn service(ns: &str, name: &str, app: &str, ips: &[&str]) -> (ObjectKey, ServiceInfo) {
    (
        ObjectKey::new(ns, name),
        ServiceInfo {
            selector: labels(&[("app", app)]),
            cluster_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
        },
    )
}

pub fn latency(ms: u32) -> ImpairmentSpec {
    ImpairmentSpec { latency: Some(format!("{ms}ms").as_str().into()), ..Default::default() }
}

/// A link `from app=<from> → to app=<to>` with a forward latency.
pub fn spec(from: &str, to: &str, ms: u32) -> NetworkLinkSpec {
    NetworkLinkSpec::between(selector(&[("app", from)]), selector(&[("app", to)]), latency(ms))
}

pub fn link_object(ns: &str, name: &str, created_s: i64, spec: NetworkLinkSpec) -> NetworkLink {
    let mut l = NetworkLink::new(name, spec);
    l.metadata.namespace = Some(ns.into());
    l.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created_s).unwrap()));
    l.metadata.generation = Some(1);
    l
}

pub fn link(ns: &str, name: &str, created_s: i64, spec: NetworkLinkSpec) -> (ObjectKey, LinkInfo) {
    LinkInfo::from_link(&link_object(ns, name, created_s, spec))
}
