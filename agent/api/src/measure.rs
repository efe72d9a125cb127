//! What an agent measured on the links it applies (agent → operator, `GET /v1/measured`).
//!
//! The agent probes sampled (source pod, destination) pairs of each link from inside the source pod's network
//! namespace, so its probes take the same datapath as the application's packets, and probes the same
//! destinations from the node's own namespace for the path's unimpaired baseline. It reports, per link and
//! direction, the last complete window: round-trip times as a [`RttHistogram`] (mergeable across pods and
//! nodes without losing the quantiles) and probes sent and answered. The operator merges the nodes' windows
//! and decides conformance; the agent never judges.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plan::LinkRef;

/// `GET` the node's [`MeasuredState`].
pub const MEASURED_PATH: &str = "/v1/measured";

/// How a round trip was probed. ICMP echo needs nothing from the destination pod (its kernel answers); where
/// ICMP gets no answer at all the agent falls back to a TCP SYN, which the destination's kernel answers with a
/// SYN-ACK or a reset whether or not anything listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum ProbeKind {
    IcmpEcho,
    TcpSyn,
}

/// Round-trip times counted in logarithmic buckets: bucket `i` holds times in `[BASE·RATIO^i, BASE·RATIO^(i+1))`,
/// so a quantile read back is within 1 % of the true sample (half a bucket), and two histograms merge by adding
/// counts. Times below [`RttHistogram::BASE`] count in bucket 0, times beyond the last bucket in the last.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RttHistogram {
    buckets: BTreeMap<u16, u64>,
}

impl RttHistogram {
    /// The lower edge of bucket 0.
    pub const BASE: Duration = Duration::from_micros(1);
    /// Each bucket's upper edge over its lower edge.
    pub const RATIO: f64 = 1.02;
    /// The last bucket: ≈ 130 s, beyond any probe timeout.
    pub const LAST: u16 = 1200;

    pub fn new() -> Self {
        Self::default()
    }

    pub fn bucket_of(rtt: Duration) -> u16 {
        let ratio = rtt.as_secs_f64() / Self::BASE.as_secs_f64();
        if ratio <= 1.0 {
            return 0;
        }
        let index = (ratio.ln() / Self::RATIO.ln()).floor();
        if index >= f64::from(Self::LAST) { Self::LAST } else { index as u16 }
    }

    /// The geometric middle of bucket `i`: what a quantile falling in it reads back as.
    pub fn middle_of(bucket: u16) -> Duration {
        Self::BASE.mul_f64(Self::RATIO.powf(f64::from(bucket) + 0.5))
    }

    pub fn record(&mut self, rtt: Duration) {
        *self.buckets.entry(Self::bucket_of(rtt)).or_default() += 1;
    }

    pub fn merge(&mut self, other: &RttHistogram) {
        for (bucket, count) in &other.buckets {
            *self.buckets.entry(*bucket).or_default() += count;
        }
    }

    pub fn count(&self) -> u64 {
        self.buckets.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The `q` quantile (0 < q ≤ 1) as the middle of the bucket holding the ⌈q·n⌉-th smallest sample; `None`
    /// for an empty histogram.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in &self.buckets {
            seen += count;
            if seen >= rank {
                return Some(Self::middle_of(*bucket));
            }
        }
        self.buckets.keys().next_back().map(|b| Self::middle_of(*b))
    }

    /// The non-empty buckets, ascending: (bucket, count).
    pub fn buckets(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.buckets.iter().map(|(b, c)| (*b, *c))
    }
}

/// On the wire a histogram is its non-empty buckets as `[bucket, count]` pairs, ascending.
impl Serialize for RttHistogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.buckets.iter())
    }
}

impl<'de> Deserialize<'de> for RttHistogram {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let pairs = Vec::<(u16, u64)>::deserialize(d)?;
        let mut histogram = RttHistogram::new();
        for (bucket, count) in pairs {
            if bucket > Self::LAST {
                return Err(serde::de::Error::custom(format!("bucket {bucket} is beyond the last, {}", Self::LAST)));
            }
            *histogram.buckets.entry(bucket).or_default() += count;
        }
        Ok(histogram)
    }
}

/// Probes of one kind over one window: how many were sent, how many were answered, and the answers' times.
/// `answered ≤ sent`; a probe still in flight when the window closes counts in the window it was sent in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeWindow {
    pub sent: u64,
    pub answered: u64,
    pub rtt: RttHistogram,
}

impl ProbeWindow {
    pub fn merge(&mut self, other: &ProbeWindow) {
        self.sent += other.sent;
        self.answered += other.answered;
        self.rtt.merge(&other.rtt);
    }
}

/// Why a link's direction could not be measured on this node at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum UnmeasurableReason {
    /// Neither ICMP echo nor TCP SYN got any answer from any sampled destination, though the link does not drop
    /// everything.
    NoAnswer,
    /// The probe socket could not be opened in the pod's network namespace (the message says why).
    ProbeFailed,
}

/// One link direction on one node over the last complete window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkMeasurement {
    pub link: LinkRef,
    pub probe: ProbeKind,
    /// (source pod, destination) pairs sampled on this node.
    pub pairs: u32,
    /// Probes from inside the source pods: they take the link's impairment.
    pub impaired: ProbeWindow,
    /// The same destinations probed from the node's own network namespace: the path without the impairment.
    pub baseline: ProbeWindow,
    /// The window, as Unix milliseconds: `[start, end)`.
    pub window_start_ms: u64,
    pub window_end_ms: u64,
    /// When the last answer arrived (Unix milliseconds), if any did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmeasurable: Option<Unmeasurable>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unmeasurable {
    pub reason: UnmeasurableReason,
    pub message: String,
}

/// The reply to `GET /v1/measured`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredState {
    pub node: String,
    /// The plan version the probes were sampled from.
    pub version: u64,
    /// False when verification is switched off for the whole node (the agent's `--verify=false`).
    pub enabled: bool,
    pub links: Vec<LinkMeasurement>,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_quantile_reads_back_within_one_percent() {
        for micros in [1u64, 7, 150, 999, 20_000, 120_000, 4_000_000] {
            let rtt = Duration::from_micros(micros);
            let mut h = RttHistogram::new();
            h.record(rtt);
            let back = h.quantile(0.5).unwrap().as_secs_f64();
            let error = (back - rtt.as_secs_f64()).abs() / rtt.as_secs_f64();
            assert!(error <= 0.0101, "{rtt:?} read back as {back}s ({error})");
        }
    }

    #[test]
    fn quantiles_pick_the_ranked_sample() {
        let mut h = RttHistogram::new();
        for ms in 1..=10 {
            h.record(Duration::from_millis(ms * 10));
        }
        let near = |d: Duration, ms: f64| (d.as_secs_f64() * 1e3 - ms).abs() / ms < 0.011;
        assert!(near(h.quantile(0.5).unwrap(), 50.0));
        assert!(near(h.quantile(0.9).unwrap(), 90.0));
        assert!(near(h.quantile(1.0).unwrap(), 100.0));
        assert_eq!(RttHistogram::new().quantile(0.5), None);
    }

    #[test]
    fn the_wire_form_is_sparse_pairs_and_refuses_unknown_buckets() {
        let mut h = RttHistogram::new();
        h.record(Duration::from_millis(1));
        h.record(Duration::from_millis(1));
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, format!("[[{},2]]", RttHistogram::bucket_of(Duration::from_millis(1))));
        assert_eq!(serde_json::from_str::<RttHistogram>(&json).unwrap(), h);
        assert!(serde_json::from_str::<RttHistogram>("[[1201,1]]").unwrap_err().to_string().contains("beyond"));
    }

    proptest! {
        #[test]
        fn merging_equals_recording_everything_in_one(
            a in proptest::collection::vec(0u64..200_000_000, 0..50),
            b in proptest::collection::vec(0u64..200_000_000, 0..50),
        ) {
            let fill = |xs: &[u64]| {
                let mut h = RttHistogram::new();
                xs.iter().for_each(|ns| h.record(Duration::from_nanos(*ns)));
                h
            };
            let mut merged = fill(&a);
            merged.merge(&fill(&b));
            let all: Vec<u64> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(&merged, &fill(&all));
            prop_assert_eq!(merged.count(), all.len() as u64);
        }

        #[test]
        fn buckets_are_monotonic(x in 0u64..100_000_000_000, y in 0u64..100_000_000_000) {
            let (lo, hi) = (x.min(y), x.max(y));
            prop_assert!(RttHistogram::bucket_of(Duration::from_nanos(lo)) <= RttHistogram::bucket_of(Duration::from_nanos(hi)));
        }
    }
}
