//! The names the operator is configured with, checked once where they are configured so that an invalid one is
//! unrepresentable further in.

/// A Service's DNS name (`<service>.<namespace>.svc`), checked once where it is configured: a DNS name ending in
/// `.svc`, no wildcard, and so neither a node's name (`….node.isthmus`) nor a caller's identity (`….isthmus`).
/// The agents' shared name and the name of the operator's metrics listener are such names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceDnsName(String);

/// A name [`ServiceDnsName::new`] refused.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: a Service's DNS name (<service>.<namespace>.svc, no wildcard) is required")]
pub struct NotAServiceDnsName(String);

impl ServiceDnsName {
    pub fn new(name: &str) -> Result<Self, NotAServiceDnsName> {
        let valid = name.ends_with(".svc")
            && !name.contains('*')
            && rustls::pki_types::ServerName::try_from(name)
                .is_ok_and(|n| matches!(n, rustls::pki_types::ServerName::DnsName(_)));
        if valid { Ok(Self(name.to_owned())) } else { Err(NotAServiceDnsName(name.to_owned())) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Service the name is of, (namespace, name), when it is `<service>.<namespace>.svc` exactly.
    pub fn service(&self) -> Option<(&str, &str)> {
        let mut labels = self.0.split('.');
        match (labels.next(), labels.next(), labels.next(), labels.next()) {
            (Some(name), Some(namespace), Some("svc"), None) => Some((namespace, name)),
            _ => None,
        }
    }
}

impl std::fmt::Display for ServiceDnsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_services_dns_name_can_be_configured() {
        // A name that is no Service's, or a wildcard, or a caller's identity, or a node's name.
        for bad in
            ["*.isthmus-system.svc", "isthmus-operator.isthmus-system.serviceaccount.isthmus", "x.node.isthmus", ""]
        {
            let refused = ServiceDnsName::new(bad).unwrap_err().to_string();
            assert!(refused.contains("a Service's DNS name") && refused.contains(&format!("{bad:?}")), "{refused}");
        }
        let name = "isthmus-agent-metrics.isthmus-system.svc";
        assert_eq!(ServiceDnsName::new(name).unwrap().as_str(), name);
        assert_eq!(ServiceDnsName::new(name).unwrap().to_string(), name);
    }

    #[test]
    fn the_service_is_read_from_its_name() {
        let name = |n: &str| ServiceDnsName::new(n).unwrap().service().map(|(a, b)| (a.to_owned(), b.to_owned()));
        assert_eq!(
            name("isthmus-webhook.isthmus-system.svc"),
            Some(("isthmus-system".into(), "isthmus-webhook".into()))
        );
        assert_eq!(name("a.b.c.svc"), None);
    }
}
