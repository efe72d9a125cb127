//! The probes' metrics: per link direction and path (impaired, baseline), never per pod or address, so that a
//! node's series are bounded by its links. Series of links that leave the plan are removed.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use isthmus_agent_api::{Direction, LinkRef};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::fmt::Write as _;

use crate::probe_path::ProbePath;

/// `direction` as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirectionLabel(pub Direction);

impl EncodeLabelValue for DirectionLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(match self.0 {
            Direction::Forward => "forward",
            Direction::Reverse => "reverse",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProbeLabels {
    pub namespace: String,
    pub link: String,
    pub direction: DirectionLabel,
    pub path: ProbePath,
}

impl ProbeLabels {
    pub fn new(link: &LinkRef, path: ProbePath) -> Self {
        ProbeLabels {
            namespace: link.namespace.clone(),
            link: link.name.clone(),
            direction: DirectionLabel(link.direction),
            path,
        }
    }
}

/// 100 µs to ≈ 13 s in 18 doublings: a pod-to-pod round trip inside a node up to the longest probe timeout.
fn rtt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

#[derive(Debug)]
pub struct ProbeMetrics {
    rtt: Family<ProbeLabels, Histogram, fn() -> Histogram>,
    sent: Family<ProbeLabels, Counter>,
    lost: Family<ProbeLabels, Counter>,
    /// The label sets created, so that a link's series can be removed when it leaves the plan.
    known: Mutex<HashSet<ProbeLabels>>,
}

impl ProbeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let rtt = Family::<ProbeLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            rtt_histogram as fn() -> Histogram,
        );
        registry.register(
            "isthmus_link_rtt_seconds",
            "Round-trip times of answered probes per link direction: from inside the source pods (path=impaired) \
             and from the node's namespace to the same destinations (path=baseline)",
            rtt.clone(),
        );
        let sent = Family::<ProbeLabels, Counter>::default();
        registry.register("isthmus_link_probes_sent", "Probes sent per link direction and path", sent.clone());
        let lost = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "isthmus_link_probes_lost",
            "Probes not answered within their timeout per link direction and path",
            lost.clone(),
        );
        ProbeMetrics { rtt, sent, lost, known: Mutex::new(HashSet::new()) }
    }

    fn labels(&self, link: &LinkRef, path: ProbePath) -> ProbeLabels {
        let labels = ProbeLabels::new(link, path);
        self.known.lock().unwrap_or_else(|p| p.into_inner()).insert(labels.clone());
        labels
    }

    pub fn sent(&self, link: &LinkRef, path: ProbePath) {
        let labels = self.labels(link, path);
        self.sent.get_or_create(&labels).inc();
        // Created with the first send, so that a link that never answers shows 0 lost rather than nothing.
        drop(self.lost.get_or_create(&labels));
    }

    pub fn answered(&self, link: &LinkRef, path: ProbePath, rtt: Duration) {
        self.rtt.get_or_create(&self.labels(link, path)).observe(rtt.as_secs_f64());
    }

    pub fn lost(&self, link: &LinkRef, path: ProbePath) {
        self.lost.get_or_create(&self.labels(link, path)).inc();
    }

    /// Removes the series of every link direction not in `links`.
    pub fn retain(&self, links: &HashSet<&LinkRef>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.retain(|labels| {
            let keep = links
                .iter()
                .any(|l| l.namespace == labels.namespace && l.name == labels.link && l.direction == labels.direction.0);
            if !keep {
                self.rtt.remove(labels);
                self.sent.remove(labels);
                self.lost.remove(labels);
            }
            keep
        });
    }
}
