//! Which path a probe takes. The prober (`crate::measure`) chooses it for each send, and the probe metrics
//! (`crate::metrics`) label their series with it, so it sits below both.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// Which path a probe takes: the prober's choice, and a label of its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbePath {
    /// From inside the source pod: through the link's impairment.
    Impaired,
    /// From the node's own namespace: the same destination without the impairment.
    Baseline,
}

impl EncodeLabelValue for ProbePath {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(match self {
            ProbePath::Impaired => "impaired",
            ProbePath::Baseline => "baseline",
        })
    }
}
