//! The cleanup mode (the chart's uninstall hook): every isthmus tree on every interface of every namespace the
//! agent can reach is removed; nothing isthmus did not install is touched.

use std::sync::Arc;

use super::adopt::find_installed;
use super::datapath::{NodeDatapath, Removal};
use crate::metrics::Metrics;
use isthmus_datapaths::netns::Sources;

/// Removes every isthmus tree on the node. Returns how many trees were removed; trees that could not be
/// removed are reported as errors.
pub async fn cleanup(sources: &Sources, parallelism: usize) -> std::io::Result<(usize, Vec<String>)> {
    let installed = find_installed(sources, None, parallelism).await?;
    // The cleanup mode serves no metrics: what it counts goes with it.
    let datapath = NodeDatapath::new(Arc::new(Metrics::new()), parallelism, None);
    let removals = installed.into_iter().map(|e| Removal::unowned(e.netns, e.interface)).collect();
    let mut removed = 0;
    let mut errors = Vec::new();
    for (removal, outcome) in datapath.remove(removals).await {
        let (netns, interface) = (removal.netns.id(), &removal.interface);
        match outcome {
            Ok(()) => {
                tracing::info!(%netns, %interface, "removed isthmus tree");
                removed += 1;
            }
            Err(e) => errors.push(format!("{netns} {interface}: {e}")),
        }
    }
    Ok((removed, errors))
}
