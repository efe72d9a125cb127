//! Throwaway network namespaces inside the guest, joined by a veth pair: the test kit's
//! (`isthmus_test_kit::netns`), built with iproute2 (the test's scaffolding, not the product) and removed by
//! Drop, also when a test fails.
//!
//! Namespace `a` holds the source interface `va` (10.77.0.1) whose egress the datapath shapes; namespace `b`
//! holds `vb` with the destination addresses 10.77.0.2, .3, ….

use std::net::Ipv4Addr;

use isthmus_test_kit::netns;
pub use isthmus_test_kit::netns::Netns;

/// The shaped interface, in namespace `a`.
pub const SOURCE_IF: &str = netns::A_DEV;
pub const SOURCE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// Two namespaces joined by veth: the source `a` and the destinations in `b`.
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
    pub destinations: Vec<Ipv4Addr>,
}

impl VethPair {
    pub fn new(test: &str, destinations: usize) -> anyhow::Result<VethPair> {
        let destinations: Vec<Ipv4Addr> = (0..destinations).map(|i| Ipv4Addr::new(10, 77, 0, 2 + i as u8)).collect();
        let b_addrs: Vec<_> = destinations.iter().map(|d| ((*d).into(), 24)).collect();
        let base = format!("isth-{test}-{}", std::process::id());
        let netns::VethPair { a, b } = netns::VethPair::new(&base, &[(SOURCE_ADDR.into(), 24)], &b_addrs)?;
        Ok(VethPair { a, b, destinations })
    }

    /// `tc -s qdisc/class/filter show dev va` in `a`: the kernel's own account, independent of the library.
    pub fn tc_show(&self, object: &str) -> anyhow::Result<String> {
        Ok(self.a.tc(&["-s", object, "show", "dev", SOURCE_IF])?)
    }
}
