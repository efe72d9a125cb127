//! `isthmus-agent explain`: run inside the agent's pod (`kubectl isthmus explain` execs it there), it finds a
//! pod's network namespace by the pod's UID and IPs with the agent's own resolver, and prints, as one JSON
//! [`ExplainReport`], what is installed there for one destination address. It reads only; it changes nothing
//! and does not talk to the running agent.

use std::net::IpAddr;
use std::sync::Arc;

use isthmus_agent_api::explain::{ExplainReport, InstalledPath};

use isthmus_datapaths::datapath::{Datapath, DatapathError};
use isthmus_datapaths::netns::{Netns, PodIdentity, ResolveError, Resolver, Sources, inventory_many};
use isthmus_datapaths::userspace::capture::POD_END;

/// The pod and the address to explain (the subcommand's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainRequest {
    /// The pod's UID (its namespace is found as the agent finds it: by UID and IPs).
    #[arg(long)]
    pub uid: String,
    /// The pod's IPs (repeat for dual stack).
    #[arg(long = "ip", required = true)]
    pub ips: Vec<IpAddr>,
    /// The pod's interface.
    #[arg(long, default_value = "eth0")]
    pub interface: String,
    /// The destination address.
    #[arg(long)]
    pub destination: IpAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("cannot read this node's network namespaces: {0}")]
    Namespaces(#[from] std::io::Error),
    #[error("pod {uid}: {source}")]
    Resolve { uid: String, source: ResolveError },
    #[error("pod {uid}: the resolver returned nothing for it")]
    Unresolved { uid: String },
    #[error("cannot read the pod's interface: {0}")]
    Datapath(#[from] DatapathError),
    #[error("cannot enter the pod's network namespace {0} to list its interfaces")]
    Inventory(String),
}

pub async fn explain(sources: Sources, request: ExplainRequest) -> Result<ExplainReport, ExplainError> {
    let identity = PodIdentity { uid: request.uid.clone(), ips: request.ips.clone() };
    // The resolver enters namespaces from threads of its own and blocks on them.
    let resolved = tokio::task::spawn_blocking(move || -> Result<_, std::io::Error> {
        Ok(Resolver::new(sources)?.resolve(std::slice::from_ref(&identity)))
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    let netns: Arc<Netns> = match resolved.into_iter().find(|(uid, _)| *uid == request.uid) {
        Some((_, Ok(ns))) => ns,
        Some((uid, Err(source))) => return Err(ExplainError::Resolve { uid, source }),
        None => return Err(ExplainError::Unresolved { uid: request.uid }),
    };
    let id = netns.id();
    let inventory = inventory_many(std::iter::once(netns.as_ref()), 1)
        .remove(&id)
        .flatten()
        .ok_or_else(|| ExplainError::Inventory(id.to_string()))?;
    let path = if inventory.interfaces.iter().any(|i| i == POD_END) {
        InstalledPath::Userspace { capture_interface: POD_END.to_owned() }
    } else {
        let datapath = Datapath::open(netns.fd()).await?;
        match datapath.explain(&request.interface, request.destination).await? {
            Some(path) => path,
            None => match datapath.root_kind(&request.interface).await? {
                Some(root_kind) => InstalledPath::Foreign { root_kind },
                None => InstalledPath::None,
            },
        }
    };
    Ok(ExplainReport { netns: id.to_string(), interface: request.interface, path })
}
