//! The chart's Grafana dashboard queries only metrics that exist: every metric name in its PromQL is one the
//! agent's or the operator's real registry holds. prometheus-client leaves families without series out of its
//! exposition, so the names come from two places: the exposition's `# TYPE` lines (typed: a histogram's
//! `_bucket`/`_sum`/`_count`, a counter's `_total`) and the registries' descriptors as their `Debug` form shows
//! them (every registered name, with any of those suffixes). The dashboard is `charts/isthmus/dashboards/isthmus-links.json`, or the file named by
//! `ISTHMUS_DASHBOARD_JSON` (chart-lint passes the copy it extracted from the rendered ConfigMap).

use std::collections::BTreeSet;

use isthmus_operator::metrics::LinkLabels;
use prometheus_client::metrics::counter::Counter;
use regex::Regex;

/// Every sample name a text exposition can hold, from its `# TYPE` lines.
fn sample_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
        let suffixes: &[&str] = match kind {
            "histogram" => &["_bucket", "_sum", "_count"],
            "counter" => &["_total"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// Every name a registry's `Debug` form shows in a descriptor, with each suffix a sample of it may carry (names
/// registered at the root: a sub-registry's descriptors show without its prefix).
fn registered_names(debug: &str) -> BTreeSet<String> {
    let descriptor = Regex::new(r#"Descriptor \{ name: "([a-zA-Z0-9_:]+)""#).unwrap();
    descriptor
        .captures_iter(debug)
        .flat_map(|c| ["", "_total", "_bucket", "_sum", "_count"].map(|s| format!("{}{s}", &c[1])))
        .collect()
}

/// Every `isthmus_…` name the dashboard's queries and variables use.
fn dashboard_names(json: &serde_json::Value) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    walk(json, &mut queries);
    let name = Regex::new(r"\bisthmus_[a-z0-9_]+").unwrap();
    queries.iter().flat_map(|q| name.find_iter(q).map(|m| m.as_str().to_owned()).collect::<Vec<_>>()).collect()
}

#[test]
fn every_metric_the_dashboard_queries_is_registered() {
    let path = std::env::var("ISTHMUS_DASHBOARD_JSON")
        .unwrap_or_else(|_| format!("{}/../charts/isthmus/dashboards/isthmus-links.json", env!("CARGO_MANIFEST_DIR")));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let used = dashboard_names(&dashboard);
    assert!(used.len() >= 5, "the dashboard queries too few metrics to be the links dashboard: {used:?}");

    // The operator's link families get a series each, so that its exposition names them with their types.
    let operator = isthmus_operator::metrics::Metrics::new();
    let link = LinkLabels { namespace: "ns".into(), link: "l".into(), direction: "forward".into() };
    operator.link_verdict(&link, std::time::Duration::from_millis(1), 0.0, Some(true));
    operator.agent_call("n", std::time::Duration::from_millis(1), None);
    let agent = isthmus_agent::metrics::Metrics::new();
    let mut registered = sample_names(&operator.encode());
    registered.extend(sample_names(&agent.encode()));
    registered.extend(registered_names(&format!("{agent:?}")));
    assert!(registered.contains("isthmus_operator_agent_calls_total"), "the operator's names are read: {registered:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !registered.contains(*n)).collect();
    assert!(missing.is_empty(), "{path} queries metrics nobody registers: {missing:?}");
}

#[test]
fn the_name_check_refuses_an_unknown_metric() {
    let registered =
        sample_names("# TYPE isthmus_link_rtt_seconds histogram\n# TYPE isthmus_link_probes_sent counter\n");
    let dashboard = serde_json::json!({"panels": [{"targets": [
        {"expr": "rate(isthmus_link_probes_sent_total[5m]) / isthmus_link_rtt_seconds_count"},
        {"expr": "isthmus_link_rtt_second_bucket"},
    ]}]});
    let used = dashboard_names(&dashboard);
    let missing: Vec<&String> = used.iter().filter(|n| !registered.contains(*n)).collect();
    assert_eq!(missing, ["isthmus_link_rtt_second_bucket"]);
    // A family without series is left out of the exposition; its descriptor still counts.
    let mut registry = prometheus_client::registry::Registry::default();
    let family = prometheus_client::metrics::family::Family::<LinkLabels, Counter>::default();
    registry.register("isthmus_link_probes_lost", "Probes lost", family);
    let exposition = {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    };
    assert!(!sample_names(&exposition).contains("isthmus_link_probes_lost_total"), "{exposition}");
    let names = registered_names(&format!("{registry:?}"));
    assert!(names.contains("isthmus_link_probes_lost_total"), "{names:?}");
    assert!(!names.contains("isthmus_link_probes_lost_ratio"));
}
