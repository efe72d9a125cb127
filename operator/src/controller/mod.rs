//! The controller around the pure plan: watches feed one task that owns the [`Planner`]; after each batch of
//! events it recomputes what changed, hands each changed node's plan to that node's dispatcher ([`nodes`]),
//! queues the statuses that changed ([`status`]) and drives the cleanup finalizer ([`finalizer`]). Only the
//! leader dispatches and writes; a follower keeps the index warm. Pods that declare the readiness gate get their
//! condition decided after each batch too ([`gates`]).
//!
//! The task's state is [`Controller`]; each job extends it in its own file: `watch.rs` and `watch_kinds.rs` (one
//! typed description per watched resource), `ingest.rs` (events and re-lists), `links.rs` (NetworkLink
//! objects), `node_agents.rs` (which agent serves each node), `cleanup.rs` (finalizer patches), `measure.rs` (polling
//! the agents' measurements), `status/writer.rs` (status writes) and `gates/writer.rs` (readiness gate writes).

pub mod agent_api;
mod cleanup;
pub mod finalizer;
pub mod gates;
mod ingest;
mod links;
pub mod measure;
mod node_agents;
pub mod nodes;
pub mod status;
pub mod version;
pub mod watch;
mod watch_kinds;
mod write_loop;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Recorder;
use tokio::sync::mpsc;

use crate::index::ObjectKey;
use crate::metrics::Metrics;
use crate::plan::{PlanLimits, Planner};
use agent_api::AgentApi;
use cleanup::PendingCleanup;
use gates::writer::GateQueue;
use ingest::Relist;
use links::LinkMeta;
use measure::{MeasureConfig, Measurements};
use node_agents::AgentPod;
use nodes::{DispatchConfig, Dispatchers, Reports, Shared};
use status::writer::StatusQueue;
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
    /// How many destinations a link and a pod may have.
    pub limits: PlanLimits,
    /// Polling the agents' measurements (`measure.rs`).
    pub measure: MeasureConfig,
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

/// The controller task's state.
struct Controller {
    ctx: Arc<Context>,
    planner: Planner,
    agents: BTreeMap<ObjectKey, AgentPod>,
    nodes: BTreeSet<String>,
    links: BTreeMap<ObjectKey, LinkMeta>,
    /// Stored links that cannot be read, with their generation and why (links.rs).
    unreadable: BTreeMap<ObjectKey, (Option<i64>, crate::api::Undecodable)>,
    cleanups: BTreeMap<ObjectKey, PendingCleanup>,
    dispatchers: Dispatchers,
    reports: Reports,
    relist: Relist,
    dirty_nodes: BTreeSet<String>,
    status: StatusQueue,
    /// Readiness gate conditions to decide and to write.
    gates: GateQueue,
    /// Links with a finalizer patch in flight.
    finalizer_busy: Arc<Mutex<BTreeSet<ObjectKey>>>,
    /// What the agents measured, merged per link direction.
    measure: Measurements,
}

/// Watches the cluster and runs until `shutdown` turns true.
pub async fn run(ctx: Context, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (tx, rx) = mpsc::channel::<Update>(1024);
    let _watches = watch_kinds::start(&ctx.client, &ctx.config.agents, tx);
    run_with_updates(ctx, rx, shutdown).await
}

/// Runs on the watch events that `updates` delivers, until `shutdown` turns true or `updates` closes. Every
/// Kubernetes write (status, finalizers, Events) still goes through `ctx.client`.
pub async fn run_with_updates(
    ctx: Context,
    mut updates: mpsc::Receiver<Update>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Arc::new(ctx);
    let (reported_tx, mut reported_rx) = mpsc::unbounded_channel();
    let (measured_tx, mut measured_rx) = mpsc::unbounded_channel();
    let mut c = Controller::new(ctx.clone(), reported_tx, measured_tx);
    let writer = c.status.spawn_writer(ctx.clone());
    let gate_writer = c.gates.spawn_writer(ctx.clone());
    let mut leader = ctx.leader.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            update = updates.recv() => {
                let Some(update) = update else { break };
                c.on_updates(update, &mut updates);
            }
            Some(node) = reported_rx.recv() => {
                c.report_changed(node);
                while let Ok(node) = reported_rx.try_recv() {
                    c.report_changed(node);
                }
                c.after_batch();
            }
            Some(results) = measured_rx.recv() => c.on_measured(results),
            changed = leader.changed() => {
                if changed.is_err() { break }
                let leading = *leader.borrow_and_update();
                c.on_leadership(leading);
            }
            _ = tick.tick() => {
                c.refresh_schedules();
                c.housekeeping();
            }
        }
    }
    writer.abort();
    gate_writer.abort();
    tracing::info!("controller stopped");
}

impl Controller {
    fn new(
        ctx: Arc<Context>,
        reported: mpsc::UnboundedSender<String>,
        measured: mpsc::UnboundedSender<measure::PollResults>,
    ) -> Self {
        let reports: Reports = Arc::default();
        let shared = Shared {
            agent_api: ctx.agent_api.clone(),
            config: ctx.config.dispatch.clone(),
            reports: reports.clone(),
            reported,
            leader: ctx.leader.clone(),
            metrics: ctx.metrics.clone(),
        };
        Controller {
            planner: Planner::with_limits(ctx.config.limits),
            ctx,
            agents: BTreeMap::new(),
            nodes: BTreeSet::new(),
            links: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            cleanups: BTreeMap::new(),
            dispatchers: Dispatchers::new(shared),
            reports,
            relist: Relist::default(),
            dirty_nodes: BTreeSet::new(),
            status: StatusQueue::default(),
            gates: GateQueue::default(),
            finalizer_busy: Arc::default(),
            measure: Measurements::new(measured),
        }
    }

    fn leading(&self) -> bool {
        *self.ctx.leader.borrow()
    }

    /// Applies `first` and whatever else is already queued, then recomputes once for the whole burst.
    fn on_updates(&mut self, first: Update, more: &mut mpsc::Receiver<Update>) {
        let started = std::time::Instant::now();
        self.apply(first);
        let mut n = 1;
        while n < 1024 {
            match more.try_recv() {
                Ok(u) => {
                    self.apply(u);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        self.recompute();
        self.after_batch();
        self.ctx.metrics.reconciles.inc();
        self.ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }

    fn on_leadership(&mut self, leading: bool) {
        self.ctx.metrics.leader.set(leading as i64);
        tracing::info!(leading, "leadership changed");
        if leading {
            self.status.new_term(self.links.keys().cloned());
        }
        self.gates.new_term();
        self.after_batch();
    }

    /// A node's agent report changed: its pods' gates and the links its pods hold pairs of may have.
    fn report_changed(&mut self, node: String) {
        self.status.nodes.insert(node.clone());
        self.gates.nodes.insert(node);
    }

    fn recompute(&mut self) {
        let changes = self.planner.recompute();
        self.gates.nodes.extend(changes.nodes.iter().cloned());
        self.status.nodes.extend(changes.nodes.iter().cloned());
        self.gates.all |= changes.selection;
        self.dirty_nodes.extend(changes.nodes);
        self.status.dirty.extend(changes.links);
    }

    fn after_batch(&mut self) {
        let pairs: usize = self.planner.node_plans().flat_map(|p| &p.pods).map(|p| p.destinations.len()).sum();
        self.ctx.metrics.pairs.set(pairs as i64);
        self.ctx.metrics.links.set(self.links.len() as i64);
        self.ctx.metrics.nodes.set(self.planner.node_plans().count() as i64);
        // Until every watch has listed, a node's plan and agent are guesses: a plan made before the links are
        // known is empty and would strip the node's shaping, a node whose agent is not listed yet would be
        // reported as having none. The nodes stay dirty and are dispatched once the view is whole.
        let nodes = if self.relist.all_synced() { std::mem::take(&mut self.dirty_nodes) } else { Default::default() };
        for node in nodes {
            // A node with neither agent nor plan needs no dispatcher. A pod whose Node object is gone keeps its
            // node's dispatcher, which reports the missing agent in the link's status.
            let input = self.node_input(&node);
            if input.agent_instance.is_none() && input.plan.pods.is_empty() {
                self.dispatchers.remove(&node);
                self.reports.lock().unwrap_or_else(|p| p.into_inner()).remove(&node);
                self.status.nodes.insert(node.clone());
            } else {
                self.dispatchers.set(&node, input);
            }
        }
        self.flush_statuses();
        self.flush_gates();
        self.housekeeping();
    }

    fn housekeeping(&mut self) {
        if self.leading() && self.relist.all_synced() {
            self.check_cleanups();
            self.ensure_finalizers();
            self.poll_measurements();
        }
    }
}
