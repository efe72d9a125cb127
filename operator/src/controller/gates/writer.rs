//! Gate writes: after each batch the controller decides the gated pods that something may have changed for
//! and queues the conditions that differ; one background task writes them while this replica leads, by
//! server-side apply of the one condition on `pods/status`, so that the dispatch loop never waits for the API.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{GateChange, apply_body, changes};
use crate::clock::now_seconds;
use crate::controller::write_loop::{self, write_while_leading};
use crate::controller::{Context, Controller};
use crate::gate::GateReason;
use crate::index::ObjectKey;

type Jobs = write_loop::Jobs<GateChange>;

/// What to decide again, and the writes queued.
#[derive(Debug, Default)]
pub(in crate::controller) struct GateQueue {
    /// Gated pods whose own object changed.
    pub(in crate::controller) pods: BTreeSet<ObjectKey>,
    /// Nodes whose plan or agent report changed: their gated pods.
    pub(in crate::controller) nodes: BTreeSet<String>,
    /// Every gated pod: the first sync, a new term, a link or namespace change.
    pub(in crate::controller) all: bool,
    /// The last condition queued per pod (with the pod's UID), so that it is not queued again while the watch
    /// catches up.
    queued: BTreeMap<ObjectKey, (String, GateReason)>,
    jobs: Jobs,
    notify: Arc<Notify>,
}

impl GateQueue {
    /// Starts the task that writes what is queued; it runs until aborted.
    pub(in crate::controller) fn spawn_writer(&self, ctx: Arc<Context>) -> JoinHandle<()> {
        tokio::spawn(write_gates(ctx, self.jobs.clone(), self.notify.clone()))
    }

    /// A new term, or the end of one: what was queued was decided on the previous term's reports.
    pub(in crate::controller) fn new_term(&mut self) {
        self.queued.clear();
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.all = true;
    }

    /// The pod is gone: nothing to write to it.
    pub(in crate::controller) fn forget(&mut self, pod: &ObjectKey) {
        self.pods.remove(pod);
        self.queued.remove(pod);
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(pod);
    }

    fn drop_job(&mut self, pod: &ObjectKey) {
        self.queued.remove(pod);
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(pod);
    }
}

impl Controller {
    /// Decides the gated pods something may have changed for, and queues each condition that differs from the
    /// pod's and from the last one queued. Only while leading and once every watch has listed: before that a pod
    /// would look unselected merely because its links are not known yet.
    pub(in crate::controller) fn flush_gates(&mut self) {
        if !self.leading() || !self.relist.all_synced() {
            return;
        }
        let q = &mut self.gates;
        if !q.all && q.pods.is_empty() && q.nodes.is_empty() {
            return;
        }
        let (all, pods, nodes) =
            (std::mem::take(&mut q.all), std::mem::take(&mut q.pods), std::mem::take(&mut q.nodes));
        let index = self.planner.index();
        let due: Vec<&ObjectKey> = index
            .gates
            .keys()
            .filter(|k| {
                all || pods.contains(*k)
                    || index.pods.get(*k).and_then(|p| p.node.as_ref()).is_some_and(|n| nodes.contains(n))
            })
            .collect();
        let decided = {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            changes(&self.planner, &reports, due.iter().copied(), &now_seconds())
        };
        let mut changed: BTreeMap<ObjectKey, GateChange> = decided.into_iter().map(|c| (c.pod.clone(), c)).collect();
        let mut queued_any = false;
        for key in due {
            let Some(change) = changed.remove(key) else {
                // Nothing to write now (done, or pending): a write queued earlier is no longer what to say.
                q.drop_job(key);
                continue;
            };
            let label = (change.uid.clone(), change.write.reason);
            if q.queued.get(key) == Some(&label) {
                continue;
            }
            q.queued.insert(key.clone(), label);
            q.jobs.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), change);
            queued_any = true;
        }
        if queued_any {
            q.notify.notify_one();
        }
    }
}

async fn write_gates(ctx: Arc<Context>, jobs: Jobs, notify: Arc<Notify>) {
    let params = PatchParams::apply(&ctx.config.field_manager).force();
    write_while_leading(ctx.leader.clone(), jobs, notify, |key, change| write_gate(&ctx, &params, key, change)).await
}

/// One pod's condition; the change back when it should be retried.
async fn write_gate(ctx: &Context, params: &PatchParams, key: ObjectKey, change: GateChange) -> Result<(), GateChange> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
    match api.patch_status(&key.name, params, &Patch::Apply(&apply_body(&change))).await {
        Ok(_) => {
            ctx.metrics.gate_patch("ok");
            tracing::debug!(pod = %key, reason = %change.write.reason, "readiness gate condition written");
            Ok(())
        }
        // 404: the pod is gone; 422: its UID is not the one decided for (replaced under the same name), and the
        // new pod is decided from its own watch event.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 422 => {
            ctx.metrics.gate_patch("gone");
            tracing::debug!(pod = %key, error = %e, "readiness gate: pod gone or replaced");
            Ok(())
        }
        Err(e) => {
            ctx.metrics.gate_patch("error");
            tracing::warn!(pod = %key, error = %e, "writing the readiness gate condition");
            Err(change)
        }
    }
}
