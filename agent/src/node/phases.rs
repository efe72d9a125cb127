//! The phase timer: at each instant a timeline of the plan in force changes phase, the pods whose links have
//! one get the new phase. On the record path (`Datapath::update`): only the destinations whose impairment
//! changed are sent, in place, so a switch costs a message per changed destination and no dump.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::Node;
use super::datapath::ReconcilePath;
use super::state::InstalledPod;
use isthmus_agent_api::unix_ms_now;

impl Node {
    /// Runs for as long as the node lives: sleeps until the next phase change of the plan in force (or a new
    /// plan), then installs the phases of that instant.
    pub fn spawn_phases(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let (node, changes) = (Arc::downgrade(self), self.phases_changed.clone());
        tokio::spawn(async move {
            loop {
                // Registered before the plan is read: a plan applied in between ends the wait below.
                let changed = changes.notified();
                let next = {
                    let Some(node) = node.upgrade() else { return };
                    node.applied.lock().await.timelines.next_change(unix_ms_now())
                };
                let due = match next {
                    Some(at) => {
                        let wait = Duration::from_millis(at.saturating_sub(unix_ms_now()));
                        tokio::select! {
                            () = tokio::time::sleep(wait) => Some(at),
                            () = changed => None,
                        }
                    }
                    None => {
                        changed.await;
                        None
                    }
                };
                if let Some(at) = due {
                    let Some(node) = node.upgrade() else { return };
                    let _ = node.on_blocking_thread(move |n| async move { n.switch_phases_inline(at).await }).await;
                }
            }
        })
    }

    /// Installs, on every pod with a scheduled link, the impairments in force now, for the change scheduled at
    /// `due_ms`; returns the mutations sent.
    pub(super) async fn switch_phases_inline(&self, due_ms: u64) -> u64 {
        let applied = self.applied.lock().await;
        let started = Instant::now();
        let now_ms = unix_ms_now();
        let timelines = &applied.timelines;
        let pods: Vec<Arc<InstalledPod>> = applied.pods.values().filter(|p| p.scheduled(timelines)).cloned().collect();
        let outcomes: Vec<u64> = futures::stream::iter(pods)
            .map(|pod| async move {
                let outcome = match pod.desired(self.config.queue_budget, timelines, now_ms) {
                    Ok(desired) => {
                        self.datapath.reconcile(&pod.datapath, &pod.interface, &desired, ReconcilePath::Record).await
                    }
                    Err(e) => Err(e.into()),
                };
                match outcome {
                    Ok(mutations) => mutations as u64,
                    Err(e) => {
                        let name = format!("{}/{}", pod.pod.namespace, pod.pod.name);
                        tracing::warn!(pod = %name, error = %e, "installing a link's next phase failed");
                        0
                    }
                }
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;
        let mutations = outcomes.iter().sum();
        self.metrics.mutations.inc_by(mutations);
        // Every change was acknowledged by the kernel (or taken by the userspace pipeline) by now.
        let done_after_ms = unix_ms_now().saturating_sub(due_ms);
        self.metrics.phase_switch_seconds.observe(done_after_ms as f64 / 1e3);
        tracing::info!(
            pods = outcomes.len(),
            mutations,
            woke_after_ms = now_ms.saturating_sub(due_ms),
            done_after_ms,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "phases switched"
        );
        mutations
    }
}
