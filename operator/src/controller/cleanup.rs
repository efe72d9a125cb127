//! The cleanup finalizer's side effects: every link gets the finalizer; a deleted link keeps it until the nodes
//! that had its impairments confirmed a plan without them (`finalizer.rs` decides), or a bounded wait ran out.
//! Patches go out in the background, at most one per link at a time.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use serde_json::json;
use tokio::time::Instant;

use super::Controller;
use isthmus_agent_api::NodePlan;

use super::finalizer::{
    Cleanup, FINALIZER, cleanup_state, finalizers_patch, gone_note, incomplete_patch, plan_uses, pod_uses,
    timed_out_note,
};
use crate::api::{NetworkLink, StoredLink};
use crate::index::ObjectKey;

/// A deleted link waiting for its nodes.
#[derive(Debug, Clone)]
pub(super) struct PendingCleanup {
    /// The affected nodes, each with the pods (`namespace/name`) the link shaped there: what a timed-out cleanup
    /// names.
    pods: BTreeMap<String, BTreeSet<String>>,
    deadline: Instant,
}

/// The pods (`namespace/name`) of `plan` whose entries use the link.
fn pods_using(plan: &NodePlan, link: &ObjectKey) -> impl Iterator<Item = String> {
    plan.pods.iter().filter(|p| pod_uses(p, link)).map(|p| format!("{}/{}", p.namespace, p.name))
}

impl Controller {
    /// First sight of a deletion: the nodes to wait for are those whose plan (desired, or last confirmed) uses
    /// the link, computed with the link still in. Then the link leaves the plan.
    pub(super) fn begin_cleanup(&mut self, key: ObjectKey, link: Option<&NetworkLink>) {
        // An unreadable link is not in the plans: the nodes that applied its earlier version are found from their
        // replies alone.
        if let Some(link) = link {
            self.planner.apply_link(link);
            self.recompute();
        }
        let mut pods: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for plan in self.planner.node_plans().filter(|p| plan_uses(p, &key)) {
            pods.entry(plan.node.clone()).or_default().extend(pods_using(plan, &key));
        }
        {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            for (node, r) in reports.iter() {
                if let Some(applied) = r.applied.as_ref().filter(|a| plan_uses(&a.plan, &key)) {
                    pods.entry(node.clone()).or_default().extend(pods_using(&applied.plan, &key));
                }
            }
        }
        tracing::info!(link = %key, nodes = pods.len(), "link deleted; removing its impairments");
        self.planner.delete_link(&key);
        let deadline = Instant::now() + self.ctx.config.cleanup_timeout;
        self.cleanups.insert(key, PendingCleanup { pods, deadline });
    }

    /// Releases the finalizer of each deleted link whose nodes are done, or whose wait ran out.
    pub(super) fn check_cleanups(&mut self) {
        if self.cleanups.is_empty() {
            return;
        }
        // Held through the loop rather than copied: a copy of every report is every pod's result in the cluster,
        // and this runs after every batch. The dispatchers only wait on it to record a reply.
        let reports = self.reports.clone();
        let reports = reports.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        for (key, pending) in &self.cleanups {
            let Some(meta) = self.links.get(key) else { continue };
            let remaining: Vec<String> = meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
            let version = meta.resource_version.as_deref();
            let (note, warn) = match cleanup_state(key, pending.pods.keys(), &self.nodes, &reports) {
                Cleanup::Done { gone_nodes } if gone_nodes.is_empty() => (None, false),
                Cleanup::Done { gone_nodes } => (Some(gone_note(&gone_nodes)), false),
                Cleanup::Waiting { nodes, leftovers } if now >= pending.deadline => {
                    let note = timed_out_note(self.ctx.config.cleanup_timeout, &nodes, &pending.pods, &leftovers);
                    tracing::warn!(link = %key, nodes = %nodes.join(","), "{note}");
                    (Some(note), true)
                }
                Cleanup::Waiting { .. } => continue,
            };
            let first = note.as_deref().filter(|_| warn).map(|note| incomplete_patch(version, note));
            let patch = finalizers_patch(&remaining, version);
            let event = note.map(|note| KubeEvent {
                type_: if warn { EventType::Warning } else { EventType::Normal },
                reason: if warn { "CleanupTimedOut" } else { "CleanupSkippedNode" }.into(),
                note: Some(note),
                action: "RemoveFinalizer".into(),
                secondary: None,
            });
            self.patch_finalizers(key.clone(), first, patch, meta.reference.clone(), event);
        }
    }

    /// Adds the finalizer to every link that lacks it.
    pub(super) fn ensure_finalizers(&mut self) {
        for (key, meta) in &self.links {
            if meta.deleting || meta.finalizers.iter().any(|f| f == FINALIZER) {
                continue;
            }
            let mut all = meta.finalizers.clone();
            all.push(FINALIZER.to_owned());
            let patch = finalizers_patch(&all, meta.resource_version.as_deref());
            self.patch_finalizers(key.clone(), None, patch, meta.reference.clone(), None);
        }
    }

    /// Patches a link's finalizers in the background, at most one patch per link at a time; `first`, when given,
    /// goes before, and the finalizers' patch is then guarded by the version it made.
    fn patch_finalizers(
        &self,
        key: ObjectKey,
        first: Option<serde_json::Value>,
        mut patch: serde_json::Value,
        reference: ObjectReference,
        event: Option<KubeEvent>,
    ) {
        if !self.finalizer_busy.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone()) {
            return;
        }
        let ctx = self.ctx.clone();
        let busy = self.finalizer_busy.clone();
        tokio::spawn(async move {
            let api: Api<StoredLink> = Api::namespaced(ctx.client.clone(), &key.namespace);
            if let Some(first) = first {
                match api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&first)).await {
                    Ok(link) => patch["metadata"]["resourceVersion"] = json!(link.metadata.resource_version),
                    Err(e) => {
                        // As below: the next pass retries.
                        tracing::debug!(link = %key, error = %e, "annotation patch not applied");
                        busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
                        return;
                    }
                }
            }
            match api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(link = %key, finalizers = %patch["metadata"]["finalizers"], "finalizers updated");
                    if let Some(ev) = event
                        && let Err(e) = ctx.recorder.publish(&ev, &reference).await
                    {
                        tracing::warn!(link = %key, error = %e, "publishing an event");
                    }
                }
                // A conflict means a newer version is on its way through the watch; the next pass retries.
                Err(e) => tracing::debug!(link = %key, error = %e, "finalizer patch not applied"),
            }
            busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        });
    }
}
