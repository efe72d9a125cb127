//! The node: applying its plan (per pod, find the namespace and reconcile its interface; remove what the plan
//! no longer wants), resyncing, observing, adopting what is installed when the agent starts, and the cleanup
//! mode. [`Node`] is the facade the server calls; each job is a module of its own:
//! - `plan`: the plan's JSON, decoded pod by pod;
//! - `apply`: one plan, step by step;
//! - `datapath`: the node's one datapath, tc trees or the userspace loop, and the one way to open, reconcile,
//!   observe and remove a pod's tree or emulation on it ([`PodDatapathError`] covers both);
//! - `resync`, `observe`, `adopt` (trees found at start-up), `cleanup` (the uninstall mode): the other jobs;
//! - `state`: what is installed, as the jobs share it; `probe_view`: what the prober (`crate::measure`) reads
//!   of it, and where it publishes its measurements.
//!
//! Rules:
//! - Plans are versioned. An older version than the one in force is answered as stale and nothing is done; the
//!   same version is applied again (a retried call is harmless: the datapath only sends what differs).
//! - Pods are applied concurrently, at most `parallelism` at once; each pod's failure is reported for that pod
//!   only.
//! - A tree is removed only where isthmus installed it (the datapath refuses to touch foreign qdiscs): for pods
//!   of the previous plan that are gone from this one (if their namespace still exists), on the old
//!   namespace/interface of a pod whose sandbox or interface changed, and, with the first plan after a start,
//!   for adopted trees the plan does not claim.
//! - A pod whose plan is invalid keeps what is installed for it: the error is reported, nothing is changed.
//! - The apply runs on its own task, so a caller that disconnects does not cut it off half-way.
//! - Each pod keeps one [`Datapath`](isthmus_datapaths::datapath::Datapath) (one netlink connection in its namespace)
//!   across plans, dropped when the pod leaves the plan or its sandbox (namespace) changes. Plans go through
//!   `Datapath::update`: against the record of what was last installed, so an unchanged plan sends nothing and
//!   needs no dump, and a changed one sends only the difference. Without a record — a new connection (new pod,
//!   new sandbox, agent restart), a fresh install (the kernel picked some filter handles), any refusal —
//!   `update` takes the full path (dump, diff, send) once. Because `update` trusts its record, a periodic resync
//!   ([`Node::resync`]) runs the full path on every pod so that changes made behind isthmus's back are found
//!   and repaired.
//! - Memory (a node of 100 pods × 100 destinations must stay small): a plan is parsed pod by pod (one pod's JSON
//!   tree at a time, never the whole plan's); each destination is kept as its address plus an impairment and a
//!   link shared with every other destination that has the same; a pod's desired state (which shares those
//!   impairments) is built once per plan, when the pod is checked, and dropped once it is reconciled; the resync
//!   builds it again from the destinations.

mod adopt;
mod apply;
mod cleanup;
mod datapath;
mod observe;
mod phases;
mod plan;
mod probe_view;
mod resync;
mod state;
mod timing;

use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, RwLock};

use isthmus_agent_api::{ApplyReply, Capabilities, DatapathKind, ObservedState};

pub use self::apply::ApplyError;
pub use self::cleanup::cleanup;
use self::datapath::NodeDatapath;
pub use self::datapath::PodDatapathError;
pub use self::plan::{Destination, MalformedPod, PlanPod, ProbeFilter, RawNodePlan};
pub use self::probe_view::{Measurements, ProbePod, ProbeView};
use self::state::{Applied, Snapshot};
use crate::metrics::Metrics;
use isthmus_datapaths::datapath::QueueBudget;
use isthmus_datapaths::netns::{Resolver, Sources};

/// Settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub sources: Sources,
    /// Pods reconciled at once.
    pub parallelism: usize,
    /// What each pod's queues may hold (`isthmus_datapaths::datapath::queue`).
    pub queue_budget: QueueBudget,
    /// What the userspace datapath's queues may hold on the node, every pod's together
    /// (`isthmus_datapaths::userspace::budget`).
    pub userspace_queue_bytes: u64,
    pub datapath: DatapathChoice,
    /// Whether the applied plans' links are probed (`--verify`); off, the node keeps no view for a prober.
    pub verify: bool,
}

/// Which datapath the agent gives its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DatapathChoice {
    /// The tc tree where the kernel has sch_netem, the userspace datapath where it has not.
    #[default]
    Auto,
    Tc,
    Userspace,
}

impl DatapathChoice {
    pub fn resolve(self, netem: bool) -> DatapathKind {
        match (self, netem) {
            (DatapathChoice::Tc, _) | (DatapathChoice::Auto, true) => DatapathKind::Tc,
            (DatapathChoice::Userspace, _) | (DatapathChoice::Auto, false) => DatapathKind::Userspace,
        }
    }
}

#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    capabilities: Capabilities,
    resolver: Arc<StdMutex<Resolver>>,
    datapath: NodeDatapath,
    applied: tokio::sync::Mutex<Applied>,
    snapshot: RwLock<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
    measurements: Measurements,
    /// Told when a plan brings other timelines, so that the phase timer waits for the right instant.
    phases_changed: Arc<tokio::sync::Notify>,
}

impl Drop for Node {
    fn drop(&mut self) {
        // Ends the phase timer's wait: it finds the node gone and stops.
        self.phases_changed.notify_one();
    }
}

impl Node {
    /// Probes the kernel and adopts the isthmus trees already installed in the node's namespaces (without
    /// changing them).
    pub async fn start(config: NodeConfig, metrics: Arc<Metrics>) -> std::io::Result<Arc<Self>> {
        let mut capabilities = isthmus_datapaths::datapath::probe().await;
        capabilities.datapath = config.datapath.resolve(capabilities.netem);
        tracing::info!(?capabilities, "kernel capabilities probed");
        let label = match capabilities.datapath {
            DatapathKind::Tc => "tc",
            DatapathKind::Userspace => "userspace",
        };
        metrics.datapath.get_or_create(&crate::metrics::DatapathLabels { datapath: label.into() }).set(1);
        let userspace = match capabilities.datapath {
            DatapathKind::Tc => None,
            DatapathKind::Userspace => {
                Some(isthmus_datapaths::userspace::Userspace::start(config.userspace_queue_bytes).await?)
            }
        };
        if userspace.is_some() {
            metrics.userspace_loop_running.set(1);
        }
        let resolver = Resolver::new(config.sources.clone())?;
        let (config_name, verify) = (config.name.clone(), config.verify);
        let adopted = adopt::find_installed(&config.sources, Some(resolver.own_id()), config.parallelism).await?;
        for entry in &adopted {
            tracing::info!(netns = %entry.netns.id(), interface = %entry.interface, "adopted an installed isthmus tree");
        }
        release_freed_memory();
        let snapshot = Snapshot { version: 0, pods: Vec::new(), adopted: adopted.clone(), probe: None };
        Ok(Arc::new(Self {
            datapath: NodeDatapath::new(metrics.clone(), config.parallelism, userspace),
            config,
            capabilities,
            resolver: Arc::new(StdMutex::new(resolver)),
            applied: tokio::sync::Mutex::new(Applied { adopted, ..Applied::default() }),
            snapshot: RwLock::new(Arc::new(snapshot)),
            metrics,
            measurements: Measurements::new(&config_name, verify),
            phases_changed: Arc::new(tokio::sync::Notify::new()),
        }))
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// What the prober probes: the plan in force's applied pods; `None` before the first plan or with
    /// verification off.
    pub fn probe_view(&self) -> Option<Arc<ProbeView>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).probe.clone()
    }

    /// The prober's last complete windows (`GET /v1/measured`).
    pub fn measurements(&self) -> &Measurements {
        &self.measurements
    }

    /// Applies a plan on a thread of its own (it completes even if the caller goes away).
    pub async fn apply(self: &Arc<Self>, plan: RawNodePlan) -> Result<ApplyReply, ApplyError> {
        self.on_blocking_thread(move |node| async move { node.apply_inline(plan).await })
            .await
            .map_err(|e| ApplyError::Task(e.to_string()))?
    }

    /// What is installed per pod and destination, with the kernel's counters; refreshes the link metrics.
    pub async fn observe(self: &Arc<Self>) -> ObservedState {
        self.on_blocking_thread(|node| async move { node.observe_inline().await })
            .await
            .expect("observing never panics")
    }

    /// The full path (dump, diff, send) for every pod of the plan in force, repairing whatever was changed
    /// behind isthmus's back since; returns the mutations it sent (0 when nothing drifted). Waits for an apply
    /// in progress. Nothing to do before the first plan (adopted trees are left as they are until then).
    pub async fn resync(self: &Arc<Self>) -> u64 {
        self.on_blocking_thread(|node| async move { node.resync_inline().await }).await.unwrap_or_default()
    }

    /// Runs [`Self::resync`] every `interval`, for as long as the node lives.
    pub fn spawn_resync(self: &Arc<Self>, interval: std::time::Duration) -> tokio::task::JoinHandle<()> {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(node) = node.upgrade() else { return };
                node.resync().await;
            }
        })
    }

    /// Watches the userspace datapath's loop every `interval` for as long as the node lives. Once it has stopped
    /// (by a bug: a panic, or a failed poll), nothing reads the captures and every captured packet is lost while
    /// the pods' links read Applied: the watch fails open at once ([`isthmus_datapaths::userspace::Userspace::fail_open`]),
    /// sets `isthmus_agent_userspace_loop_running` to 0 and calls `stopped` with why (the agent then fails its
    /// liveness probe, so that the kubelet restarts it with a new loop); pods applied since fail with
    /// `DatapathStopped`. `None` with the tc datapath: nothing to watch.
    pub fn spawn_loop_watch(
        self: &Arc<Self>,
        interval: std::time::Duration,
        stopped: impl FnOnce(String) + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let userspace = self.datapath.userspace()?.clone();
        let metrics = self.metrics.clone();
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while userspace.running() {
                ticks.tick().await;
            }
            metrics.userspace_loop_running.set(0);
            let why = match userspace.fail_open().await {
                Ok(removed) => format!(
                    "the userspace datapath's loop stopped: its {removed} captures were removed, so their pods' \
                     traffic leaves unimpaired until the agent restarts"
                ),
                Err(e) => format!(
                    "the userspace datapath's loop stopped, and removing its captures failed ({e}): pods may be \
                     cut off until the agent restarts"
                ),
            };
            tracing::error!(reason = %why, "the userspace datapath's loop stopped");
            stopped(why);
        }))
    }

    /// Runs one job of the node on a blocking-pool thread, driven there with `block_on`: mutations go to the
    /// kernel as batches over a blocking netlink socket (one `sendmsg` per batch, the replies queued before it
    /// returns), which must not occupy a runtime worker that serves the API and the health probes.
    async fn on_blocking_thread<T, F>(
        self: &Arc<Self>,
        job: impl FnOnce(Arc<Self>) -> F + Send + 'static,
    ) -> Result<T, tokio::task::JoinError>
    where
        F: Future<Output = T>,
        T: Send + 'static,
    {
        let node = self.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(job(node))).await
    }
}

/// A large plan's JSON and the kernel dumps are freed by now; hand the memory back to the system instead of
/// keeping it resident until the next plan.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}
