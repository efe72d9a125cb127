//! The datapath's errors. Every error that comes from the kernel names the network namespace and interface
//! and keeps the kernel's extended-ack text, so the message can reach a NetworkLink's status unchanged.

use ipnet::IpNet;
use isthmus_agent_api::PodErrorKind;

use crate::netns::NetnsId;
use crate::netns::socket::SocketError;

/// Where an operation ran: the namespace and, once known, the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub netns: NetnsId,
    pub interface: String,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "netns {} interface {}", self.netns, self.interface)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The desired state itself is impossible; `field` names what is wrong.
    #[error("{}{field}: {reason}", destination.map(|d| format!("destination {d}: ")).unwrap_or_default())]
    InvalidPlan { destination: Option<IpNet>, field: String, reason: String },

    #[error("{place}: no such interface")]
    InterfaceNotFound { place: Place },

    /// A root qdisc isthmus did not install sits on the interface; isthmus never replaces it.
    #[error("{place}: root qdisc {kind} {handle} was not installed by isthmus; refusing to replace it")]
    ForeignQdisc { place: Place, kind: String, handle: String },

    /// The kernel lacks a qdisc or classifier (e.g. netem on a kernel built without sch_netem).
    #[error("{place}: the kernel does not support {kind}: {message}")]
    KernelUnsupported { place: Place, kind: String, message: String },

    /// The kernel refuses a duplicating netem beside other netems on one interface (6.16+ and backports).
    #[error(
        "{place}: {message} (a duplicating destination cannot share an interface with other netem destinations on this kernel)"
    )]
    DuplicateRestriction { place: Place, message: String },

    /// Any other error the kernel returned for a request, with its errno and extended-ack text.
    #[error("{place}: {operation}: {message} (errno {errno})")]
    Kernel { place: Place, operation: String, errno: i32, message: String },

    /// Entering the namespace or creating the netlink socket in it failed.
    #[error("netns {netns}: {action}: {source}")]
    Namespace { netns: NetnsId, action: &'static str, source: std::io::Error },

    /// The namespace could not be held or created in the first place.
    #[error("network namespace: {action}: {source}")]
    NamespaceUnavailable { action: &'static str, source: std::io::Error },

    /// The kernel's reply could not be understood.
    #[error("{place}: {message}")]
    Protocol { place: Place, message: String },
}

impl From<SocketError> for DatapathError {
    fn from(SocketError { netns, action, source }: SocketError) -> Self {
        DatapathError::Namespace { netns, action, source }
    }
}

impl DatapathError {
    pub fn kind(&self) -> PodErrorKind {
        match self {
            DatapathError::InvalidPlan { .. } => PodErrorKind::InvalidPlan,
            DatapathError::InterfaceNotFound { .. } => PodErrorKind::InterfaceNotFound,
            DatapathError::ForeignQdisc { .. } => PodErrorKind::ForeignQdisc,
            DatapathError::KernelUnsupported { .. } => PodErrorKind::KernelUnsupported,
            DatapathError::DuplicateRestriction { .. } => PodErrorKind::DuplicateRestriction,
            DatapathError::Kernel { .. }
            | DatapathError::Namespace { .. }
            | DatapathError::NamespaceUnavailable { .. }
            | DatapathError::Protocol { .. } => PodErrorKind::Kernel,
        }
    }

    pub(crate) fn invalid(destination: Option<IpNet>, field: impl Into<String>, reason: impl Into<String>) -> Self {
        DatapathError::InvalidPlan { destination, field: field.into(), reason: reason.into() }
    }

    /// Classifies a kernel error reply for `operation` (e.g. "add qdisc netem 3000:") by errno and extack text.
    pub(crate) fn from_kernel(
        place: Place,
        operation: String,
        kind: Option<&str>,
        errno: i32,
        message: String,
    ) -> Self {
        if message.contains("cannot mix duplicating netems") {
            return DatapathError::DuplicateRestriction { place, message };
        }
        let unknown_kind = message.contains("Specified qdisc kind is unknown")
            || message.contains("Unknown qdisc")
            || message.contains("Specified filter kind is unknown")
            || message.contains("Unknown filter")
            || message.contains("TC classifier not found");
        if (unknown_kind || errno == libc::EOPNOTSUPP || (errno == libc::ENOENT && message.is_empty()))
            && let Some(kind) = kind
            && errno != libc::EEXIST
        {
            let message =
                if message.is_empty() { std::io::Error::from_raw_os_error(errno).to_string() } else { message };
            return DatapathError::KernelUnsupported { place, kind: kind.to_owned(), message };
        }
        let message = if message.is_empty() { std::io::Error::from_raw_os_error(errno).to_string() } else { message };
        DatapathError::Kernel { place, operation, errno, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> Place {
        Place { netns: NetnsId { dev: 4, inode: 4026531840 }, interface: "eth0".into() }
    }

    #[test]
    fn kernel_messages_map_to_typed_errors_and_keep_context() {
        let dup = DatapathError::from_kernel(
            place(),
            "add qdisc netem 3000:".into(),
            Some("netem"),
            libc::EINVAL,
            "netem: cannot mix duplicating netems with other netems in tree".into(),
        );
        assert_eq!(dup.kind(), PodErrorKind::DuplicateRestriction);
        let text = dup.to_string();
        assert!(text.contains("net:[4026531840]") && text.contains("eth0") && text.contains("cannot mix"), "{text}");

        let unknown = DatapathError::from_kernel(
            place(),
            "add qdisc netem 3000:".into(),
            Some("netem"),
            libc::ENOENT,
            "Error: Specified qdisc kind is unknown.".into(),
        );
        assert_eq!(unknown.kind(), PodErrorKind::KernelUnsupported);
        assert!(unknown.to_string().contains("does not support netem"), "{unknown}");

        let other = DatapathError::from_kernel(
            place(),
            "delete class 1570:1000".into(),
            Some("htb"),
            libc::EBUSY,
            "HTB class in use".into(),
        );
        assert_eq!(other.kind(), PodErrorKind::Kernel);
        assert!(other.to_string().contains("HTB class in use") && other.to_string().contains("errno 16"));
    }

    #[test]
    fn invalid_plan_names_destination_and_field() {
        let e = DatapathError::invalid(Some("10.0.0.1/32".parse().unwrap()), "rate", "below 8 bit/s");
        assert_eq!(e.to_string(), "destination 10.0.0.1/32: rate: below 8 bit/s");
        assert_eq!(e.kind(), PodErrorKind::InvalidPlan);
    }
}
