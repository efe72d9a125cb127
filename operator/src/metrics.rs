//! The operator's Prometheus metrics.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("isthmus_operator");
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
        Metrics { registry, ..m }
    }

    pub fn agent_call(&self, node: &str, took: Duration, error: Option<CallErrorKind>) {
        self.agent_calls.get_or_create(&NodeLabels { node: node.to_owned() }).inc();
        self.agent_call_duration.observe(took.as_secs_f64());
        if let Some(kind) = error {
            self.agent_call_errors.get_or_create(&AgentErrorLabels { node: node.to_owned(), kind }).inc();
        }
    }

    pub fn status_patch(&self, ok: bool) {
        self.status_patches.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" }.into() }).inc();
    }

    /// A readiness gate write: `ok`, `gone` (the pod was deleted or replaced) or `error`.
    pub fn gate_patch(&self, result: &str) {
        self.gate_patches.get_or_create(&ResultLabels { result: result.into() }).inc();
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
}
