//! Status writes: after each batch the controller queues the statuses that changed, and one background task
//! writes them while this replica leads (server-side apply on the status subresource), publishing an Event for
//! each condition a user should notice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{DEGRADED, OVERLAPPING, READY, link_status, progress, transitions};
use crate::api::{NetworkLinkStatus, StoredLink};
use crate::controller::writes::{self, write_while_leading};
use crate::controller::{Context, Controller};
use crate::index::ObjectKey;
use crate::plan::LinkFacts;

/// A status to write.
#[derive(Debug, Clone)]
struct StatusJob {
    status: NetworkLinkStatus,
    previous: Option<NetworkLinkStatus>,
    reference: ObjectReference,
}

type Jobs = writes::Jobs<StatusJob>;

/// The statuses to check and to write.
#[derive(Debug, Default)]
pub(in crate::controller) struct StatusQueue {
    /// Links whose status may have changed since the last flush.
    pub(in crate::controller) dirty: BTreeSet<ObjectKey>,
    /// The last status queued per link, so that one is not queued again while the watch catches up.
    pub(in crate::controller) queued: BTreeMap<ObjectKey, NetworkLinkStatus>,
    jobs: Jobs,
    notify: Arc<Notify>,
}

impl StatusQueue {
    /// Starts the task that writes what is queued; it runs until aborted.
    pub(in crate::controller) fn spawn_writer(&self, ctx: Arc<Context>) -> JoinHandle<()> {
        tokio::spawn(write_statuses(ctx, self.jobs.clone(), self.notify.clone()))
    }

    /// A new term: the previous leader's queue is unknown, so every status is checked again.
    pub(in crate::controller) fn new_term(&mut self, links: impl IntoIterator<Item = ObjectKey>) {
        self.queued.clear();
        self.dirty.extend(links);
        self.notify.notify_one();
    }
}

pub fn now_seconds() -> Time {
    // The API server keeps whole seconds; a sub-second time would never compare equal after a round trip.
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("now is a valid timestamp"))
}

impl Controller {
    /// Queues the status of each dirty link that differs from both the server's and the last one queued.
    pub(in crate::controller) fn flush_statuses(&mut self) {
        if self.status.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.status.dirty);
        let progress = {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            progress(self.planner.node_plans(), &reports)
        };
        let now = now_seconds();
        let mut queued_any = false;
        for key in dirty {
            let Some(meta) = self.links.get(&key) else { continue };
            if meta.deleting {
                continue;
            }
            let facts = match self.unreadable.get(&key) {
                Some((generation, why)) => LinkFacts::unreadable(*generation, &why.path, &why.reason),
                None => match self.planner.link_facts(&key) {
                    Some(facts) => facts,
                    None => continue,
                },
            };
            let mut new = link_status(&facts, progress.get(&key), meta.status.as_ref(), &now);
            let previous = meta.status.clone();
            self.with_measured(&key, &mut new, previous.as_ref(), progress.get(&key), &now);
            let Some(meta) = self.links.get(&key) else { continue };
            if Some(&new) == meta.status.as_ref() || self.status.queued.get(&key) == Some(&new) {
                continue;
            }
            self.status.queued.insert(key.clone(), new.clone());
            let job = StatusJob { status: new, previous: meta.status.clone(), reference: meta.reference.clone() };
            self.status.jobs.lock().unwrap_or_else(|p| p.into_inner()).insert(key, job);
            queued_any = true;
        }
        if queued_any {
            self.status.notify.notify_one();
        }
    }
}

async fn write_statuses(ctx: Arc<Context>, jobs: Jobs, notify: Arc<Notify>) {
    let params = PatchParams::apply(&ctx.config.field_manager).force();
    write_while_leading(ctx.leader.clone(), jobs, notify, |key, job| write_status(&ctx, &params, key, job)).await
}

/// One status; the job back when it should be retried.
async fn write_status(ctx: &Context, params: &PatchParams, key: ObjectKey, job: StatusJob) -> Result<(), StatusJob> {
    let api: Api<StoredLink> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let body = serde_json::json!({
        "apiVersion": "isthmus.dev/v1alpha1",
        "kind": "NetworkLink",
        "status": job.status,
    });
    match api.patch_status(&key.name, params, &Patch::Apply(&body)).await {
        Ok(_) => {
            ctx.metrics.status_patch(true);
            publish_transitions(ctx, &key, &job).await;
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => {
            ctx.metrics.status_patch(false);
            tracing::warn!(link = %key, error = %e, "writing status");
            Err(job)
        }
    }
}

/// An Event for each condition of a written status that turned to something a user should notice.
async fn publish_transitions(ctx: &Context, key: &ObjectKey, job: &StatusJob) {
    for c in transitions(job.previous.as_ref(), &job.status) {
        let type_ = match (c.type_.as_str(), c.status.as_str()) {
            (DEGRADED, "True") => EventType::Warning,
            (READY, "True") if c.reason == "Applied" => EventType::Normal,
            (OVERLAPPING, "True") => EventType::Normal,
            _ => continue,
        };
        let ev = KubeEvent {
            type_,
            reason: c.reason.clone(),
            note: Some(c.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &job.reference).await {
            tracing::warn!(link = %key, error = %e, "publishing an event");
        }
    }
}
