//! The operator's Prometheus metrics.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use isthmus_agent_api::metrics_auth::Outcome;

use crate::failure::CallErrorKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentErrorLabels {
    pub node: String,
    pub kind: CallErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionOutcomeLabels {
    /// `AdmissionOutcome::as_str`. The label keeps its released name, `verdict`: dashboards and alerts match it.
    pub verdict: &'static str,
}

/// One direction of one NetworkLink: bounded by the links, never per pod or IP.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LinkLabels {
    pub namespace: String,
    pub link: String,
    pub direction: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub reconcile_duration: Histogram,
    pub pairs: Gauge,
    pub links: Gauge,
    pub nodes: Gauge,
    pub agent_calls: Family<NodeLabels, Counter>,
    pub agent_call_errors: Family<AgentErrorLabels, Counter>,
    pub agent_call_duration: Histogram,
    pub status_patches: Family<ResultLabels, Counter>,
    pub gate_patches: Family<ResultLabels, Counter>,
    pub leader: Gauge,
    pub admission_reviews: Family<AdmissionOutcomeLabels, Counter>,
    /// Requests to the HTTPS metrics listener by what their bearer token got (`crate::metrics_https`).
    pub metrics_auth: Family<OutcomeLabels, Counter>,
    /// What each verified link's configuration predicts for a probe's round trip, without the path's baseline.
    pub link_expected_rtt: Family<LinkLabels, FloatGauge>,
    pub link_expected_loss: Family<LinkLabels, FloatGauge>,
    /// 1 conformant, 0 not; absent while unmeasured.
    pub link_conformant: Family<LinkLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("isthmus_operator");
        let m = Metrics {
            reconciles: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            pairs: Gauge::default(),
            links: Gauge::default(),
            nodes: Gauge::default(),
            agent_calls: Family::default(),
            agent_call_errors: Family::default(),
            agent_call_duration: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            status_patches: Family::default(),
            gate_patches: Family::default(),
            leader: Gauge::default(),
            admission_reviews: Family::default(),
            metrics_auth: Family::default(),
            link_expected_rtt: Family::default(),
            link_expected_loss: Family::default(),
            link_conformant: Family::default(),
            registry: Registry::default(),
        };
        registry.register("reconciles", "Plan recomputations after a batch of watch events", m.reconciles.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Time to apply a batch of events and recompute the affected plans",
            m.reconcile_duration.clone(),
        );
        registry.register("pairs", "(source pod, destination) pairs in all node plans", m.pairs.clone());
        registry.register("links", "NetworkLinks in the index", m.links.clone());
        registry.register("nodes", "Nodes with a non-empty plan", m.nodes.clone());
        registry.register("agent_calls", "Plan deliveries attempted, by node", m.agent_calls.clone());
        registry.register(
            "agent_call_errors",
            "Failed plan deliveries, by node and kind (connect, timeout, tls, forbidden, status, ...)",
            m.agent_call_errors.clone(),
        );
        registry.register("agent_call_duration_seconds", "Time of one plan delivery", m.agent_call_duration.clone());
        registry.register("status_patches", "NetworkLink status writes, by result", m.status_patches.clone());
        registry.register(
            "gate_patches",
            "Pod readiness gate condition writes, by result (ok, gone, error)",
            m.gate_patches.clone(),
        );
        registry.register("leader", "1 while this replica holds the leader lease", m.leader.clone());
        registry.register(
            "admission_reviews",
            "NetworkTopology admission reviews this replica answered, by verdict (admitted, refused, unreadable)",
            m.admission_reviews.clone(),
        );
        for outcome in Outcome::ALL {
            let _ = m.metrics_auth.get_or_create(&OutcomeLabels { outcome: outcome.as_str() });
        }
        registry.register(
            "metrics_auth",
            "Requests to the HTTPS metrics listener by outcome of their bearer token: allowed, unauthenticated \
             (401), forbidden (403), error (503: the TokenReview or SubjectAccessReview failed)",
            m.metrics_auth.clone(),
        );
        // Per link, beside the agents' isthmus_link_rtt_seconds and probe counters, so that a dashboard puts
        // configured and measured side by side under one prefix.
        let links = root.sub_registry_with_prefix("isthmus_link");
        links.register(
            "expected_rtt_seconds",
            "Round trip the link's configuration adds to a probe (latency out and back plus serialization), without the path's baseline",
            m.link_expected_rtt.clone(),
        );
        links.register(
            "expected_loss_ratio",
            "Share of probes the link's configuration loses on the round trip (mean loss and corruption, both directions)",
            m.link_expected_loss.clone(),
        );
        links.register(
            "conformant",
            "1 when the link direction's measured RTT and loss are within tolerance, 0 when not; absent while unmeasured",
            m.link_conformant.clone(),
        );
        Metrics { registry: root, ..m }
    }

    pub fn agent_call(&self, node: &str, took: Duration, error: Option<CallErrorKind>) {
        self.agent_calls.get_or_create(&NodeLabels { node: node.to_owned() }).inc();
        self.agent_call_duration.observe(took.as_secs_f64());
        if let Some(kind) = error {
            self.agent_call_errors.get_or_create(&AgentErrorLabels { node: node.to_owned(), kind }).inc();
        }
    }

    pub fn count_metrics_auth(&self, outcome: Outcome) {
        self.metrics_auth.get_or_create(&OutcomeLabels { outcome: outcome.as_str() }).inc();
    }

    pub fn status_patch(&self, ok: bool) {
        self.status_patches.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" }.into() }).inc();
    }

    /// A readiness gate write: `ok`, `gone` (the pod was deleted or replaced) or `error`.
    pub fn gate_patch(&self, result: &str) {
        self.gate_patches.get_or_create(&ResultLabels { result: result.into() }).inc();
    }

    /// One link direction's expectations and verdict (`None`: unmeasured, so no conformance series).
    pub fn link_verdict(
        &self,
        labels: &LinkLabels,
        expected_rtt: Duration,
        expected_loss: f64,
        conformant: Option<bool>,
    ) {
        self.link_expected_rtt.get_or_create(labels).set(expected_rtt.as_secs_f64());
        self.link_expected_loss.get_or_create(labels).set(expected_loss);
        match conformant {
            Some(c) => {
                self.link_conformant.get_or_create(labels).set(i64::from(c));
            }
            None => {
                self.link_conformant.remove(labels);
            }
        }
    }

    /// Forgets a link direction (the link is gone or no longer verified).
    pub fn forget_link(&self, labels: &LinkLabels) {
        self.link_expected_rtt.remove(labels);
        self.link_expected_loss.remove(labels);
        self.link_conformant.remove(labels);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_errors_are_labelled_by_node_and_kind() {
        let m = Metrics::new();
        m.agent_call("n1", Duration::from_millis(3), Some(CallErrorKind::Connect));
        m.agent_call("n1", Duration::from_millis(3), None);
        let text = m.encode();
        assert!(text.contains(r#"isthmus_operator_agent_call_errors_total{node="n1",kind="connect"} 1"#), "{text}");
        assert!(text.contains(r#"isthmus_operator_agent_calls_total{node="n1"} 2"#), "{text}");
    }

    #[test]
    fn link_series_appear_and_go_with_their_verdicts() {
        let m = Metrics::new();
        let l = LinkLabels { namespace: "ns".into(), link: "l".into(), direction: "forward".into() };
        m.link_verdict(&l, Duration::from_millis(120), 0.01, Some(false));
        let text = m.encode();
        let labels = r#"{namespace="ns",link="l",direction="forward"}"#;
        assert!(text.contains(&format!("isthmus_link_expected_rtt_seconds{labels} 0.12")), "{text}");
        assert!(text.contains(&format!("isthmus_link_expected_loss_ratio{labels} 0.01")), "{text}");
        assert!(text.contains(&format!("isthmus_link_conformant{labels} 0")), "{text}");
        m.link_verdict(&l, Duration::from_millis(120), 0.01, None);
        assert!(!m.encode().contains("isthmus_link_conformant{"), "unmeasured: no conformance series");
        m.forget_link(&l);
        assert!(!m.encode().contains("isthmus_link_expected_rtt_seconds{"));
    }
}
