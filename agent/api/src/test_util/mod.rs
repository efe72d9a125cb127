//! Plan builders for tests and benchmarks (cargo feature `test-util`), so that every test that sends or reads a
//! plan builds it the same way: a pod in namespace `default` shaping `eth0`, its destinations, the link that asked
//! for them, and the impairments tests use most. With the `client` feature also the HTTPS exchanges of the
//! tests that talk to a listener directly ([`https`]).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::{DestinationPlan, Direction, Impairment, ImpairmentFields, LinkRef, PodPlan};

#[cfg(feature = "client")]
pub mod https;

/// The forward direction of the NetworkLink `name` in namespace `default`.
pub fn link(name: &str) -> LinkRef {
    LinkRef { namespace: "default".into(), name: name.into(), direction: Direction::Forward }
}

/// Packets to `to` get `impairment`, asked for by `link`.
pub fn destination(to: impl Into<IpNet>, impairment: Impairment, link: LinkRef) -> DestinationPlan {
    DestinationPlan { destination: to.into(), impairment: impairment.into(), link: link.into() }
}

/// A pod in namespace `default` whose `eth0` egress is shaped towards `destinations`.
pub fn pod(uid: &str, name: &str, ips: &[IpAddr], destinations: Vec<DestinationPlan>) -> PodPlan {
    PodPlan {
        uid: uid.into(),
        namespace: "default".into(),
        name: name.into(),
        ips: ips.to_vec(),
        interface: "eth0".into(),
        host_network: false,
        destinations,
    }
}

/// A bandwidth limit and nothing else: the impairment the host kernel (no netem) can install.
pub fn rate(bits_per_second: u64) -> Impairment {
    impairment(ImpairmentFields { rate_bps: Some(bits_per_second), ..Default::default() })
}

/// The impairment with these fields; panics (fails the test) when they are not a valid impairment.
pub fn impairment(fields: ImpairmentFields) -> Impairment {
    let described = format!("{fields:?}");
    Impairment::try_from(fields).unwrap_or_else(|e| panic!("a test impairment is invalid: {e}: {described}"))
}
