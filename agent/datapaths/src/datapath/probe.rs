//! Which qdiscs and classifiers the running kernel supports, tried for real in a scratch network namespace
//! that exists only for the probe (it disappears with the probe's socket, also on error).

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use isthmus_agent_api::{Capabilities, Correlated, Impairment, ImpairmentFields, Percent};
use tracing::{info, warn};

use super::desired::DesiredState;
use super::error::{DatapathError, Place};
use super::handles::{DEFAULT_CLASS, ROOT_QDISC};
use super::model::*;
use super::queue::QueueBudget;
use super::reconcile::Datapath;
use super::{tree, units};

/// Loopback exists, down, in every new namespace; qdiscs attach to it like to any other device.
const PROBE_INTERFACE: &str = "lo";

/// Probes the kernel. Never fails: what cannot be tried is reported as unsupported (and logged).
pub async fn probe() -> Capabilities {
    let kernel_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let mut caps = Capabilities { kernel_release, ..Default::default() };
    match probe_in_scratch(&mut caps).await {
        Ok(()) => info!(?caps, "kernel capabilities probed"),
        Err(e) => warn!(error = %e, ?caps, "capability probe incomplete"),
    }
    caps
}

async fn probe_in_scratch(caps: &mut Capabilities) -> Result<(), DatapathError> {
    let datapath = Datapath::open_scratch().await?;
    let place = Place { netns: datapath.netns(), interface: PROBE_INTERFACE.to_owned() };
    let ifindex = datapath.ifindex(PROBE_INTERFACE).await?;
    let supported = |r: Result<(), DatapathError>| match r {
        Ok(()) => Ok(true),
        Err(DatapathError::KernelUnsupported { .. }) => Ok(false),
        Err(e) => Err(e),
    };

    let slot = |i| super::handles::Slot::new(i).expect("slot 0 exists");
    let netem_qdisc = Qdisc {
        handle: slot(0).netem(),
        parent: Handle::ROOT,
        kind: QdiscKind::Netem(units::netem_for(
            &ImpairmentFields { latency: Some(Duration::from_millis(1)), ..Default::default() },
            QueueBudget::DEFAULT.bound(1),
        )),
    };
    let tbf_qdisc = Qdisc {
        handle: slot(0).tbf(),
        parent: Handle::ROOT,
        kind: QdiscKind::Tbf(
            units::tbf_for(
                &ImpairmentFields { rate_bps: Some(1_000_000), ..Default::default() },
                QueueBudget::DEFAULT.bound(1),
            )
            .expect("rate"),
        ),
    };
    caps.tbf = try_root_qdisc(&datapath, &place, ifindex, tbf_qdisc).await?;
    caps.netem = try_root_qdisc(&datapath, &place, ifindex, netem_qdisc).await?;

    // htb and u32 together: the smallest isthmus tree (root, default class, catch-all filter).
    let one = DesiredState::new([(IpNet::from(std::net::IpAddr::from([192, 0, 2, 1])), Impairment::default())])?;
    let objects = tree::build(&one, &BTreeMap::from([(*one.destinations().next().expect("one").0, slot(0))]));
    let (root, rest): (Vec<_>, Vec<_>) =
        objects.into_iter().partition(|o| matches!(o, TcObject::Qdisc(q) if q.handle == ROOT_QDISC));
    caps.htb = supported(datapath.send(&place, ifindex, root.into_iter().map(Operation::Add).collect()).await)?;
    if caps.htb {
        let (filters, classes): (Vec<_>, Vec<_>) = rest.into_iter().partition(|o| matches!(o, TcObject::Filter(_)));
        datapath.send(&place, ifindex, classes.into_iter().map(Operation::Add).collect()).await?;
        let catch_all: Vec<_> = filters
            .into_iter()
            .filter(|o| matches!(o, TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) if u.class_id == Some(DEFAULT_CLASS)))
            .map(Operation::Add)
            .collect();
        caps.u32 = supported(datapath.send(&place, ifindex, catch_all).await)?;
        datapath.reconcile(PROBE_INTERFACE, &DesiredState::empty()).await?;
    }

    if caps.htb && caps.netem {
        caps.duplicate_restricted = duplicate_restricted(&datapath).await?;
        datapath.reconcile(PROBE_INTERFACE, &DesiredState::empty()).await?;
    }
    Ok(())
}

/// Adds `qdisc` as the root and removes it again; false when the kernel does not know its kind.
async fn try_root_qdisc(datapath: &Datapath, place: &Place, ifindex: u32, qdisc: Qdisc) -> Result<bool, DatapathError> {
    match datapath.send(place, ifindex, vec![Operation::Add(TcObject::Qdisc(qdisc.clone()))]).await {
        Ok(()) => {
            datapath.send(place, ifindex, vec![Operation::Delete(TcObject::Qdisc(qdisc))]).await?;
            Ok(true)
        }
        Err(DatapathError::KernelUnsupported { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Two destinations on one interface, one of them duplicating: refused by kernels with the
/// "cannot mix duplicating netems" check (6.16 and some stable backports).
async fn duplicate_restricted(datapath: &Datapath) -> Result<bool, DatapathError> {
    let plain = ImpairmentFields { latency: Some(Duration::from_millis(1)), ..Default::default() };
    let duplicating = ImpairmentFields {
        duplicate: Some(Correlated {
            percent: Percent::new("duplicate", 1.0).expect("valid"),
            correlation: Percent::ZERO,
        }),
        ..plain.clone()
    };
    let (plain, duplicating) = (
        Impairment::try_from(plain).expect("1 ms of latency is valid"),
        Impairment::try_from(duplicating).expect("1 ms and 1 % duplicates are valid"),
    );
    let two = DesiredState::new([
        (IpNet::from(std::net::IpAddr::from([192, 0, 2, 1])), plain),
        (IpNet::from(std::net::IpAddr::from([192, 0, 2, 2])), duplicating),
    ])?;
    match datapath.reconcile(PROBE_INTERFACE, &two).await {
        Ok(_) => Ok(false),
        Err(DatapathError::DuplicateRestriction { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}
