//! Names both sides agree on: the DNS name that identifies a node's agent, and the Kubernetes signer that issues
//! the agents' serving certificates.
//!
//! Every agent serves a certificate for its own node's name and the operator dials an agent under the name of
//! the node it means, so a certificate issued for node-a is refused when presented by the agent the operator
//! believes is on node-b (a stale pod IP reused by another node, or a compromised agent answering for others).

/// The `signerName` of the CertificateSigningRequests through which agents obtain their serving certificates;
/// the operator approves and signs them.
pub const AGENT_SIGNER_NAME: &str = "isthmus.dev/agent-serving";

/// The suffix of every agent's DNS name: distinct from the operator's and the scraper's identities
/// (`….serviceaccount.isthmus`, `….isthmus`), so that no node name can produce a caller's identity.
pub const NODE_NAME_SUFFIX: &str = ".node.isthmus";

/// The longest DNS name (RFC 1035, without the trailing dot).
const MAX_DNS_NAME: usize = 253;

/// The DNS name the agent on `node` serves and the operator dials it under: `<node>.node.isthmus`.
///
/// Node names are DNS-1123 subdomains (lower-case alphanumerics, `-` and `.`, labels of at most 63 characters,
/// 253 in all), so the name is a valid DNS name unless the node's name is longer than 240 characters; such a
/// node (and any name Kubernetes would not accept) is refused rather than shortened, because a shortened name
/// could collide with another node's.
pub fn node_server_name(node: &str) -> Result<String, NodeNameError> {
    if node.is_empty() {
        return Err(NodeNameError::Empty);
    }
    let name = format!("{node}{NODE_NAME_SUFFIX}");
    if name.len() > MAX_DNS_NAME {
        return Err(NodeNameError::TooLong { node: node.to_owned(), max: MAX_DNS_NAME - NODE_NAME_SUFFIX.len() });
    }
    for label in node.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(NodeNameError::Label { node: node.to_owned(), label: label.to_owned() });
        }
    }
    Ok(name)
}

/// The node a name from [`node_server_name`] stands for, or None when it is not such a name.
pub fn node_of_server_name(name: &str) -> Option<&str> {
    let node = name.strip_suffix(NODE_NAME_SUFFIX)?;
    (node_server_name(node).ok()?.len() == name.len()).then_some(node)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeNameError {
    #[error("node name is empty")]
    Empty,
    #[error("node name {node:?} is longer than {max} characters, the most an agent's DNS name leaves for it")]
    TooLong { node: String, max: usize },
    #[error(
        "node name {node:?} is not a DNS-1123 subdomain: label {label:?} (lower-case letters, digits and '-', \
         at most 63, not starting or ending with '-')"
    )]
    Label { node: String, label: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_becomes_a_dns_name_under_the_node_suffix() {
        assert_eq!(node_server_name("node-a").unwrap(), "node-a.node.isthmus");
        assert_eq!(
            node_server_name("ip-10-0-0-1.eu-west-1.compute.internal").unwrap(),
            "ip-10-0-0-1.eu-west-1.compute.internal.node.isthmus"
        );
        assert_eq!(node_of_server_name("node-a.node.isthmus"), Some("node-a"));
        assert_eq!(node_of_server_name("isthmus-operator.isthmus-system.serviceaccount.isthmus"), None);
        assert_eq!(node_of_server_name("*.node.isthmus"), None);
    }

    #[test]
    fn names_kubernetes_would_refuse_or_too_long_are_refused() {
        assert_eq!(node_server_name(""), Err(NodeNameError::Empty));
        let longest = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(48));
        assert_eq!(longest.len(), 240);
        assert_eq!(node_server_name(&longest).unwrap().len(), 253);
        let too_long = format!("{longest}d");
        assert!(matches!(node_server_name(&too_long), Err(NodeNameError::TooLong { max: 240, .. })));
        for bad in ["*", "Node-A", "a..b", "-a", "a-", "a_b", "a b", &"x".repeat(64), "a.", ".a"] {
            assert!(
                matches!(node_server_name(bad), Err(NodeNameError::Label { .. })),
                "{bad:?} accepted: {:?}",
                node_server_name(bad)
            );
        }
    }
}
