//! The agent's Prometheus metrics: per-link kernel counters (refreshed from the kernel at every scrape) and
//! the agent's own apply and authentication counters.

mod probe;

use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use isthmus_agent_api::{Counters, Direction, LinkRef, PodErrorKind};
use prometheus_client::collector::Collector;
use std::fmt::Write as _;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use self::probe::{DirectionLabel, ProbeLabels, ProbeMetrics};

/// The source pod of link samples, shared by all its destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

/// One destination of one source pod, attributed to the NetworkLink that asked for it, with its counters.
/// Compact (shared pod and link, no label strings) because a node holds one per destination: the label set
/// is written out only while a scrape encodes it.
#[derive(Debug, Clone)]
pub struct LinkSample {
    pub pod: Arc<PodName>,
    pub destination: IpNet,
    pub link: Arc<LinkRef>,
    pub counters: Counters,
}

impl LinkSample {
    /// link_namespace, link_name, direction, pod_namespace, pod_name, destination.
    fn labels<'a>(&'a self, destination: &'a str) -> [(&'static str, &'a str); 6] {
        [
            ("link_namespace", self.link.namespace.as_str()),
            ("link_name", self.link.name.as_str()),
            (
                "direction",
                match self.link.direction {
                    Direction::Forward => "forward",
                    Direction::Reverse => "reverse",
                },
            ),
            ("pod_namespace", self.pod.namespace.as_str()),
            ("pod_name", self.pod.name.as_str()),
            ("destination", destination),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DatapathLabels {
    pub datapath: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PathLabels {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorKindLabels {
    pub kind: String,
}

/// The last observed kernel counters, encoded as constant metrics so that they keep the kernel's values.
#[derive(Debug, Default)]
struct LinkCounters {
    snapshot: Mutex<Vec<LinkSample>>,
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
        let destinations: Vec<String> = snapshot.iter().map(|s| s.destination.to_string()).collect();
        for (name, help, pick) in counters {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (sample, destination) in snapshot.iter().zip(&destinations) {
                ConstCounter::new(pick(&sample.counters)).encode(metric.encode_family(&sample.labels(destination))?)?;
            }
        }
        let gauges: [(&str, &str, Pick); 2] = [
            ("isthmus_link_backlog_packets", "Packets queued for the destination now", |c| c.backlog_packets),
            ("isthmus_link_backlog_bytes", "Bytes queued for the destination now", |c| c.backlog_bytes),
        ];
        for (name, help, pick) in gauges {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (sample, destination) in snapshot.iter().zip(&destinations) {
                ConstGauge::new(pick(&sample.counters) as i64)
                    .encode(metric.encode_family(&sample.labels(destination))?)?;
            }
        }
        Ok(())
    }
}

/// Which of the agent's listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    Api,
    Health,
    /// The HTTPS metrics listener (bearer tokens).
    Metrics,
}

impl EncodeLabelValue for ListenerKind {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(match self {
            ListenerKind::Api => "api",
            ListenerKind::Health => "health",
            ListenerKind::Metrics => "metrics",
        })
    }
}

/// What the connection gate did with a caller when every slot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionGateOutcome {
    /// Closed at once.
    Refused,
    /// Let in; the address holding the most slots gave one up.
    EvictedHeaviest,
    /// Let in; the oldest holder, stale, gave its slot up.
    EvictedStale,
}

impl EncodeLabelValue for ConnectionGateOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(match self {
            ConnectionGateOutcome::Refused => "refused",
            ConnectionGateOutcome::EvictedHeaviest => "evicted_heaviest",
            ConnectionGateOutcome::EvictedStale => "evicted_stale",
        })
    }
}

/// Why the userspace datapath's loop lost packets outside every destination's emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoopLoss {
    /// The kernel dropped them from a capture's socket: the loop fell behind.
    CaptureOverrun,
    /// The raw socket refused to send them on.
    SendError,
    /// Captured frames that were not IP packets.
    Malformed,
    /// The node's userspace queues held their budget (`--userspace-queue-bytes`).
    QueueBudget,
}

impl EncodeLabelValue for LoopLoss {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(match self {
            LoopLoss::CaptureOverrun => "capture_overrun",
            LoopLoss::SendError => "send_error",
            LoopLoss::Malformed => "malformed",
            LoopLoss::QueueBudget => "queue_budget",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LoopLossLabels {
    pub reason: LoopLoss,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ConnectionGateLabels {
    pub listener: ListenerKind,
    pub outcome: ConnectionGateOutcome,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    links: Arc<LinkCounters>,
    pub apply_duration_seconds: Histogram,
    pub phase_switch_seconds: Histogram,
    pub applies: Family<OutcomeLabels, Counter>,
    pub pod_errors: Family<ErrorKindLabels, Counter>,
    pub mutations: Counter,
    pub reconciles: Family<PathLabels, Counter>,
    pub datapath_connections_opened: Counter,
    pub resync_mutations: Counter,
    pub pods_in_plan: Gauge,
    pub queue_limits_capped: Gauge,
    pub destinations_refused: Gauge,
    /// 1 while the userspace datapath's loop runs, 0 once it stopped; absent with the tc datapath.
    pub userspace_loop_running: Gauge,
    /// What the userspace datapath's queues hold on the node, as of the last read of a pod's counters.
    pub userspace_queued_bytes: Gauge,
    pub leftover_trees: Gauge,
    /// 1 for the datapath this agent gives its pods (`tc` or `userspace`).
    pub datapath: Family<DatapathLabels, Gauge>,
    pub trees_removed: Counter,
    pub tls_handshake_failures: Counter,
    pub forbidden_requests: Counter,
    pub connection_gate: Family<ConnectionGateLabels, Counter>,
    pub scrape_observes: Counter,
    /// Requests to the metrics listener by what their bearer token got (`isthmus_agent_api::metrics_auth`).
    pub metrics_auth: Family<OutcomeLabels, Counter>,
    /// The link probes' round trips and losses (`crate::measure`).
    pub probes: ProbeMetrics,
    /// The userspace loop's losses outside the emulators; brought up to the loop's totals under the lock, so
    /// that two observers never add one difference twice.
    loop_losses: std::sync::Mutex<Family<LoopLossLabels, Counter>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let links = Arc::new(LinkCounters::default());
        registry.register_collector(Box::new(links.clone()));
        let apply_duration_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "isthmus_agent_apply_duration_seconds",
            "Time from receiving a node plan to replying",
            apply_duration_seconds.clone(),
        );
        let phase_switch_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "isthmus_agent_phase_switch_seconds",
            "Time from a scheduled phase change's instant until every pod of the node carries the new phase",
            phase_switch_seconds.clone(),
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
        let reconciles = Family::<PathLabels, Counter>::default();
        registry.register(
            "isthmus_agent_reconciles",
            "Per-interface reconciles by path: full (dump, diff, send) or record (diff against what the pod's \
             connection last installed, no dump; a full one when it has no record or the kernel refuses)",
            reconciles.clone(),
        );
        let datapath_connections_opened = Counter::default();
        registry.register(
            "isthmus_agent_datapath_connections_opened",
            "Datapaths opened for pod network namespaces: one per pod and sandbox, kept across plans with its record (its netlink sockets are closed between calls)",
            datapath_connections_opened.clone(),
        );
        let resync_mutations = Counter::default();
        registry.register(
            "isthmus_agent_resync_mutations",
            "Netlink changes sent by the periodic resync: drift found and repaired",
            resync_mutations.clone(),
        );
        let pods_in_plan = Gauge::default();
        registry.register("isthmus_agent_pods_in_plan", "Pods in the node plan in force", pods_in_plan.clone());
        let queue_limits_capped = Gauge::default();
        registry.register(
            "isthmus_agent_queue_limits_capped",
            "Destinations of the plan in force whose queueLimit the queue budgets cut",
            queue_limits_capped.clone(),
        );
        let destinations_refused = Gauge::default();
        registry.register(
            "isthmus_agent_destinations_refused",
            "Destinations of the plan in force left unimpaired because the kernel cannot hold their impairment",
            destinations_refused.clone(),
        );
        let userspace_loop_running = Gauge::default();
        registry.register(
            "isthmus_agent_userspace_loop_running",
            "1 while the userspace datapath's packet loop runs; 0 once it stopped, after which the agent removed \
             every capture (its pods go unimpaired) and fails its liveness probe until the kubelet restarts it",
            userspace_loop_running.clone(),
        );
        let userspace_queued_bytes = Gauge::default();
        registry.register(
            "isthmus_agent_userspace_queued_bytes",
            "Bytes the userspace datapath's queues hold on this node (every pod's, pipelines draining after an edit \
             included, each packet with its bookkeeping), as of the last read of the counters; at most \
             --userspace-queue-bytes, past which packets are dropped (isthmus_agent_userspace_lost{reason=\"queue_budget\"})",
            userspace_queued_bytes.clone(),
        );
        let leftover_trees = Gauge::default();
        registry.register(
            "isthmus_agent_leftover_trees",
            "isthmus trees the plan no longer wants that could not be removed (tried again with every plan)",
            leftover_trees.clone(),
        );
        let datapath = Family::<DatapathLabels, Gauge>::default();
        registry.register(
            "isthmus_agent_datapath",
            "1 for the datapath this agent gives every pod of its node: tc (the kernel's qdiscs) or userspace \
             (the agent's own emulator, for kernels without sch_netem)",
            datapath.clone(),
        );
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
            "API requests refused because the client certificate does not name a caller allowed there",
            forbidden_requests.clone(),
        );
        let connection_gate = Family::<ConnectionGateLabels, Counter>::default();
        registry.register(
            "isthmus_agent_connection_gate",
            "Connections that found every slot of a listener taken: refused, or let in by evicting another",
            connection_gate.clone(),
        );
        let scrape_observes = Counter::default();
        registry.register(
            "isthmus_agent_scrape_observes",
            "Reads of every pod's counters made for a scrape (concurrent and repeated scrapes share one)",
            scrape_observes.clone(),
        );
        let metrics_auth = Family::<OutcomeLabels, Counter>::default();
        for outcome in isthmus_agent_api::metrics_auth::Outcome::ALL {
            let _ = metrics_auth.get_or_create(&OutcomeLabels { outcome: outcome.as_str().to_owned() });
        }
        registry.register(
            "isthmus_agent_metrics_auth",
            "Requests to the metrics listener by outcome of their bearer token: allowed, unauthenticated (401), \
             forbidden (403), error (503: the TokenReview or SubjectAccessReview failed)",
            metrics_auth.clone(),
        );
        let loop_losses = Family::<LoopLossLabels, Counter>::default();
        registry.register(
            "isthmus_agent_userspace_lost",
            "Packets the userspace datapath's loop lost outside every destination's emulator (so in no link's \
             drops): capture_overrun (the kernel dropped them from a capture's socket, the loop fell behind), \
             send_error, malformed, queue_budget (the node's userspace queues held their budget)",
            loop_losses.clone(),
        );
        let probes = ProbeMetrics::register(&mut registry);
        Self {
            loop_losses: std::sync::Mutex::new(loop_losses),
            registry,
            links,
            apply_duration_seconds,
            phase_switch_seconds,
            applies,
            pod_errors,
            mutations,
            reconciles,
            datapath_connections_opened,
            resync_mutations,
            pods_in_plan,
            queue_limits_capped,
            destinations_refused,
            userspace_loop_running,
            userspace_queued_bytes,
            leftover_trees,
            datapath,
            trees_removed,
            tls_handshake_failures,
            forbidden_requests,
            connection_gate,
            scrape_observes,
            metrics_auth,
            probes,
        }
    }

    pub fn set_link_counters(&self, snapshot: Vec<LinkSample>) {
        *self.links.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
    }

    /// Brings the loop's loss counters up to its totals (they only grow while the agent runs).
    pub fn set_loop_losses(&self, totals: &isthmus_datapaths::userspace::ShellCounters) {
        self.userspace_queued_bytes.set(totals.queued_bytes as i64);
        let family = self.loop_losses.lock().unwrap_or_else(|p| p.into_inner());
        for (reason, total) in [
            (LoopLoss::CaptureOverrun, totals.capture_overruns),
            (LoopLoss::SendError, totals.send_errors),
            (LoopLoss::Malformed, totals.malformed),
            (LoopLoss::QueueBudget, totals.budget_drops),
        ] {
            let counter = family.get_or_create(&LoopLossLabels { reason });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    pub fn count_pod_error(&self, kind: PodErrorKind) {
        self.pod_errors.get_or_create(&ErrorKindLabels { kind: format!("{kind:?}") }).inc();
    }

    pub fn count_reconcile(&self, path: &str) {
        self.reconciles.get_or_create(&PathLabels { path: path.to_owned() }).inc();
    }

    pub fn count_apply(&self, outcome: &str) {
        self.applies.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }).inc();
    }

    pub fn count_metrics_auth(&self, outcome: isthmus_agent_api::metrics_auth::Outcome) {
        self.metrics_auth.get_or_create(&OutcomeLabels { outcome: outcome.as_str().to_owned() }).inc();
    }

    pub fn count_connection_gate(&self, listener: ListenerKind, outcome: ConnectionGateOutcome) {
        self.connection_gate.get_or_create(&ConnectionGateLabels { listener, outcome }).inc();
    }

    /// The OpenMetrics text of everything.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
