//! Reading an interface's isthmus tree back from a dump: the counters per destination ([`Datapath::observe`]),
//! and the desired state the tree implements ([`Datapath::installed`], for adopting trees after a restart).

use ipnet::IpNet;
use isthmus_agent_api::Counters;

use super::desired::DesiredState;
use super::error::{DatapathError, Place};
use super::installed::{self, RootState};
use super::model::*;
use super::queue::QueueBudget;
use super::reconcile::{Datapath, Dump};
use super::units;

impl Datapath {
    /// Per destination: the counters of its class, with overlimits summed over its TBF and netem. Drops are the
    /// class's alone: a packet dropped by netem (loss, a full queue) or TBF is counted by that qdisc *and* by
    /// every parent it returns the drop to (TBF, then the HTB class), so summing them counted each drop two or
    /// three times. `None` when no isthmus tree is on the interface.
    pub async fn observe(&self, interface: &str) -> Result<Option<Vec<(IpNet, Counters)>>, DatapathError> {
        let Some((_, dump, ours)) = self.dump_isthmus_tree(interface).await? else { return Ok(None) };
        let counters_of = |h: Handle| dump.counters.iter().find(|(x, _)| *x == h).map(|(_, c)| *c);
        let observed = installed::installed_destinations(&ours)
            .into_iter()
            .map(|(dst, slot)| {
                let mut total = counters_of(slot.class()).unwrap_or_default();
                for qdisc in [slot.tbf(), slot.netem()] {
                    if let Some(c) = counters_of(qdisc) {
                        total.overlimits += c.overlimits;
                    }
                }
                (dst, total)
            })
            .collect();
        Ok(Some(observed))
    }

    /// The destinations and impairments isthmus has installed on the interface (for adoption after a
    /// restart), as far as the kernel's units allow reading them back; a queue equal to what `budget` makes of
    /// its impairment reads back as no `queueLimit`. `None` when no isthmus tree is there.
    pub async fn installed(&self, interface: &str, budget: QueueBudget) -> Result<Option<DesiredState>, DatapathError> {
        let Some((place, _, ours)) = self.dump_isthmus_tree(interface).await? else { return Ok(None) };
        let qdisc = |h: Handle| {
            ours.iter().find_map(|o| match o {
                TcObject::Qdisc(q) if q.handle == h => Some(&q.kind),
                _ => None,
            })
        };
        let slots = installed::installed_destinations(&ours);
        let (_, mtu) = self.link(interface).await?;
        let bound = budget.bound(slots.len()).with_mtu(mtu);
        let destinations = slots.into_iter().map(|(dst, slot)| {
            let tbf = match qdisc(slot.tbf()) {
                Some(QdiscKind::Tbf(t)) => Some(t),
                _ => None,
            };
            let netem = match qdisc(slot.netem()) {
                Some(QdiscKind::Netem(n)) => Some(n),
                _ => None,
            };
            let impairment = units::impairment_of(tbf, netem, bound);
            impairment.map(|i| (dst, i)).map_err(|e| DatapathError::invalid(Some(dst), e.field, e.reason))
        });
        let destinations: Result<Vec<_>, _> = destinations.collect();
        let desired = destinations.and_then(|d| DesiredState::with_budget(d, budget)).map(|d| d.with_mtu(mtu));
        desired.map(Some).map_err(|e| DatapathError::Protocol {
            place,
            message: format!("the installed tree does not read back as a valid desired state: {e}"),
        })
    }

    /// The interface's dump and the isthmus objects in it; `None` when no isthmus tree is there.
    pub(super) async fn dump_isthmus_tree(
        &self,
        interface: &str,
    ) -> Result<Option<(Place, Dump, Vec<TcObject>)>, DatapathError> {
        let place = self.place(interface);
        let ifindex = self.ifindex(interface).await?;
        let dump = self.dump(&place, ifindex).await?;
        if installed::root_state(&dump.objects) != RootState::Isthmus {
            return Ok(None);
        }
        let ours = installed::owned(&dump.objects);
        Ok(Some((place, dump, ours)))
    }
}
