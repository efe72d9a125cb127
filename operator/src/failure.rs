//! Why a pod is not shaped as its link asks, and why a call to an agent failed: the operator's two failure
//! vocabularies, each written out as text in exactly one place ([`FailureReason::as_str`],
//! [`CallErrorKind::as_str`]).
//!
//! The texts are API. A [`FailureReason`] is `status.failures[].reason` and `Degraded`'s reason, listed in
//! docs/troubleshooting.md; a [`CallErrorKind`] is the `kind` label of `isthmus_operator_agent_call_errors_total`.

use std::fmt;

use isthmus_agent_api::PodErrorKind;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// Why a selected pod is not shaped: decided by the plan (the pod is excluded), by the node dispatcher (the
/// node's agent was not reached) or by the agent (its per-pod error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureReason {
    /// The pod shares the node's network namespace; shaping it would shape the node.
    HostNetwork,
    /// The node has no ready agent.
    AgentUnavailable,
    /// The node's agent could not be called.
    AgentUnreachable,
    /// The node's agent refused the operator's identity.
    AgentRefused,
    InvalidPlan,
    PodNotFound,
    /// The pod's IPs are in another pod's network namespace (reused IPs): nothing is shaped.
    NamespaceConflict,
    /// The link, or the link for this pod, asks for more destinations than the operator's limits allow.
    TooManyDestinations,
    /// The link asks for more (source pod, destination) pairs than the operator's limits allow, alone or with the
    /// links that rank before it.
    TooManyPairs,
    InterfaceNotFound,
    ForeignQdisc,
    KernelUnsupported,
    DuplicateRestriction,
    Kernel,
    /// The node agent's userspace datapath stopped: its pods go unimpaired until the agent restarts.
    DatapathStopped,
}

impl FailureReason {
    /// Every reason, in declaration order (for reading one back from its text).
    pub const ALL: [FailureReason; 15] = [
        FailureReason::HostNetwork,
        FailureReason::AgentUnavailable,
        FailureReason::AgentUnreachable,
        FailureReason::AgentRefused,
        FailureReason::InvalidPlan,
        FailureReason::PodNotFound,
        FailureReason::NamespaceConflict,
        FailureReason::TooManyDestinations,
        FailureReason::TooManyPairs,
        FailureReason::InterfaceNotFound,
        FailureReason::ForeignQdisc,
        FailureReason::KernelUnsupported,
        FailureReason::DuplicateRestriction,
        FailureReason::Kernel,
        FailureReason::DatapathStopped,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::HostNetwork => "HostNetwork",
            FailureReason::AgentUnavailable => "AgentUnavailable",
            FailureReason::AgentUnreachable => "AgentUnreachable",
            FailureReason::AgentRefused => "AgentRefused",
            FailureReason::InvalidPlan => "InvalidPlan",
            FailureReason::PodNotFound => "PodNotFound",
            FailureReason::NamespaceConflict => "NamespaceConflict",
            FailureReason::TooManyDestinations => "TooManyDestinations",
            FailureReason::TooManyPairs => "TooManyPairs",
            FailureReason::InterfaceNotFound => "InterfaceNotFound",
            FailureReason::ForeignQdisc => "ForeignQdisc",
            FailureReason::KernelUnsupported => "KernelUnsupported",
            FailureReason::DuplicateRestriction => "DuplicateRestriction",
            FailureReason::Kernel => "Kernel",
            FailureReason::DatapathStopped => "DatapathStopped",
        }
    }

    /// The reason whose text is `text`; `None` for a text isthmus never writes.
    pub fn parse(text: &str) -> Option<FailureReason> {
        FailureReason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<PodErrorKind> for FailureReason {
    fn from(kind: PodErrorKind) -> Self {
        match kind {
            PodErrorKind::InvalidPlan => FailureReason::InvalidPlan,
            PodErrorKind::PodNotFound => FailureReason::PodNotFound,
            PodErrorKind::NamespaceConflict => FailureReason::NamespaceConflict,
            PodErrorKind::HostNetwork => FailureReason::HostNetwork,
            PodErrorKind::InterfaceNotFound => FailureReason::InterfaceNotFound,
            PodErrorKind::ForeignQdisc => FailureReason::ForeignQdisc,
            PodErrorKind::KernelUnsupported => FailureReason::KernelUnsupported,
            PodErrorKind::DuplicateRestriction => FailureReason::DuplicateRestriction,
            PodErrorKind::Kernel => FailureReason::Kernel,
            PodErrorKind::DatapathStopped => FailureReason::DatapathStopped,
        }
    }
}

/// Why one call to an agent failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CallErrorKind {
    /// The operator's own client identity could not be loaded.
    Tls,
    ServerName,
    Connect,
    Timeout,
    Http,
    /// The agent answered 403: it does not accept the operator's identity.
    Forbidden,
    /// Any other non-success HTTP status.
    Status,
    Decode,
}

impl CallErrorKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            CallErrorKind::Tls => "tls",
            CallErrorKind::ServerName => "server_name",
            CallErrorKind::Connect => "connect",
            CallErrorKind::Timeout => "timeout",
            CallErrorKind::Http => "http",
            CallErrorKind::Forbidden => "forbidden",
            CallErrorKind::Status => "status",
            CallErrorKind::Decode => "decode",
        }
    }

    /// What the pods of the node fail with: a refusal will not go away by retrying, anything else may.
    pub const fn reason(self) -> FailureReason {
        match self {
            CallErrorKind::Forbidden => FailureReason::AgentRefused,
            _ => FailureReason::AgentUnreachable,
        }
    }
}

impl fmt::Display for CallErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for CallErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCUMENTED: &str = include_str!("../../docs/troubleshooting.md");

    /// The texts users and alerts see, byte for byte; each failure reason has its row in the troubleshooting
    /// table.
    #[test]
    fn every_reason_keeps_its_text_and_its_documentation() {
        let reasons = [
            (FailureReason::HostNetwork, "HostNetwork"),
            (FailureReason::AgentUnavailable, "AgentUnavailable"),
            (FailureReason::AgentUnreachable, "AgentUnreachable"),
            (FailureReason::AgentRefused, "AgentRefused"),
            (FailureReason::InvalidPlan, "InvalidPlan"),
            (FailureReason::PodNotFound, "PodNotFound"),
            (FailureReason::NamespaceConflict, "NamespaceConflict"),
            (FailureReason::TooManyDestinations, "TooManyDestinations"),
            (FailureReason::TooManyPairs, "TooManyPairs"),
            (FailureReason::InterfaceNotFound, "InterfaceNotFound"),
            (FailureReason::ForeignQdisc, "ForeignQdisc"),
            (FailureReason::KernelUnsupported, "KernelUnsupported"),
            (FailureReason::DuplicateRestriction, "DuplicateRestriction"),
            (FailureReason::Kernel, "Kernel"),
            (FailureReason::DatapathStopped, "DatapathStopped"),
        ];
        assert_eq!(FailureReason::ALL, reasons.map(|(r, _)| r), "ALL lists every reason once");
        assert_eq!(FailureReason::parse("Applied"), None, "a text no failure has");
        for (reason, text) in reasons {
            assert_eq!(reason.as_str(), text);
            assert_eq!(reason.to_string(), text);
            assert_eq!(FailureReason::parse(text), Some(reason));
            assert!(DOCUMENTED.contains(&format!("\n| `{text}` |")), "{text} has no row in docs/troubleshooting.md");
        }
    }

    #[test]
    fn every_agent_error_kind_names_the_same_reason() {
        let kinds = [
            (PodErrorKind::InvalidPlan, "InvalidPlan"),
            (PodErrorKind::PodNotFound, "PodNotFound"),
            (PodErrorKind::NamespaceConflict, "NamespaceConflict"),
            (PodErrorKind::HostNetwork, "HostNetwork"),
            (PodErrorKind::InterfaceNotFound, "InterfaceNotFound"),
            (PodErrorKind::ForeignQdisc, "ForeignQdisc"),
            (PodErrorKind::KernelUnsupported, "KernelUnsupported"),
            (PodErrorKind::DuplicateRestriction, "DuplicateRestriction"),
            (PodErrorKind::Kernel, "Kernel"),
            (PodErrorKind::DatapathStopped, "DatapathStopped"),
        ];
        for (kind, text) in kinds {
            // The agent's own wire name for the kind is the operator's reason.
            assert_eq!(serde_json::to_value(kind).unwrap(), text);
            assert_eq!(FailureReason::from(kind).as_str(), text);
        }
    }

    #[test]
    fn call_error_kinds_keep_their_metric_labels() {
        let kinds = [
            (CallErrorKind::Tls, "tls", FailureReason::AgentUnreachable),
            (CallErrorKind::ServerName, "server_name", FailureReason::AgentUnreachable),
            (CallErrorKind::Connect, "connect", FailureReason::AgentUnreachable),
            (CallErrorKind::Timeout, "timeout", FailureReason::AgentUnreachable),
            (CallErrorKind::Http, "http", FailureReason::AgentUnreachable),
            (CallErrorKind::Forbidden, "forbidden", FailureReason::AgentRefused),
            (CallErrorKind::Status, "status", FailureReason::AgentUnreachable),
            (CallErrorKind::Decode, "decode", FailureReason::AgentUnreachable),
        ];
        for (kind, label, reason) in kinds {
            assert_eq!((kind.as_str(), kind.reason()), (label, reason));
        }
    }
}
