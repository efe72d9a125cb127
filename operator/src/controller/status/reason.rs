//! The reasons of a NetworkLink's `Ready`, `Degraded` and `Overlapping` conditions, each spelled once, in
//! [`LinkReason::as_str`].
//!
//! The texts are API: users match them in `kubectl get` and alerts, the Events isthmus publishes carry them, and
//! docs/troubleshooting.md lists each. A failure's reason ([`FailureReason`]) is `Degraded`'s reason when a pod
//! fails, and `Ready`'s too when the whole link is refused.

use std::fmt;

use crate::failure::FailureReason;

/// Why a link's condition has its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkReason {
    /// `Ready` False and `Degraded` True: the operator's own check refused the spec, or cannot read the object.
    InvalidSpec,
    /// `Ready` True: no pod with an IP matches the link yet.
    NoPairs,
    /// `Ready` True: every pair is applied.
    Applied,
    /// `Ready` False: some pairs failed.
    Failed,
    /// `Ready` False: waiting for the node agents.
    Pending,
    /// `Degraded` False: every selected pod is shaped.
    AsExpected,
    /// `Overlapping` False: no other link covers the link's pairs.
    NoOverlap,
    /// `Overlapping` True: other links cover some of the link's pairs.
    SharedPairs,
    /// A failure's reason: `Degraded` True for a pod that is not shaped, or `Ready` False and `Degraded` True for
    /// a link refused whole.
    Failure(FailureReason),
}

impl LinkReason {
    /// Every reason but the failures.
    pub const OWN: [LinkReason; 8] = [
        LinkReason::InvalidSpec,
        LinkReason::NoPairs,
        LinkReason::Applied,
        LinkReason::Failed,
        LinkReason::Pending,
        LinkReason::AsExpected,
        LinkReason::NoOverlap,
        LinkReason::SharedPairs,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            LinkReason::InvalidSpec => "InvalidSpec",
            LinkReason::NoPairs => "NoPairs",
            LinkReason::Applied => "Applied",
            LinkReason::Failed => "Failed",
            LinkReason::Pending => "Pending",
            LinkReason::AsExpected => "AsExpected",
            LinkReason::NoOverlap => "NoOverlap",
            LinkReason::SharedPairs => "SharedPairs",
            LinkReason::Failure(r) => r.as_str(),
        }
    }

    /// The reason a condition on the server carries; `None` for a text isthmus never writes.
    pub fn parse(text: &str) -> Option<LinkReason> {
        LinkReason::OWN
            .into_iter()
            .find(|r| r.as_str() == text)
            .or_else(|| FailureReason::parse(text).map(LinkReason::Failure))
    }
}

impl fmt::Display for LinkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn every() -> impl Iterator<Item = LinkReason> {
        LinkReason::OWN.into_iter().chain(FailureReason::ALL.map(LinkReason::Failure))
    }

    #[test]
    fn every_reason_reads_back_from_its_text() {
        for reason in every() {
            assert_eq!(LinkReason::parse(reason.as_str()), Some(reason), "{reason}");
            assert_eq!(reason.to_string(), reason.as_str());
        }
        assert_eq!(LinkReason::parse("SetByHand"), None, "a text isthmus never writes");
    }

    #[test]
    fn no_two_reasons_share_a_text() {
        let texts: BTreeSet<&str> = every().map(LinkReason::as_str).collect();
        assert_eq!(texts.len(), LinkReason::OWN.len() + FailureReason::ALL.len());
    }

    /// Each reason of the link's own has its row in the troubleshooting table (the failure reasons have theirs in
    /// the failure table, checked in `failure.rs`).
    #[test]
    fn every_own_reason_is_documented() {
        let troubleshooting = include_str!("../../../../docs/troubleshooting.md");
        for reason in LinkReason::OWN {
            assert!(
                troubleshooting.contains(&format!("| `{reason}` |")),
                "{reason}: no row in docs/troubleshooting.md"
            );
        }
    }
}
