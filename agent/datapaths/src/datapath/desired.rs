//! The desired state of one interface: destinations (host addresses or CIDRs, IPv4 and IPv6) → impairment,
//! checked against what the datapath can install (one slot per destination, the kernel's field widths), with the
//! bound its queues are held to.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{Impairment, ImpairmentFields};

use super::error::DatapathError;
use super::handles::MAX_DESTINATIONS;
use super::queue::{QueueBound, QueueBudget};
use super::units::{burst_bytes, tbf_buffer_ticks};

/// Desired state for one interface: destinations (host addresses or CIDRs, IPv4 and IPv6) → impairment, sorted
/// by destination. Impairments are shared (`Arc`): a node's plan holds many destinations with the same one.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredState {
    destinations: Vec<(IpNet, Arc<Impairment>)>,
    /// What each destination's queues may hold: the budget's bound for this many destinations.
    queue_bound: QueueBound,
}

impl Default for DesiredState {
    fn default() -> Self {
        Self { destinations: Vec::new(), queue_bound: QueueBudget::DEFAULT.bound(0) }
    }
}

impl DesiredState {
    /// [`Self::with_budget`] with the default [`QueueBudget`].
    pub fn new<I: Into<Arc<Impairment>>>(
        destinations: impl IntoIterator<Item = (IpNet, I)>,
    ) -> Result<Self, DatapathError> {
        Self::with_budget(destinations, QueueBudget::DEFAULT)
    }

    /// Rejects duplicate destinations (after masking host bits), impairments beyond the kernel's fields and more
    /// destinations than the handle space allows; errors name the destination and field. The impairments
    /// themselves are valid by their type. Queues are held to `budget`'s bound for this many destinations.
    pub fn with_budget<I: Into<Arc<Impairment>>>(
        destinations: impl IntoIterator<Item = (IpNet, I)>,
        budget: QueueBudget,
    ) -> Result<Self, DatapathError> {
        let mut map = BTreeMap::new();
        for (dst, impairment) in destinations {
            let net = dst.trunc();
            let impairment = impairment.into();
            check_representable(net, impairment.fields())?;
            if map.insert(net, impairment).is_some() {
                return Err(DatapathError::invalid(
                    Some(net),
                    "destination",
                    if net == dst { "listed twice".to_owned() } else { format!("{dst} duplicates another entry") },
                ));
            }
            if map.len() > MAX_DESTINATIONS {
                return Err(DatapathError::invalid(
                    None,
                    "destinations",
                    format!("more than {MAX_DESTINATIONS} destinations on one interface"),
                ));
            }
        }
        let queue_bound = budget.bound(map.len());
        Ok(DesiredState { destinations: map.into_iter().collect(), queue_bound })
    }

    pub fn empty() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.destinations.is_empty()
    }

    pub fn len(&self) -> usize {
        self.destinations.len()
    }

    pub fn destinations(&self) -> impl Iterator<Item = (&IpNet, &Impairment)> {
        self.destinations.iter().map(|(destination, impairment)| (destination, impairment.as_ref()))
    }

    /// What each destination's queues may hold.
    pub fn queue_bound(&self) -> QueueBound {
        self.queue_bound
    }

    /// The same state on an interface whose MTU is `mtu`: netem's packet limits and the largest packet a TBF
    /// passes before netem follow the interface's frame (the datapath reads the MTU when it applies a state).
    pub fn with_mtu(&self, mtu: u32) -> DesiredState {
        DesiredState { destinations: self.destinations.clone(), queue_bound: self.queue_bound.with_mtu(mtu) }
    }

    pub fn get(&self, destination: &IpNet) -> Option<&Impairment> {
        let index = self.destinations.binary_search_by(|(d, _)| d.cmp(destination)).ok()?;
        Some(&self.destinations[index].1)
    }
}

/// Limits of the kernel's fields that an [`Impairment`]'s own checks do not know about; the error names `dst`
/// and the field. The apply checks each destination with it first, so that one the kernel cannot hold is refused
/// alone.
pub fn check_representable(dst: IpNet, imp: &ImpairmentFields) -> Result<(), DatapathError> {
    // The kernel keeps TBF's bucket as 32-bit psched ticks (at most 275 s of sending at the rate).
    if let Some(rate) = imp.rate_bps
        && tbf_buffer_ticks((rate / 8).max(1), burst_bytes(imp)) > u64::from(u32::MAX)
    {
        let burst = burst_bytes(imp);
        // The NetworkLink's names for the fields, so that the status names what the user wrote.
        let field = if imp.burst_bytes.is_some() { "burst" } else { "bandwidth" };
        return Err(DatapathError::invalid(
            Some(dst),
            field,
            format!("{burst} bytes of burst take longer than the kernel's 275 s bucket limit to send at {rate} bit/s"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use isthmus_agent_api::test_util::rate;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn desired_state_rejects_bad_input_naming_destination_and_field() {
        // An impairment that is invalid in itself cannot be built; the agent's plan decoding reports one
        // (node::plan's tests). What is left here are the datapath's own limits.
        let dup = DesiredState::new([
            (net("10.0.0.0/24"), Impairment::default()),
            (net("10.0.0.7/24"), Impairment::default()),
        ]);
        let text = dup.unwrap_err().to_string();
        assert!(text.contains("10.0.0.0/24") && text.contains("duplicates"), "{text}");

        let crawl = DesiredState::new([(net("10.0.0.1/32"), rate(64))]);
        let text = crawl.unwrap_err().to_string();
        assert!(text.contains("bandwidth") && text.contains("275 s"), "{text}");

        let too_many = DesiredState::new(
            (0..=MAX_DESTINATIONS as u32)
                .map(|i| (IpNet::from(IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i))), Impairment::default())),
        );
        assert!(too_many.unwrap_err().to_string().contains("more than 4095 destinations"));
    }
}
