//! The pair to explain: the source pod and the destination the user named (a pod name, `namespace/pod`, or an
//! address), resolved against the operator's index to one address and what owns it.

use std::net::IpAddr;

use isthmus_operator::index::{Index, ObjectKey};

/// `DEST` as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestArg {
    Ip(IpAddr),
    Pod(ObjectKey),
}

impl DestArg {
    /// An address, `namespace/pod`, or a pod of `namespace`.
    pub fn parse(s: &str, namespace: &str) -> DestArg {
        if let Ok(ip) = s.parse() {
            return DestArg::Ip(ip);
        }
        match s.split_once('/') {
            Some((ns, name)) => DestArg::Pod(ObjectKey::new(ns, name)),
            None => DestArg::Pod(ObjectKey::new(namespace, s)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("unknown pod {0}")]
    UnknownPod(ObjectKey),
    #[error("pod {0} has no IP yet (not scheduled or not started)")]
    NoIp(ObjectKey),
}

/// The destination address and, where the index knows, whose it is (`pod ns/name`, `service ns/name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub ip: IpAddr,
    pub owner: Option<String>,
}

/// Resolves `dest` for a source with `source_ips`: a pod's address of the source's family where it has one
/// (a dual-stack pod's IPv4 address for an IPv4 source), else its first.
pub fn destination(index: &Index, dest: &DestArg, source_ips: &[IpAddr]) -> Result<Destination, TargetError> {
    match dest {
        DestArg::Ip(ip) => Ok(Destination { ip: *ip, owner: owner(index, *ip) }),
        DestArg::Pod(key) => {
            let pod = index.pods.get(key).ok_or_else(|| TargetError::UnknownPod(key.clone()))?;
            let v4 = source_ips.first().is_none_or(IpAddr::is_ipv4);
            let ip = pod.ips.iter().find(|ip| ip.is_ipv4() == v4).or(pod.ips.first());
            let ip = *ip.ok_or_else(|| TargetError::NoIp(key.clone()))?;
            Ok(Destination { ip, owner: Some(format!("pod {key}")) })
        }
    }
}

/// The pod (pending or running) or the Service whose address `ip` is.
fn owner(index: &Index, ip: IpAddr) -> Option<String> {
    let pod = index.pods.iter().find(|(_, p)| p.usable() && p.ips.contains(&ip));
    if let Some((key, _)) = pod {
        return Some(format!("pod {key}"));
    }
    index.services.iter().find(|(_, s)| s.cluster_ips.contains(&ip)).map(|(key, _)| format!("service {key}"))
}

#[cfg(test)]
mod tests {
    use isthmus_operator::index::{PodInfo, PodPhase, ServiceInfo};

    use super::*;

    fn index() -> Index {
        let mut index = Index::default();
        let pod = |ips: &[&str]| PodInfo {
            uid: "u".into(),
            labels: Default::default(),
            node: Some("n1".into()),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            phase: PodPhase::Running,
            terminating: false,
            host_network: false,
        };
        index.pods.insert(ObjectKey::new("shop", "db"), pod(&["fd00::9", "10.0.0.9"]));
        index.pods.insert(ObjectKey::new("shop", "pending"), pod(&[]));
        let svc = ServiceInfo { selector: Default::default(), cluster_ips: vec!["10.96.0.5".parse().unwrap()] };
        index.services.insert(ObjectKey::new("shop", "db"), svc);
        index
    }

    #[test]
    fn dest_arguments_parse_as_address_qualified_or_local_pod() {
        assert_eq!(DestArg::parse("10.0.0.9", "ns"), DestArg::Ip("10.0.0.9".parse().unwrap()));
        assert_eq!(DestArg::parse("fd00::9", "ns"), DestArg::Ip("fd00::9".parse().unwrap()));
        assert_eq!(DestArg::parse("other/db", "ns"), DestArg::Pod(ObjectKey::new("other", "db")));
        assert_eq!(DestArg::parse("db", "ns"), DestArg::Pod(ObjectKey::new("ns", "db")));
    }

    #[test]
    fn a_pod_resolves_to_its_address_of_the_source_family() {
        let index = index();
        let db = DestArg::Pod(ObjectKey::new("shop", "db"));
        let v4 = destination(&index, &db, &["10.0.0.1".parse().unwrap()]).unwrap();
        assert_eq!(v4.ip, "10.0.0.9".parse::<IpAddr>().unwrap());
        let v6 = destination(&index, &db, &["fd00::1".parse().unwrap()]).unwrap();
        assert_eq!(v6.ip, "fd00::9".parse::<IpAddr>().unwrap());
        assert_eq!(v6.owner.as_deref(), Some("pod shop/db"));
    }

    #[test]
    fn addresses_name_their_owner_and_bad_pods_are_errors() {
        let index = index();
        let svc = destination(&index, &DestArg::Ip("10.96.0.5".parse().unwrap()), &[]).unwrap();
        assert_eq!(svc.owner.as_deref(), Some("service shop/db"));
        let none = destination(&index, &DestArg::Ip("192.0.2.1".parse().unwrap()), &[]).unwrap();
        assert_eq!(none.owner, None);
        let unknown = destination(&index, &DestArg::Pod(ObjectKey::new("shop", "nope")), &[]).unwrap_err();
        assert_eq!(unknown.to_string(), "unknown pod shop/nope");
        let pending = destination(&index, &DestArg::Pod(ObjectKey::new("shop", "pending")), &[]).unwrap_err();
        assert_eq!(pending, TargetError::NoIp(ObjectKey::new("shop", "pending")));
    }
}
