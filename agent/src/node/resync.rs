//! The periodic resync: the full path (dump, diff, send) for every pod of the plan in force, because plans in
//! between trust what the agent installed and would not notice a change made behind its back.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

use super::datapath::{PodDatapathError, ReconcilePath};
use super::state::InstalledPod;
use super::{Node, release_freed_memory};
use isthmus_agent_api::unix_ms_now;

impl Node {
    pub(super) async fn resync_inline(&self) -> u64 {
        let applied = self.applied.lock().await;
        let started = Instant::now();
        let pods: Vec<Arc<InstalledPod>> = applied.pods.values().cloned().collect();
        let (timelines, now_ms) = (&applied.timelines, unix_ms_now());
        let outcomes: Vec<(Arc<InstalledPod>, Result<usize, PodDatapathError>)> = futures::stream::iter(pods)
            .map(|pod| async move {
                let outcome = match pod.desired(self.config.queue_budget, timelines, now_ms) {
                    Ok(desired) => {
                        self.datapath.reconcile(&pod.datapath, &pod.interface, &desired, ReconcilePath::Full).await
                    }
                    Err(e) => Err(e.into()),
                };
                (pod, outcome)
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;
        let repaired = outcomes.iter().map(|(pod, outcome)| repaired(pod, outcome)).sum();
        self.metrics.mutations.inc_by(repaired);
        self.metrics.resync_mutations.inc_by(repaired);
        tracing::debug!(pods = outcomes.len(), repaired, elapsed_ms = started.elapsed().as_millis() as u64, "resynced");
        drop(outcomes);
        release_freed_memory();
        repaired
    }
}

/// The mutations that repaired one pod's tree, logged with the pod.
fn repaired(pod: &InstalledPod, outcome: &Result<usize, PodDatapathError>) -> u64 {
    let name = format!("{}/{}", pod.pod.namespace, pod.pod.name);
    match outcome {
        Ok(0) => 0,
        Ok(mutations) => {
            tracing::warn!(pod = %name, netns = %pod.netns.id(), interface = %pod.interface, mutations, "resync repaired a tree changed behind isthmus's back");
            *mutations as u64
        }
        Err(e) => {
            tracing::warn!(pod = %name, netns = %pod.netns.id(), interface = %pod.interface, error = %e, "resync failed");
            0
        }
    }
}
