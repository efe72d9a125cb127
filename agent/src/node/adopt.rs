//! Adoption: the isthmus trees already installed when the agent starts are found and kept as they are, so that
//! impairments do not flap while the agent restarts; the first plan then says which are still wanted. The
//! cleanup mode finds trees the same way.

use std::sync::Arc;

use futures::StreamExt;

use super::state::AdoptedEntry;
use isthmus_datapaths::datapath::Datapath;
use isthmus_datapaths::netns::{self, NetnsId, Sources};

/// Every (namespace, interface) holding an isthmus tree, except in `skip` (the agent's own namespace).
pub(super) async fn find_installed(
    sources: &Sources,
    skip: Option<NetnsId>,
    parallelism: usize,
) -> std::io::Result<Vec<AdoptedEntry>> {
    let sources = sources.clone();
    let (namespaces, inventories) = tokio::task::spawn_blocking(move || {
        let namespaces = netns::all_namespaces(&sources)?;
        let inventories = netns::inventory_many(namespaces.iter(), parallelism);
        Ok::<_, std::io::Error>((namespaces, inventories))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut candidates = Vec::new();
    for ns in namespaces {
        if Some(ns.id()) == skip {
            continue;
        }
        let Some(Some(inventory)) = inventories.get(&ns.id()) else { continue };
        let ns = Arc::new(ns);
        for interface in &inventory.interfaces {
            candidates.push(AdoptedEntry { netns: ns.clone(), interface: interface.clone() });
        }
    }
    let found: Vec<Option<AdoptedEntry>> =
        futures::stream::iter(candidates).map(holds_a_tree).buffer_unordered(parallelism.max(1)).collect().await;
    Ok(found.into_iter().flatten().collect())
}

/// The entry, when an isthmus tree is installed there. Only its presence counts: a tree installed under other
/// queue budgets (or by an older agent) need not read back as this agent's desired state to be adopted.
async fn holds_a_tree(entry: AdoptedEntry) -> Option<AdoptedEntry> {
    let installed = async {
        let datapath = Datapath::open(entry.netns.fd()).await?;
        datapath.observe(&entry.interface).await
    };
    match installed.await {
        Ok(Some(_)) => Some(entry),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(netns = %entry.netns.id(), interface = %entry.interface, error = %e, "cannot read installed state");
            None
        }
    }
}
