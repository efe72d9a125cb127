//! Status writes: after each batch the controller queues the statuses that changed, and one background task
//! writes them while this replica leads (server-side apply on the status subresource), publishing an Event for
//! each condition a user should notice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use isthmus_agent_api::schedule::{Cursor, Position, Timeline};
use isthmus_agent_api::unix_ms_now;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::schedule::{refresh_due, schedule_status};
use super::{DEGRADED, LinkReason, OVERLAPPING, ProgressLedger, READY, link_status, transitions};
use crate::api::{NetworkLinkStatus, ScheduleState, ScheduleStatus, StoredLink};
use crate::clock::now_seconds;
use crate::controller::write_loop::{self, write_while_leading};
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

type Jobs = write_loop::Jobs<StatusJob>;

/// The statuses to check and to write.
#[derive(Debug, Default)]
pub(in crate::controller) struct StatusQueue {
    /// Links whose status may have changed since the last flush.
    pub(in crate::controller) dirty: BTreeSet<ObjectKey>,
    /// Nodes whose plan or agent report changed since the last flush: their share of each link's progress is
    /// recomputed, and the links whose share changed become dirty.
    pub(in crate::controller) nodes: BTreeSet<String>,
    ledger: ProgressLedger,
    /// The last status queued per link, so that one is not queued again while the watch catches up.
    pub(in crate::controller) queued: BTreeMap<ObjectKey, NetworkLinkStatus>,
    /// When the tick last asked for each scheduled link's status to be refreshed (Unix ms).
    pub(in crate::controller) schedule_refreshed: BTreeMap<ObjectKey, u64>,
    /// Each scheduled link's timeline with the cursor of its last evaluation: a jittered timeline walked from its
    /// start every second would cost more the longer it runs.
    cursors: BTreeMap<ObjectKey, (Arc<Timeline>, Cursor)>,
    jobs: Jobs,
    notify: Arc<Notify>,
}

impl StatusQueue {
    /// Starts the task that writes what is queued; it runs until aborted.
    pub(in crate::controller) fn spawn_writer(&self, ctx: Arc<Context>) -> JoinHandle<()> {
        tokio::spawn(write_statuses(ctx, self.jobs.clone(), self.notify.clone()))
    }

    /// Where `timeline`, the one `key` has now, stands at `now_ms`.
    fn position(&mut self, key: &ObjectKey, timeline: &Arc<Timeline>, now_ms: u64) -> Position {
        let entry = self.cursors.entry(key.clone()).or_insert_with(|| (timeline.clone(), Cursor::default()));
        if !Arc::ptr_eq(&entry.0, timeline) {
            *entry = (timeline.clone(), Cursor::default());
        }
        entry.1.advance(timeline, now_ms)
    }

    /// A link gone: nothing of it is kept.
    pub(in crate::controller) fn forget(&mut self, key: &ObjectKey) {
        self.queued.remove(key);
        self.schedule_refreshed.remove(key);
        self.cursors.remove(key);
    }

    /// A new term: the previous leader's queue is unknown, so every status is checked again.
    pub(in crate::controller) fn new_term(&mut self, links: impl IntoIterator<Item = ObjectKey>) {
        self.queued.clear();
        self.dirty.extend(links);
        self.notify.notify_one();
    }
}

impl Controller {
    /// Queues the status of each dirty link that differs from both the server's and the last one queued.
    pub(in crate::controller) fn flush_statuses(&mut self) {
        if !self.status.nodes.is_empty() {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            for node in std::mem::take(&mut self.status.nodes) {
                let changed = self.status.ledger.update(&node, self.planner.node_plan(&node), reports.get(&node));
                self.status.dirty.extend(changed);
            }
        }
        if self.status.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.status.dirty);
        let now = now_seconds();
        let now_ms = unix_ms_now();
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
            let progress = self.status.ledger.progress(&key);
            let mut new = link_status(&facts, progress.as_ref(), meta.status.as_ref(), &now);
            let previous = meta.status.clone();
            self.with_measured(&key, &mut new, previous.as_ref(), progress.as_ref(), &now);
            new.schedule =
                self.planner.link_timeline(&key).map(|t| schedule_status(t, self.status.position(&key, t, now_ms)));
            // Cut before comparing: what the server holds is already cut, and an uncut status would differ forever.
            new.bound();
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

    /// On the controller's tick: marks the scheduled links whose schedule moved on since their status was
    /// written (at most every [`super::schedule::REFRESH_MS`] each), and queues their statuses.
    pub(in crate::controller) fn refresh_schedules(&mut self) {
        if !self.leading() {
            return;
        }
        let now_ms = unix_ms_now();
        // a link whose schedule was removed keeps no cursor nor refresh time (a link deleted is forgotten at once)
        let planner = &self.planner;
        self.status.cursors.retain(|key, _| planner.link_timeline(key).is_some());
        self.status.schedule_refreshed.retain(|key, _| planner.link_timeline(key).is_some());
        let mut due = Vec::new();
        for (key, meta) in &self.links {
            let Some(timeline) = self.planner.link_timeline(key) else { continue };
            let now = schedule_status(timeline, self.status.position(key, timeline, now_ms));
            let shown = self.status.queued.get(key).or(meta.status.as_ref()).and_then(|s| s.schedule.as_ref());
            let last = self.status.schedule_refreshed.get(key).copied();
            if refresh_due(shown, &now, now_ms, last) {
                due.push(key.clone());
            }
        }
        if due.is_empty() {
            return;
        }
        for key in due {
            self.status.schedule_refreshed.insert(key.clone(), now_ms);
            self.status.dirty.insert(key);
        }
        self.flush_statuses();
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

/// An Event for each condition of a written status that turned to something a user should notice, and one when
/// the schedule's phase changed.
async fn publish_transitions(ctx: &Context, key: &ObjectKey, job: &StatusJob) {
    if let Some(ev) = phase_event(job.previous.as_ref().and_then(|p| p.schedule.as_ref()), job.status.schedule.as_ref())
        && let Err(e) = ctx.recorder.publish(&ev, &job.reference).await
    {
        tracing::warn!(link = %key, error = %e, "publishing an event");
    }
    for c in transitions(job.previous.as_ref(), &job.status) {
        let type_ = match (c.type_.as_str(), c.status.as_str()) {
            (DEGRADED, "True") => EventType::Warning,
            (READY, "True") if LinkReason::parse(&c.reason) == Some(LinkReason::Applied) => EventType::Normal,
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

/// The Event for a schedule that moved from `before` to `after`, if it moved.
fn phase_event(before: Option<&ScheduleStatus>, after: Option<&ScheduleStatus>) -> Option<KubeEvent> {
    let after = after?;
    if before.is_some_and(|b| b.same_phase(after)) {
        return None;
    }
    let what = match (&after.state, &after.phase) {
        (ScheduleState::Waiting, _) => "waiting for its start".to_owned(),
        (ScheduleState::Over, _) => "over: the link's own impairment is back".to_owned(),
        (state, phase) => format!(
            "phase {}{}{}",
            phase.as_deref().unwrap_or("?"),
            if after.cycle > 0 { format!(" (pass {})", after.cycle + 1) } else { String::new() },
            if *state == ScheduleState::Holding { ", held" } else { "" },
        ),
    };
    let next = after.next_change.as_ref().map(|t| format!("; next change at {}", t.0)).unwrap_or_default();
    Some(KubeEvent {
        type_: EventType::Normal,
        reason: "PhaseChanged".into(),
        note: Some(format!("schedule {what}{next}")),
        action: "Schedule".into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: ScheduleState, phase: Option<&str>, cycle: u64) -> ScheduleStatus {
        ScheduleStatus { state, phase: phase.map(str::to_owned), cycle, since: None, next_change: None }
    }

    #[test]
    fn a_phase_change_makes_one_event_and_a_rewrite_of_the_same_phase_none() {
        let up = status(ScheduleState::Running, Some("up"), 0);
        let down = status(ScheduleState::Running, Some("down"), 0);
        assert!(phase_event(Some(&up), Some(&up)).is_none());
        assert!(phase_event(Some(&up), None).is_none(), "the schedule was removed: the spec change says so");
        let ev = phase_event(Some(&up), Some(&down)).unwrap();
        assert_eq!((ev.reason.as_str(), ev.note.as_deref()), ("PhaseChanged", Some("schedule phase down")));
        let again = phase_event(Some(&down), Some(&status(ScheduleState::Running, Some("up"), 3))).unwrap();
        assert_eq!(again.note.as_deref(), Some("schedule phase up (pass 4)"));
        let over = phase_event(None, Some(&status(ScheduleState::Over, None, 0))).unwrap();
        assert_eq!(over.note.as_deref(), Some("schedule over: the link's own impairment is back"));
    }
}
