//! `kubectl isthmus links`: one row per NetworkLink — what it asks for, what its probes measured, whether that
//! conforms, and how many of its pairs the agents applied. Built from the objects alone, so it is pure.

use isthmus_operator::api::measured::DirectionMeasured;
use isthmus_operator::api::{NetworkLink, NetworkLinkStatus, StoredLink, Summary};
use kube::ResourceExt;

use crate::table::Table;

/// What one row says, cell by cell, before layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRow {
    pub namespace: String,
    pub name: String,
    /// Latency (± jitter), forward then reverse after a slash.
    pub latency: String,
    pub loss: String,
    pub bandwidth: String,
    pub expected_rtt: String,
    /// Measured RTT p50 and p90, forward then reverse.
    pub measured_rtt: String,
    pub measured_loss: String,
    /// `True`, `False (Slower)`, … or `-` before the operator judged the link.
    pub conformant: String,
    /// `applied/total`.
    pub pairs: String,
}

const NONE: &str = "-";

impl LinkRow {
    /// A stored link; one the operator's types cannot read gets a row that names the field (the operator
    /// applies nothing for it either).
    pub fn from_stored(stored: &StoredLink) -> Self {
        match &stored.decoded {
            Ok(link) => Self::from_link(link),
            Err(e) => {
                let configured = Err(format!("unreadable: {}", e.path));
                let (ns, name) = (stored.metadata.namespace.clone(), stored.metadata.name.clone());
                Self::row(ns.unwrap_or_default(), name.unwrap_or_default(), configured, stored.status.clone())
            }
        }
    }

    pub fn from_link(link: &NetworkLink) -> Self {
        // The spec resolved by the operator's own code: what the link asks for now, even before the operator
        // has written a status for this generation. An invalid spec says which field.
        let namespace = link.namespace().unwrap_or_default();
        let configured = link.spec.resolve().map(|r| r.summary()).map_err(|e| format!("invalid: {}", e.field));
        Self::row(namespace, link.name_any(), configured, link.status.clone())
    }

    fn row(
        namespace: String,
        name: String,
        configured: Result<Summary, String>,
        status: Option<NetworkLinkStatus>,
    ) -> Self {
        let status = status.unwrap_or_default();
        let (latency, loss, bandwidth, expected_rtt) = match configured {
            Ok(s) => (s.latency, s.loss, s.bandwidth, s.expected_round_trip),
            Err(e) => (e, NONE.into(), NONE.into(), NONE.into()),
        };
        let measured = status.measured.unwrap_or_default();
        let sides = [measured.forward.as_ref(), measured.reverse.as_ref()];
        let with_reverse = measured.reverse.is_some();
        let per_direction = |f: &dyn Fn(&DirectionMeasured) -> Option<String>| -> String {
            let cell = |d: Option<&DirectionMeasured>| d.and_then(f).unwrap_or_else(|| NONE.into());
            if with_reverse { format!("{} / {}", cell(sides[0]), cell(sides[1])) } else { cell(sides[0]) }
        };
        let measured_rtt = per_direction(&|d| match (&d.rtt_p50, &d.rtt_p90) {
            (Some(p50), Some(p90)) => Some(format!("{p50} (p90 {p90})")),
            (Some(p50), None) => Some(p50.clone()),
            _ => None,
        });
        let measured_loss = per_direction(&|d| d.loss.clone());
        let conformant = match status.conditions.iter().find(|c| c.type_ == "Conformant") {
            None => NONE.into(),
            Some(c) if c.status == "True" => "True".into(),
            Some(c) if c.reason.is_empty() => c.status.clone(),
            Some(c) => format!("{} ({})", c.status, c.reason),
        };
        LinkRow {
            namespace,
            name,
            latency,
            loss,
            bandwidth,
            expected_rtt,
            measured_rtt,
            measured_loss,
            conformant,
            pairs: format!("{}/{}", status.pairs_applied, status.pairs),
        }
    }
}

/// The table, sorted by namespace and name; the NAMESPACE column only when the rows span namespaces
/// (`-A`), as `kubectl get` does.
pub fn render(mut rows: Vec<LinkRow>, all_namespaces: bool) -> String {
    if rows.is_empty() {
        return "No NetworkLinks found.\n".into();
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut header = vec![
        "NAME",
        "LATENCY",
        "LOSS",
        "BANDWIDTH",
        "EXPECTED-RTT",
        "MEASURED-RTT",
        "MEASURED-LOSS",
        "CONFORMANT",
        "PAIRS",
    ];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut table = Table::new(header);
    for r in rows {
        let mut cells = vec![
            r.name,
            r.latency,
            r.loss,
            r.bandwidth,
            r.expected_rtt,
            r.measured_rtt,
            r.measured_loss,
            r.conformant,
            r.pairs,
        ];
        if all_namespaces {
            cells.insert(0, r.namespace);
        }
        table.push(cells);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use isthmus_operator::api::NetworkLinkSpec;
    use isthmus_operator::api::measured::MeasuredStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn link(ns: &str, name: &str, spec: serde_json::Value, status: Option<NetworkLinkStatus>) -> NetworkLink {
        let spec: NetworkLinkSpec = serde_json::from_value(spec).expect("a valid spec");
        let mut l = NetworkLink::new(name, spec);
        l.metadata.namespace = Some(ns.into());
        l.status = status;
        l
    }

    fn condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: "Conformant".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn measured(p50: &str, p90: &str, loss: &str) -> DirectionMeasured {
        DirectionMeasured {
            rtt_p50: Some(p50.into()),
            rtt_p90: Some(p90.into()),
            loss: Some(loss.into()),
            samples: 600,
            ..Default::default()
        }
    }

    fn fixtures() -> Vec<LinkRow> {
        let symmetric = link(
            "regions",
            "frankfurt-tokyo",
            serde_json::json!({
                "from": {"podSelector": {"matchLabels": {"region": "frankfurt"}}},
                "to": {"podSelector": {"matchLabels": {"region": "tokyo"}}},
                "symmetric": true,
                "impairment": {"latency": "120ms", "jitter": "5ms", "loss": {"percent": "0.1%"}},
            }),
            Some(NetworkLinkStatus {
                pairs: 4,
                pairs_applied: 4,
                conditions: vec![condition("True", "Conformant")],
                measured: Some(MeasuredStatus {
                    forward: Some(measured("240.6ms", "248.1ms", "0.2%")),
                    reverse: Some(measured("240.9ms", "247.7ms", "0.1%")),
                }),
                ..Default::default()
            }),
        );
        let slow = link(
            "regions",
            "lte-uplink",
            serde_json::json!({
                "from": {"podSelector": {"matchLabels": {"app": "phone"}}},
                "to": {"podSelector": {"matchLabels": {"app": "api"}}},
                "impairment": {"latency": "40ms", "bandwidth": "10Mbit"},
            }),
            Some(NetworkLinkStatus {
                pairs: 3,
                pairs_applied: 2,
                conditions: vec![condition("False", "Slower")],
                measured: Some(MeasuredStatus { forward: Some(measured("95ms", "140ms", "0%")), reverse: None }),
                ..Default::default()
            }),
        );
        // Just created: no status yet, so nothing measured and nothing judged.
        let fresh = link(
            "batch",
            "partition",
            serde_json::json!({
                "from": {"podSelector": {"matchLabels": {"app": "a"}}},
                "to": {"podSelector": {"matchLabels": {"app": "b"}}},
                "impairment": {"loss": {"percent": "100%"}},
            }),
            None,
        );
        [symmetric, slow, fresh].iter().map(LinkRow::from_link).collect()
    }

    #[test]
    fn all_namespaces_golden_table() {
        let expected = "\
NAMESPACE   NAME              LATENCY               LOSS        BANDWIDTH   EXPECTED-RTT                      MEASURED-RTT                                    MEASURED-LOSS   CONFORMANT       PAIRS
batch       partition         0                     100%        -           0 (return path not impaired)      -                                               -               -                0/0
regions     frankfurt-tokyo   120ms±5ms/120ms±5ms   0.1%/0.1%   -/-         240ms ± 10ms                      240.6ms (p90 248.1ms) / 240.9ms (p90 247.7ms)   0.2% / 0.1%     True             4/4
regions     lte-uplink        40ms                  0%          10Mbit      40ms (return path not impaired)   95ms (p90 140ms)                                0%              False (Slower)   2/3
";
        assert_eq!(render(fixtures(), true), expected);
    }

    #[test]
    fn one_namespace_drops_the_namespace_column() {
        let rows: Vec<LinkRow> = fixtures().into_iter().filter(|r| r.namespace == "regions").collect();
        let out = render(rows, false);
        assert!(out.starts_with("NAME              LATENCY"), "{out}");
        assert!(!out.contains("regions"), "{out}");
        assert_eq!(out.lines().count(), 3);
    }

    #[test]
    fn an_empty_list_says_so() {
        assert_eq!(render(Vec::new(), false), "No NetworkLinks found.\n");
    }

    #[test]
    fn an_invalid_spec_names_its_field() {
        let bad = link(
            "ns",
            "bad",
            serde_json::json!({
                "from": {"podSelector": {}},
                "to": {"podSelector": {}},
                "impairment": {"latency": "fast"},
            }),
            None,
        );
        let row = LinkRow::from_link(&bad);
        assert!(row.latency.starts_with("invalid: spec.impairment.latency"), "{}", row.latency);
    }

    #[test]
    fn an_unreadable_link_keeps_its_row_and_names_the_field() {
        let value = serde_json::json!({
            "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink",
            "metadata": {"name": "old", "namespace": "ns"},
            "spec": {"from": {"podSelector": {}}, "to": {"podSelector": {}}, "priority": 99999999999_i64},
            "status": {"pairs": 2, "pairsApplied": 0},
        });
        let row = LinkRow::from_stored(&StoredLink::from_value(value).unwrap());
        assert_eq!((row.namespace.as_str(), row.name.as_str(), row.pairs.as_str()), ("ns", "old", "0/2"));
        assert_eq!(row.latency, "unreadable: spec.priority");
    }
}
