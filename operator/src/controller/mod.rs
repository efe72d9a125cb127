//! The controller around the pure plan: watches feed one task that owns the [`Planner`]; after each batch of
//! events it recomputes what changed, hands each changed node's plan to that node's dispatcher
//! ([`nodes`]), writes the statuses that changed ([`status`]) and drives the cleanup finalizer
//! ([`finalizer`]). Only the leader dispatches and writes; a follower keeps the index warm.

pub mod agent;
pub mod finalizer;
pub mod nodes;
pub mod status;
pub mod version;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use isthmus_agent_api::NodePlan;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::watcher::Event;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::api::{NetworkLink, NetworkLinkStatus};
use crate::index::ObjectKey;
use crate::metrics::Metrics;
use crate::plan::Planner;
use agent::AgentApi;
use finalizer::{Cleanup, FINALIZER, cleanup_state, finalizers_patch, plan_uses};
use nodes::{DispatchConfig, Dispatchers, NodeInput, Reports, Shared};
use watch::{AgentSelector, Update};

/// How the controller behaves.
#[derive(Debug, Clone)]
pub struct Config {
    pub agent_port: u16,
    pub agents: AgentSelector,
    pub dispatch: DispatchConfig,
    /// The longest a deleted link waits for its nodes to confirm the cleanup.
    pub cleanup_timeout: Duration,
    /// Field manager of status writes (server-side apply).
    pub field_manager: String,
}

/// What the controller needs from the outside world.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The node agents' API (the mTLS client in production).
    pub agent_api: Arc<dyn AgentApi>,
    pub config: Config,
    pub leader: tokio::sync::watch::Receiver<bool>,
    /// Set once every watch has listed its objects (for `/readyz`).
    pub ready: Arc<AtomicBool>,
}

/// An agent pod as far as dispatch cares.
#[derive(Debug, Clone, PartialEq)]
struct AgentPod {
    node: Option<String>,
    ip: Option<IpAddr>,
    ready: bool,
    uid: String,
}

impl AgentPod {
    fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        AgentPod {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ip: status.and_then(|s| s.pod_ip.as_ref()).and_then(|ip| ip.parse().ok()),
            ready: pod.metadata.deletion_timestamp.is_none()
                && status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            uid: pod.uid().unwrap_or_default(),
        }
    }
}

/// What the controller remembers of a NetworkLink object besides the index.
#[derive(Debug, Clone)]
struct LinkMeta {
    resource_version: Option<String>,
    finalizers: Vec<String>,
    deleting: bool,
    /// The status on the server, as last seen.
    status: Option<NetworkLinkStatus>,
    reference: ObjectReference,
}

/// A deleted link waiting for its nodes.
#[derive(Debug, Clone)]
struct PendingCleanup {
    affected: BTreeSet<String>,
    deadline: Instant,
}

/// A status to write.
#[derive(Debug, Clone)]
struct StatusJob {
    status: NetworkLinkStatus,
    previous: Option<NetworkLinkStatus>,
    reference: ObjectReference,
}

type Busy = Arc<Mutex<BTreeSet<ObjectKey>>>;

struct Controller {
    ctx: Arc<Context>,
    planner: Planner,
    agents: BTreeMap<ObjectKey, AgentPod>,
    nodes: BTreeSet<String>,
    links: BTreeMap<ObjectKey, LinkMeta>,
    cleanups: BTreeMap<ObjectKey, PendingCleanup>,
    dispatchers: Dispatchers,
    reports: Reports,
    /// Keys seen since a watch's `Init`, per watch; on `InitDone` everything else is gone.
    relist: BTreeMap<&'static str, BTreeSet<ObjectKey>>,
    synced: BTreeSet<&'static str>,
    dirty_nodes: BTreeSet<String>,
    dirty_status: BTreeSet<ObjectKey>,
    /// The last status queued per link, so that one is not queued again while the watch catches up.
    queued: BTreeMap<ObjectKey, NetworkLinkStatus>,
    status_jobs: Arc<Mutex<BTreeMap<ObjectKey, StatusJob>>>,
    status_notify: Arc<Notify>,
    finalizer_busy: Busy,
}

fn now_seconds() -> Time {
    // The API server keeps whole seconds; a sub-second time would never compare equal after a round trip.
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("now is a valid timestamp"))
}

fn meta_key(namespace: Option<String>, name: String) -> ObjectKey {
    ObjectKey::new(namespace.unwrap_or_default(), name)
}

/// Runs until `shutdown` turns true.
pub async fn run(ctx: Context, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let ctx = Arc::new(ctx);
    let (tx, mut rx) = mpsc::channel::<Update>(1024);
    let _watches = watch::start(&ctx.client, &ctx.config.agents, tx);
    let (reported_tx, mut reported_rx) = mpsc::unbounded_channel();
    let reports: Reports = Arc::default();
    let shared = Shared {
        agent_api: ctx.agent_api.clone(),
        config: ctx.config.dispatch.clone(),
        reports: reports.clone(),
        reported: reported_tx,
        leader: ctx.leader.clone(),
        metrics: ctx.metrics.clone(),
    };
    let mut c = Controller {
        ctx: ctx.clone(),
        planner: Planner::new(),
        agents: BTreeMap::new(),
        nodes: BTreeSet::new(),
        links: BTreeMap::new(),
        cleanups: BTreeMap::new(),
        dispatchers: Dispatchers::new(shared),
        reports,
        relist: BTreeMap::new(),
        synced: BTreeSet::new(),
        dirty_nodes: BTreeSet::new(),
        dirty_status: BTreeSet::new(),
        queued: BTreeMap::new(),
        status_jobs: Arc::default(),
        status_notify: Arc::new(Notify::new()),
        finalizer_busy: Arc::default(),
    };
    let writer = tokio::spawn(write_statuses(ctx.clone(), c.status_jobs.clone(), c.status_notify.clone()));
    let mut leader = ctx.leader.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            update = rx.recv() => {
                let Some(update) = update else { break };
                let started = std::time::Instant::now();
                c.apply(update);
                // Batch whatever else is already queued: one recompute for a burst of events.
                let mut n = 1;
                while n < 1024 {
                    match rx.try_recv() {
                        Ok(u) => { c.apply(u); n += 1; }
                        Err(_) => break,
                    }
                }
                c.recompute();
                c.after_batch();
                ctx.metrics.reconciles.inc();
                ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
            }
            Some(_) = reported_rx.recv() => {
                while reported_rx.try_recv().is_ok() {}
                c.dirty_status.extend(c.links.keys().cloned());
                c.after_batch();
            }
            changed = leader.changed() => {
                if changed.is_err() { break }
                let leading = *leader.borrow_and_update();
                ctx.metrics.leader.set(leading as i64);
                tracing::info!(leading, "leadership changed");
                if leading {
                    // A new term: the previous leader's queue is unknown, so every status is checked again.
                    c.queued.clear();
                    c.dirty_status.extend(c.links.keys().cloned());
                    c.status_notify.notify_one();
                }
                c.after_batch();
            }
            _ = tick.tick() => c.housekeeping(),
        }
    }
    writer.abort();
    tracing::info!("controller stopped");
}

impl Controller {
    fn leading(&self) -> bool {
        *self.ctx.leader.borrow()
    }

    fn synced(&self) -> bool {
        self.synced.len() == watch::WATCHES
    }

    fn seen(&mut self, watch: &'static str, key: ObjectKey) {
        if let Some(set) = self.relist.get_mut(watch) {
            set.insert(key);
        }
    }

    /// The keys a watch knows, for pruning after a re-list.
    fn known(&self, watch: &'static str) -> Vec<ObjectKey> {
        let index = self.planner.index();
        match watch {
            "links" => self.links.keys().cloned().collect(),
            "pods" => index.pods.keys().cloned().collect(),
            "namespaces" => index.namespaces.keys().map(|n| ObjectKey::new("", n)).collect(),
            "services" => index.services.keys().cloned().collect(),
            "agents" => self.agents.keys().cloned().collect(),
            "nodes" => self.nodes.iter().map(|n| ObjectKey::new("", n)).collect(),
            _ => Vec::new(),
        }
    }

    fn forget(&mut self, watch: &'static str, key: &ObjectKey) {
        match watch {
            "links" => self.delete_link(key),
            "pods" => self.planner.delete_pod(key),
            "namespaces" => self.planner.delete_namespace(&key.name),
            "services" => self.planner.delete_service(key),
            "agents" => self.delete_agent(key),
            "nodes" => self.delete_node(&key.name),
            _ => {}
        }
    }

    fn apply(&mut self, update: Update) {
        macro_rules! dispatch_event {
            ($event:expr, $watch:literal, $key:expr, $upsert:expr, $delete:expr) => {
                match $event {
                    Event::Init => {
                        self.relist.insert($watch, BTreeSet::new());
                    }
                    Event::InitApply(obj) => {
                        self.seen($watch, $key(&obj));
                        $upsert(self, obj);
                    }
                    Event::Apply(obj) => $upsert(self, obj),
                    Event::Delete(obj) => $delete(self, &$key(&obj)),
                    Event::InitDone => {
                        if let Some(seen) = self.relist.remove($watch) {
                            for key in self.known($watch) {
                                if !seen.contains(&key) {
                                    self.forget($watch, &key);
                                }
                            }
                        }
                        if self.synced.insert($watch) && self.synced() {
                            tracing::info!("all watches synced");
                            self.ctx.ready.store(true, Ordering::Relaxed);
                        }
                    }
                }
            };
        }
        match update {
            Update::Link(e) => dispatch_event!(
                e,
                "links",
                |o: &NetworkLink| meta_key(o.namespace(), o.name_any()),
                |c: &mut Self, o: NetworkLink| c.upsert_link(o),
                |c: &mut Self, k: &ObjectKey| c.delete_link(k)
            ),
            Update::Pod(e) => dispatch_event!(
                e,
                "pods",
                |o: &Pod| meta_key(o.namespace(), o.name_any()),
                |c: &mut Self, o: Pod| c.planner.apply_pod(&o),
                |c: &mut Self, k: &ObjectKey| c.planner.delete_pod(k)
            ),
            Update::Namespace(e) => dispatch_event!(
                e,
                "namespaces",
                |o: &k8s_openapi::api::core::v1::Namespace| ObjectKey::new("", o.name_any()),
                |c: &mut Self, o: k8s_openapi::api::core::v1::Namespace| c.planner.apply_namespace(&o),
                |c: &mut Self, k: &ObjectKey| c.planner.delete_namespace(&k.name)
            ),
            Update::Service(e) => dispatch_event!(
                e,
                "services",
                |o: &k8s_openapi::api::core::v1::Service| meta_key(o.namespace(), o.name_any()),
                |c: &mut Self, o: k8s_openapi::api::core::v1::Service| c.planner.apply_service(&o),
                |c: &mut Self, k: &ObjectKey| c.planner.delete_service(k)
            ),
            Update::Agent(e) => dispatch_event!(
                e,
                "agents",
                |o: &Pod| meta_key(o.namespace(), o.name_any()),
                |c: &mut Self, o: Pod| c.upsert_agent(&o),
                |c: &mut Self, k: &ObjectKey| c.delete_agent(k)
            ),
            Update::Node(e) => dispatch_event!(
                e,
                "nodes",
                |o: &kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::Node>| ObjectKey::new("", o.name_any()),
                |c: &mut Self, o: kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::Node>| {
                    if c.nodes.insert(o.name_any()) {
                        // A new node gets its plan (empty or not) as soon as its agent is there.
                        c.dirty_nodes.insert(o.name_any());
                    }
                },
                |c: &mut Self, k: &ObjectKey| c.delete_node(&k.name)
            ),
        }
    }

    fn upsert_link(&mut self, link: NetworkLink) {
        let key = meta_key(link.namespace(), link.name_any());
        let deleting = link.metadata.deletion_timestamp.is_some();
        let finalizers = link.finalizers().to_vec();
        self.links.insert(
            key.clone(),
            LinkMeta {
                resource_version: link.resource_version(),
                finalizers: finalizers.clone(),
                deleting,
                status: link.status.clone(),
                reference: link.object_ref(&()),
            },
        );
        if !deleting {
            self.planner.apply_link(&link);
            self.dirty_status.insert(key);
            return;
        }
        if self.cleanups.contains_key(&key) || !finalizers.iter().any(|f| f == FINALIZER) {
            self.planner.delete_link(&key);
            return;
        }
        // First sight of the deletion: the nodes to wait for are those whose plan (desired, or last confirmed)
        // uses the link, computed with the link still in.
        self.planner.apply_link(&link);
        self.recompute();
        let mut affected: BTreeSet<String> =
            self.planner.node_plans().filter(|p| plan_uses(p, &key)).map(|p| p.node.clone()).collect();
        {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            for (node, r) in reports.iter() {
                if r.applied.as_ref().is_some_and(|a| plan_uses(&a.plan, &key)) {
                    affected.insert(node.clone());
                }
            }
        }
        tracing::info!(link = %key, nodes = affected.len(), "link deleted; removing its impairments");
        self.planner.delete_link(&key);
        let deadline = Instant::now() + self.ctx.config.cleanup_timeout;
        self.cleanups.insert(key, PendingCleanup { affected, deadline });
    }

    fn delete_link(&mut self, key: &ObjectKey) {
        self.planner.delete_link(key);
        self.links.remove(key);
        self.cleanups.remove(key);
        self.queued.remove(key);
    }

    fn upsert_agent(&mut self, pod: &Pod) {
        let key = meta_key(pod.namespace(), pod.name_any());
        let agent = AgentPod::from_pod(pod);
        if let Some(node) = &agent.node {
            self.dirty_nodes.insert(node.clone());
        }
        if let Some(old) = self.agents.insert(key, agent)
            && let Some(node) = old.node
        {
            self.dirty_nodes.insert(node);
        }
    }

    fn delete_agent(&mut self, key: &ObjectKey) {
        if let Some(node) = self.agents.remove(key).and_then(|a| a.node) {
            self.dirty_nodes.insert(node);
        }
    }

    fn delete_node(&mut self, node: &str) {
        self.nodes.remove(node);
        self.dirty_nodes.insert(node.to_owned());
    }

    fn recompute(&mut self) {
        let changes = self.planner.recompute();
        self.dirty_nodes.extend(changes.nodes);
        self.dirty_status.extend(changes.links);
    }

    /// The node's plan and its ready agent (when a rolling update shows two ready agents, the one with the
    /// greatest UID, so that the choice is stable).
    fn node_input(&self, node: &str) -> NodeInput {
        let plan = self.planner.node_plan(node).cloned().unwrap_or_else(|| NodePlan {
            node: node.to_owned(),
            version: 0,
            pods: Vec::new(),
        });
        let agent = self
            .agents
            .values()
            .filter(|a| a.node.as_deref() == Some(node) && a.ready && a.ip.is_some())
            .max_by(|a, b| a.uid.cmp(&b.uid));
        NodeInput {
            plan: Arc::new(plan),
            agent: agent.and_then(|a| a.ip).map(|ip| SocketAddr::new(ip, self.ctx.config.agent_port)),
            agent_uid: agent.map(|a| a.uid.clone()),
        }
    }

    fn after_batch(&mut self) {
        let pairs: usize = self.planner.node_plans().flat_map(|p| &p.pods).map(|p| p.destinations.len()).sum();
        self.ctx.metrics.pairs.set(pairs as i64);
        self.ctx.metrics.links.set(self.links.len() as i64);
        self.ctx.metrics.nodes.set(self.planner.node_plans().count() as i64);
        for node in std::mem::take(&mut self.dirty_nodes) {
            // A node with neither agent nor plan needs no dispatcher. A pod whose Node object is gone keeps its
            // node's dispatcher, which reports the missing agent in the link's status.
            let input = self.node_input(&node);
            if input.agent_uid.is_none() && input.plan.pods.is_empty() {
                self.dispatchers.remove(&node);
                self.reports.lock().unwrap_or_else(|p| p.into_inner()).remove(&node);
            } else {
                self.dispatchers.set(&node, input);
            }
        }
        self.flush_statuses();
        if self.leading() && self.synced() {
            self.check_cleanups();
            self.ensure_finalizers();
        }
    }

    fn housekeeping(&mut self) {
        if self.leading() && self.synced() {
            self.check_cleanups();
            self.ensure_finalizers();
        }
    }

    fn flush_statuses(&mut self) {
        if self.dirty_status.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty_status);
        let progress = {
            let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
            status::progress(self.planner.node_plans(), &reports)
        };
        let now = now_seconds();
        let mut queued_any = false;
        for key in dirty {
            let Some(meta) = self.links.get(&key) else { continue };
            if meta.deleting {
                continue;
            }
            let Some(facts) = self.planner.link_facts(&key) else { continue };
            let new = status::link_status(&facts, progress.get(&key), meta.status.as_ref(), &now);
            if Some(&new) == meta.status.as_ref() || self.queued.get(&key) == Some(&new) {
                continue;
            }
            self.queued.insert(key.clone(), new.clone());
            let job = StatusJob { status: new, previous: meta.status.clone(), reference: meta.reference.clone() };
            self.status_jobs.lock().unwrap_or_else(|p| p.into_inner()).insert(key, job);
            queued_any = true;
        }
        if queued_any {
            self.status_notify.notify_one();
        }
    }

    fn check_cleanups(&mut self) {
        let reports = self.reports.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let now = Instant::now();
        for (key, pending) in &self.cleanups {
            let Some(meta) = self.links.get(key) else { continue };
            let (note, warn) = match cleanup_state(key, &pending.affected, &self.nodes, &reports) {
                Cleanup::Done { gone_nodes } if gone_nodes.is_empty() => (None, false),
                Cleanup::Done { gone_nodes } => (
                    Some(format!("node(s) {} no longer exist; nothing to clean up there", gone_nodes.join(", "))),
                    false,
                ),
                Cleanup::Waiting { nodes } if now >= pending.deadline => (
                    Some(format!(
                        "removed the finalizer after {:?} although node(s) {} did not confirm removing this link's impairments",
                        self.ctx.config.cleanup_timeout,
                        nodes.join(", ")
                    )),
                    true,
                ),
                Cleanup::Waiting { .. } => continue,
            };
            let remaining: Vec<String> = meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
            let patch = finalizers_patch(&remaining, meta.resource_version.as_deref());
            let event = note.map(|note| KubeEvent {
                type_: if warn { EventType::Warning } else { EventType::Normal },
                reason: if warn { "CleanupTimedOut" } else { "CleanupSkippedNode" }.into(),
                note: Some(note),
                action: "RemoveFinalizer".into(),
                secondary: None,
            });
            self.patch_finalizers(key.clone(), patch, meta.reference.clone(), event);
        }
    }

    fn ensure_finalizers(&mut self) {
        for (key, meta) in &self.links {
            if meta.deleting || meta.finalizers.iter().any(|f| f == FINALIZER) {
                continue;
            }
            let mut all = meta.finalizers.clone();
            all.push(FINALIZER.to_owned());
            let patch = finalizers_patch(&all, meta.resource_version.as_deref());
            self.patch_finalizers(key.clone(), patch, meta.reference.clone(), None);
        }
    }

    /// Patches a link's finalizers in the background, at most one patch per link at a time.
    fn patch_finalizers(
        &self,
        key: ObjectKey,
        patch: serde_json::Value,
        reference: ObjectReference,
        event: Option<KubeEvent>,
    ) {
        if !self.finalizer_busy.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone()) {
            return;
        }
        let ctx = self.ctx.clone();
        let busy = self.finalizer_busy.clone();
        tokio::spawn(async move {
            let api: Api<NetworkLink> = Api::namespaced(ctx.client.clone(), &key.namespace);
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

/// Writes queued statuses while leading (server-side apply on the status subresource) and publishes an Event for
/// each condition a user should notice.
async fn write_statuses(ctx: Arc<Context>, jobs: Arc<Mutex<BTreeMap<ObjectKey, StatusJob>>>, notify: Arc<Notify>) {
    let mut leader = ctx.leader.clone();
    let params = PatchParams::apply(&ctx.config.field_manager).force();
    loop {
        tokio::select! {
            _ = notify.notified() => {}
            _ = leader.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        if !*leader.borrow_and_update() {
            continue;
        }
        let batch = std::mem::take(&mut *jobs.lock().unwrap_or_else(|p| p.into_inner()));
        for (key, job) in batch {
            if !*leader.borrow() {
                break; // lost the lease: stop writing at once; the next leader recomputes everything
            }
            let api: Api<NetworkLink> = Api::namespaced(ctx.client.clone(), &key.namespace);
            let body = serde_json::json!({
                "apiVersion": "isthmus.dev/v1alpha1",
                "kind": "NetworkLink",
                "status": job.status,
            });
            match api.patch_status(&key.name, &params, &Patch::Apply(&body)).await {
                Ok(_) => {
                    ctx.metrics.status_patch(true);
                    for c in status::transitions(job.previous.as_ref(), &job.status) {
                        let (type_, notable) = match (c.type_.as_str(), c.status.as_str()) {
                            (status::DEGRADED, "True") => (EventType::Warning, true),
                            (status::READY, "True") if c.reason == "Applied" => (EventType::Normal, true),
                            (status::OVERLAPPING, "True") => (EventType::Normal, true),
                            _ => (EventType::Normal, false),
                        };
                        if !notable {
                            continue;
                        }
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
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    ctx.metrics.status_patch(false);
                    tracing::warn!(link = %key, error = %e, "writing status");
                    let mut pending = jobs.lock().unwrap_or_else(|p| p.into_inner());
                    pending.entry(key).or_insert(job);
                }
            }
        }
    }
}
