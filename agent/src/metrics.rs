//! The agent's Prometheus metrics: per-link kernel counters (refreshed from the kernel at every scrape) and
//! the agent's own apply and authentication counters.

use std::sync::Mutex;

use isthmus_agent_api::{Counters, PodErrorKind};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// One destination of one source pod, attributed to the NetworkLink that asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LinkLabels {
    pub link_namespace: String,
    pub link_name: String,
    pub direction: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub destination: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorKindLabels {
    pub kind: String,
}

/// The last observed kernel counters, encoded as constant metrics so that they keep the kernel's values.
#[derive(Debug, Default)]
struct LinkCounters {
    snapshot: Mutex<Vec<(LinkLabels, Counters)>>,
}

impl Collector for LinkCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        type Pick = fn(&Counters) -> u64;
        let counters: [(&str, &str, Pick); 4] = [
            ("isthmus_link_packets", "Packets sent to the destination through its impairment", |c| c.packets),
            ("isthmus_link_bytes", "Bytes sent to the destination through its impairment", |c| c.bytes),
            ("isthmus_link_drops", "Packets dropped by the destination's qdiscs", |c| c.drops),
            ("isthmus_link_overlimits", "Times the destination's qdiscs throttled", |c| c.overlimits),
        ];
        for (name, help, pick) in counters {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, c) in snapshot.iter() {
                ConstCounter::new(pick(c)).encode(metric.encode_family(labels)?)?;
            }
        }
        let gauges: [(&str, &str, Pick); 2] = [
            ("isthmus_link_backlog_packets", "Packets queued for the destination now", |c| c.backlog_packets),
            ("isthmus_link_backlog_bytes", "Bytes queued for the destination now", |c| c.backlog_bytes),
        ];
        for (name, help, pick) in gauges {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, c) in snapshot.iter() {
                ConstGauge::new(pick(c) as i64).encode(metric.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    links: std::sync::Arc<LinkCounters>,
    pub apply_duration_seconds: Histogram,
    pub applies: Family<OutcomeLabels, Counter>,
    pub pod_errors: Family<ErrorKindLabels, Counter>,
    pub mutations: Counter,
    pub pods_in_plan: Gauge,
    pub trees_removed: Counter,
    pub tls_handshake_failures: Counter,
    pub forbidden_requests: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let links = std::sync::Arc::new(LinkCounters::default());
        registry.register_collector(Box::new(links.clone()));
        let apply_duration_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "isthmus_agent_apply_duration_seconds",
            "Time from receiving a node plan to replying",
            apply_duration_seconds.clone(),
        );
        let applies = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "isthmus_agent_applies",
            "Node plans received, by outcome (applied, partial, stale)",
            applies.clone(),
        );
        let pod_errors = Family::<ErrorKindLabels, Counter>::default();
        registry.register(
            "isthmus_agent_pod_errors",
            "Pods whose plan could not be applied, by error kind",
            pod_errors.clone(),
        );
        let mutations = Counter::default();
        registry.register("isthmus_agent_netlink_mutations", "Netlink changes sent to the kernel", mutations.clone());
        let pods_in_plan = Gauge::default();
        registry.register("isthmus_agent_pods_in_plan", "Pods in the node plan in force", pods_in_plan.clone());
        let trees_removed = Counter::default();
        registry.register(
            "isthmus_agent_trees_removed",
            "isthmus trees removed because the plan no longer wanted them",
            trees_removed.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "isthmus_agent_tls_handshake_failures",
            "API connections refused during the TLS handshake (no or untrusted client certificate)",
            tls_handshake_failures.clone(),
        );
        let forbidden_requests = Counter::default();
        registry.register(
            "isthmus_agent_forbidden_requests",
            "API requests refused because the client certificate is not the operator's",
            forbidden_requests.clone(),
        );
        Self {
            registry,
            links,
            apply_duration_seconds,
            applies,
            pod_errors,
            mutations,
            pods_in_plan,
            trees_removed,
            tls_handshake_failures,
            forbidden_requests,
        }
    }

    pub fn set_link_counters(&self, snapshot: Vec<(LinkLabels, Counters)>) {
        *self.links.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
    }

    pub fn count_pod_error(&self, kind: PodErrorKind) {
        self.pod_errors.get_or_create(&ErrorKindLabels { kind: format!("{kind:?}") }).inc();
    }

    pub fn count_apply(&self, outcome: &str) {
        self.applies.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }).inc();
    }

    /// The OpenMetrics text of everything.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
