//! Applying the node's plan: per pod, find the namespace and reconcile its interface; remove what the plan no
//! longer wants; adopt what is installed when the agent starts.
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
//! - Each pod keeps one [`Datapath`] (one netlink connection in its namespace) across plans, dropped when the
//!   pod leaves the plan or its sandbox (namespace) changes. Plans go through [`Datapath::update`]: against the
//!   record of what was last installed, so an unchanged plan sends nothing and needs no dump, and a changed one
//!   sends only the difference. Without a record — a new connection (new pod, new sandbox, agent restart), a
//!   fresh install (the kernel picked some filter handles), any refusal — `update` takes the full path (dump,
//!   diff, send) once. Because `update` trusts its record, a periodic resync ([`Node::resync`]) runs the full
//!   path on every pod so that changes made behind isthmus's back are found and repaired.
//! - Memory (a node of 100 pods × 100 destinations must stay small): a plan is parsed pod by pod (one pod's JSON
//!   tree at a time, never the whole plan's); each destination is kept as its address plus an impairment and a
//!   link shared with every other destination that has the same; a pod's desired state is built only while it
//!   is reconciled.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::Instant;

use futures::StreamExt;
use ipnet::IpNet;
use isthmus_agent_api::{
    AdoptedTree, ApplyReply, Capabilities, Impairment, ImpairmentFields, LinkRef, NodePlan, ObservedDestination,
    ObservedPod, ObservedState, PodError, PodErrorKind, PodOutcome, PodPlan, PodResult,
};
use serde::Deserialize;

use crate::datapath::{Datapath, DatapathError, DesiredState};
use crate::metrics::{LinkSample, Metrics, PodName};
use crate::netns::{self, Netns, NetnsId, PodIdentity, ResolveError, Resolver, Sources};

/// A plan whose pods are parsed one by one, so that one malformed pod does not reject the whole plan.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawNodePlan {
    pub node: String,
    pub version: u64,
    #[serde(default)]
    pub pods: Vec<PlanPod>,
}

/// One entry of a plan's `pods`.
#[derive(Debug)]
pub enum PlanPod {
    /// `pod.destinations` is empty: they are in `destinations`, sorted by destination, each impairment and link
    /// shared with every other destination of the plan that has the same one.
    Valid { pod: PodPlan, destinations: Vec<Destination> },
    /// The entry is not a valid pod plan: `message` says which field and why; the identity is what could be read.
    Malformed { uid: String, namespace: String, name: String, message: String },
}

/// One destination of a pod, compact: 10,000 of them are held for a node of 100 pods.
pub type Destination = (IpNet, Arc<Impairment>, Arc<LinkRef>);

thread_local! {
    /// The interner of the plan being parsed on this thread (see [`RawNodePlan::from_json`]).
    static PARSE_INTERNER: std::cell::RefCell<Option<Interner>> = const { std::cell::RefCell::new(None) };
}

impl PlanPod {
    fn valid(mut pod: PodPlan, interner: &mut Interner) -> Self {
        let mut destinations: Vec<Destination> = std::mem::take(&mut pod.destinations)
            .into_iter()
            .map(|d| (d.destination, interner.impairment(d.impairment), interner.link(d.link)))
            .collect();
        destinations.sort_by_key(|d| d.0);
        PlanPod::Valid { pod, destinations }
    }
}

impl<'de> Deserialize<'de> for PlanPod {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // One pod's JSON as a value tree (kilobytes), then typed and made compact; the value tree of the whole
        // plan (several times its JSON) and its typed destinations (280 bytes each) are never held at once.
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(match PodPlan::deserialize(&value) {
            Ok(pod) => PARSE_INTERNER.with_borrow_mut(|interner| match interner {
                Some(interner) => PlanPod::valid(pod, interner),
                None => PlanPod::valid(pod, &mut Interner::default()),
            }),
            Err(e) => {
                let (uid, namespace, name) = identity_of(&value);
                let message = invalid_impairment(&value).unwrap_or_else(|| e.to_string());
                PlanPod::Malformed { uid, namespace, name, message }
            }
        })
    }
}

impl RawNodePlan {
    /// Parses a plan, sharing equal impairments and links between all its pods.
    pub fn from_json(json: &[u8]) -> Result<Self, serde_json::Error> {
        PARSE_INTERNER.set(Some(Interner::default()));
        let plan = serde_json::from_slice(json);
        PARSE_INTERNER.set(None);
        plan
    }
}

impl From<&NodePlan> for RawNodePlan {
    fn from(plan: &NodePlan) -> Self {
        let mut interner = Interner::default();
        Self {
            node: plan.node.clone(),
            version: plan.version,
            pods: plan.pods.iter().cloned().map(|pod| PlanPod::valid(pod, &mut interner)).collect(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("node: the plan is for node {got:?} but this agent runs on {expected:?}")]
    WrongNode { expected: String, got: String },
    #[error("the apply task failed: {0}")]
    Task(String),
}

/// One pod's tree as installed by the plan in force, with the connection that installed it.
struct InstalledPod {
    /// Namespace and name, shared with the link metrics.
    pod: Arc<PodName>,
    interface: String,
    netns: Arc<Netns>,
    /// Kept across plans while the pod stays in the same namespace; its record makes the next plan cheap.
    datapath: Arc<Datapath>,
    /// What the plan asked for, per destination (sorted): the impairment and the link that asked for it, each
    /// shared with every destination that has the same one. The resync brings the kernel back to it.
    destinations: Vec<Destination>,
}

impl std::fmt::Debug for InstalledPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstalledPod")
            .field("pod", &self.pod)
            .field("interface", &self.interface)
            .field("netns", &self.netns.id())
            .field("destinations", &self.destinations.len())
            .finish_non_exhaustive()
    }
}

impl InstalledPod {
    fn link(&self, destination: &IpNet) -> Option<&Arc<LinkRef>> {
        self.destinations.binary_search_by(|(d, _, _)| d.cmp(destination)).ok().map(|i| &self.destinations[i].2)
    }

    fn desired(&self) -> Result<DesiredState, DatapathError> {
        desired_state(&self.destinations)
    }
}

#[derive(Debug, Clone)]
struct AdoptedEntry {
    netns: Arc<Netns>,
    interface: String,
}

#[derive(Debug, Default)]
struct Applied {
    /// None until the first plan.
    version: Option<u64>,
    pods: HashMap<String, Arc<InstalledPod>>,
    adopted: Vec<AdoptedEntry>,
    last_results: Vec<PodResult>,
}

/// What observe and the metrics read, replaced at the end of each apply.
#[derive(Debug, Default)]
struct Snapshot {
    version: u64,
    pods: Vec<(String, Arc<InstalledPod>)>,
    adopted: Vec<AdoptedEntry>,
}

/// Settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub sources: Sources,
    /// Pods reconciled at once.
    pub parallelism: usize,
}

/// Pods whose counters are dumped at once by `observe`: each dump is held in full until it is read.
const OBSERVE_PARALLELISM: usize = 4;

/// A pod ready to be reconciled: its plan without the destinations, which became `destinations`. Its desired
/// state is built only while it is reconciled, so that an apply holds few at once.
struct PodJob {
    index: usize,
    pod: PodPlan,
    destinations: Vec<Destination>,
}

fn desired_state(destinations: &[Destination]) -> Result<DesiredState, DatapathError> {
    DesiredState::new(destinations.iter().map(|(d, impairment, _)| (*d, impairment.clone())))
}

/// The connection a pod was reconciled on, and the mutations sent.
type ReconciledOn = (Arc<Datapath>, usize);

/// A tree to remove: its namespace, and the pod's connection there if it had one.
type Removal = (Arc<Netns>, Option<Arc<Datapath>>);

/// Which way a pod was (or is to be) reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReconcilePath {
    /// Dump, diff, send: the resync, and every call on a fresh connection.
    Full,
    /// Diff against the connection's record and send (the full path when it has none).
    Record,
}

impl ReconcilePath {
    fn label(self) -> &'static str {
        match self {
            ReconcilePath::Full => "full",
            ReconcilePath::Record => "record",
        }
    }
}

/// The links and impairments of one plan, each kept once: 10,000 destinations asked for by 100 links hold 100
/// `LinkRef`s and as many distinct impairments as the plan has.
#[derive(Default)]
struct Interner {
    links: HashSet<Arc<LinkRef>>,
    /// Keyed by their `Debug` text: `Impairment` holds floats, so it is neither `Eq` nor `Hash`; the text is
    /// exact (floats print round-trip) and validated impairments hold no NaN.
    impairments: HashMap<String, Arc<Impairment>>,
}

impl Interner {
    fn link(&mut self, link: LinkRef) -> Arc<LinkRef> {
        if let Some(existing) = self.links.get(&link) {
            return existing.clone();
        }
        let link = Arc::new(link);
        self.links.insert(link.clone());
        link
    }

    fn impairment(&mut self, impairment: Impairment) -> Arc<Impairment> {
        self.impairments.entry(format!("{impairment:?}")).or_insert_with(|| Arc::new(impairment)).clone()
    }
}

#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    capabilities: Capabilities,
    resolver: Arc<StdMutex<Resolver>>,
    applied: tokio::sync::Mutex<Applied>,
    snapshot: RwLock<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
}

impl Node {
    /// Probes the kernel and adopts the isthmus trees already installed in the node's namespaces (without
    /// changing them).
    pub async fn start(config: NodeConfig, metrics: Arc<Metrics>) -> std::io::Result<Arc<Self>> {
        let capabilities = crate::datapath::probe().await;
        tracing::info!(?capabilities, "kernel capabilities probed");
        let resolver = Resolver::new(config.sources.clone())?;
        let own = resolver.own_id();
        let adopted = find_installed(&config.sources, Some(own), config.parallelism).await?;
        for entry in &adopted {
            tracing::info!(netns = %entry.netns.id(), interface = %entry.interface, "adopted an installed isthmus tree");
        }
        release_freed_memory();
        let snapshot = Snapshot { version: 0, pods: Vec::new(), adopted: adopted.clone() };
        Ok(Arc::new(Self {
            config,
            capabilities,
            resolver: Arc::new(StdMutex::new(resolver)),
            applied: tokio::sync::Mutex::new(Applied { adopted, ..Applied::default() }),
            snapshot: RwLock::new(Arc::new(snapshot)),
            metrics,
        }))
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Applies a plan on a thread of its own (it completes even if the caller goes away).
    ///
    /// Datapath futures are driven with `block_on` on a blocking-pool thread because mutations go to the kernel
    /// as batches over a blocking netlink socket (one `sendmsg` per batch, the replies queued before it returns):
    /// that must not occupy a runtime worker that serves the API and the health probes.
    pub async fn apply(self: &Arc<Self>, plan: RawNodePlan) -> Result<ApplyReply, ApplyError> {
        let this = self.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(this.apply_inline(plan)))
            .await
            .map_err(|e| ApplyError::Task(e.to_string()))?
    }

    /// What is installed per pod and destination, with the kernel's counters; refreshes the link metrics.
    pub async fn observe(self: &Arc<Self>) -> ObservedState {
        let this = self.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(this.observe_inline()))
            .await
            .expect("observing never panics")
    }

    /// The full path (dump, diff, send) for every pod of the plan in force, repairing whatever was changed
    /// behind isthmus's back since; returns the mutations it sent (0 when nothing drifted). Waits for an apply
    /// in progress. Nothing to do before the first plan (adopted trees are left as they are until then).
    pub async fn resync(self: &Arc<Self>) -> u64 {
        let this = self.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(this.resync_inline())).await.unwrap_or_default()
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

    async fn resync_inline(&self) -> u64 {
        let applied = self.applied.lock().await;
        let started = Instant::now();
        let pods: Vec<Arc<InstalledPod>> = applied.pods.values().cloned().collect();
        let outcomes: Vec<(Arc<InstalledPod>, Result<usize, DatapathError>)> = futures::stream::iter(pods)
            .map(|pod| async move {
                let outcome = match pod.desired() {
                    Ok(desired) => {
                        self.reconcile_pod(&pod.datapath, &pod.interface, &desired, ReconcilePath::Full).await
                    }
                    Err(e) => Err(e),
                };
                (pod, outcome)
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;
        let mut repaired = 0u64;
        for (pod, outcome) in &outcomes {
            match outcome {
                Ok(0) => {}
                Ok(mutations) => {
                    repaired += *mutations as u64;
                    tracing::warn!(pod = %format!("{}/{}", pod.pod.namespace, pod.pod.name), netns = %pod.netns.id(), interface = %pod.interface, mutations, "resync repaired a tree changed behind isthmus's back");
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", pod.pod.namespace, pod.pod.name), netns = %pod.netns.id(), interface = %pod.interface, error = %e, "resync failed")
                }
            }
        }
        self.metrics.mutations.inc_by(repaired);
        self.metrics.resync_mutations.inc_by(repaired);
        tracing::debug!(pods = outcomes.len(), repaired, elapsed_ms = started.elapsed().as_millis() as u64, "resynced");
        drop(outcomes);
        release_freed_memory();
        repaired
    }

    /// One pod's reconcile on `path`, counted.
    async fn reconcile_pod(
        &self,
        datapath: &Datapath,
        interface: &str,
        desired: &DesiredState,
        path: ReconcilePath,
    ) -> Result<usize, DatapathError> {
        self.metrics.count_reconcile(path.label());
        let report = match path {
            ReconcilePath::Full => datapath.reconcile(interface, desired).await,
            ReconcilePath::Record => datapath.update(interface, desired).await,
        };
        // The record stays; the sockets (and their buffers) are opened again by the pod's next call.
        datapath.release_connection();
        Ok(report?.mutations)
    }

    /// Opens a `Datapath` (its connection and, across plans, its record) in `netns`, counted.
    async fn open_datapath(&self, netns: &Netns) -> Result<Datapath, DatapathError> {
        self.metrics.datapath_connections_opened.inc();
        Datapath::open(netns.fd()).await
    }

    async fn apply_inline(&self, raw: RawNodePlan) -> Result<ApplyReply, ApplyError> {
        let started = Instant::now();
        if raw.node != self.config.name {
            return Err(ApplyError::WrongNode { expected: self.config.name.clone(), got: raw.node });
        }
        let mut applied = self.applied.lock().await;
        if let Some(current) = applied.version
            && raw.version < current
        {
            self.metrics.count_apply("stale");
            tracing::info!(version = raw.version, current, "stale plan ignored");
            return Ok(ApplyReply {
                node: self.config.name.clone(),
                version: current,
                stale: true,
                pods: applied.last_results.clone(),
                capabilities: self.capabilities.clone(),
            });
        }
        let version = raw.version;

        // 1. Check every pod on its own; keep of each only what the apply needs.
        let mut results: Vec<Option<PodResult>> = Vec::with_capacity(raw.pods.len());
        let mut jobs: Vec<PodJob> = Vec::new();
        let mut seen = HashSet::new();
        let mut keep_as_is: HashSet<String> = HashSet::new();
        for (index, entry) in raw.pods.into_iter().enumerate() {
            let (pod, destinations) = match entry {
                PlanPod::Valid { pod, destinations } => (pod, destinations),
                PlanPod::Malformed { uid, namespace, name, message } => {
                    keep_as_is.insert(uid.clone());
                    results.push(Some(failed(
                        &uid,
                        &namespace,
                        &name,
                        PodErrorKind::InvalidPlan,
                        format!("pods[{index}]: {message}"),
                    )));
                    continue;
                }
            };
            if !seen.insert(pod.uid.clone()) {
                results.push(Some(failed_pod(
                    &pod,
                    PodErrorKind::InvalidPlan,
                    format!("pods[{index}].uid: {} appears twice", pod.uid),
                )));
                continue;
            }
            if pod.host_network {
                results.push(Some(failed_pod(
                    &pod,
                    PodErrorKind::HostNetwork,
                    "the pod uses the host network; isthmus never shapes it".into(),
                )));
                continue;
            }
            if let Err(message) = check_interface_name(&pod.interface) {
                keep_as_is.insert(pod.uid.clone());
                results.push(Some(failed_pod(
                    &pod,
                    PodErrorKind::InvalidPlan,
                    format!("pods[{index}].interface: {message}"),
                )));
                continue;
            }
            // Checked here so that the error is the pod's; built again when the pod is reconciled.
            match desired_state(&destinations) {
                Ok(_) => {
                    results.push(None);
                    jobs.push(PodJob { index, pod, destinations });
                }
                Err(e) => {
                    keep_as_is.insert(pod.uid.clone());
                    results.push(Some(failed_pod(&pod, e.kind(), format!("pods[{index}]: {e}"))));
                }
            }
        }

        // 2. Find the namespaces (blocking /proc work and namespace entering on a blocking thread).
        let identities: Vec<PodIdentity> =
            jobs.iter().map(|job| PodIdentity { uid: job.pod.uid.clone(), ips: job.pod.ips.clone() }).collect();
        let resolver = self.resolver.clone();
        let mut resolved = tokio::task::spawn_blocking(move || {
            resolver.lock().unwrap_or_else(|p| p.into_inner()).resolve(&identities)
        })
        .await
        .map_err(|e| ApplyError::Task(e.to_string()))?;

        // 3. Reconcile each found pod, bounded: on its kept connection when the pod is still in the same
        // namespace, otherwise on a new one.
        let mut work = Vec::new();
        for job in jobs {
            match resolved.remove(&job.pod.uid) {
                Some(Ok(netns)) => {
                    let kept = applied
                        .pods
                        .get(&job.pod.uid)
                        .filter(|previous| previous.netns.id() == netns.id())
                        .map(|previous| previous.datapath.clone());
                    work.push((job, netns, kept));
                }
                Some(Err(e)) => {
                    let kind = match e {
                        ResolveError::HostNetwork(_) => PodErrorKind::HostNetwork,
                        ResolveError::NoIps => PodErrorKind::InvalidPlan,
                        _ => PodErrorKind::PodNotFound,
                    };
                    results[job.index] = Some(failed_pod(&job.pod, kind, e.to_string()));
                }
                None => {
                    results[job.index] = Some(failed_pod(&job.pod, PodErrorKind::PodNotFound, "not resolved".into()))
                }
            }
        }
        let outcomes: Vec<(PodJob, Arc<Netns>, Result<ReconciledOn, DatapathError>)> = futures::stream::iter(work)
            .map(|(job, netns, kept)| async move {
                let outcome = async {
                    let datapath = match kept {
                        Some(datapath) => datapath,
                        None => Arc::new(self.open_datapath(&netns).await?),
                    };
                    let desired = desired_state(&job.destinations)?;
                    let mutations =
                        self.reconcile_pod(&datapath, &job.pod.interface, &desired, ReconcilePath::Record).await?;
                    Ok((datapath, mutations))
                }
                .await;
                (job, netns, outcome)
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;

        // 4. The new installed set; what it no longer covers is removed.
        let mut installed: HashMap<String, Arc<InstalledPod>> = HashMap::new();
        for (job, netns, outcome) in outcomes {
            let PodJob { index, pod, destinations } = job;
            let (result, datapath) = match outcome {
                Ok((datapath, mutations)) => (
                    PodResult {
                        uid: pod.uid.clone(),
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        outcome: PodOutcome::Applied,
                        mutations: mutations as u64,
                    },
                    Some(datapath),
                ),
                Err(e) => {
                    // Even a failed reconcile may have installed part of a tree: remember it so that it is removed
                    // once the plan drops the pod. Errors found before any change (a foreign root, no such
                    // interface) leave nothing of ours behind.
                    let leaves_nothing =
                        matches!(e.kind(), PodErrorKind::ForeignQdisc | PodErrorKind::InterfaceNotFound);
                    let result = failed_pod(&pod, e.kind(), e.to_string());
                    let datapath = if leaves_nothing {
                        None
                    } else {
                        match applied.pods.get(&pod.uid).filter(|p| p.netns.id() == netns.id()) {
                            Some(previous) => Some(previous.datapath.clone()),
                            None => self.open_datapath(&netns).await.ok().map(Arc::new),
                        }
                    };
                    (result, datapath)
                }
            };
            results[index] = Some(result);
            if let Some(datapath) = datapath {
                installed.insert(
                    pod.uid.clone(),
                    Arc::new(InstalledPod {
                        pod: Arc::new(PodName { namespace: pod.namespace, name: pod.name }),
                        interface: pod.interface,
                        netns,
                        datapath,
                        destinations,
                    }),
                );
            }
        }
        for uid in &keep_as_is {
            if let Some(previous) = applied.pods.get(uid) {
                installed.entry(uid.clone()).or_insert_with(|| previous.clone());
            }
        }
        let covered: HashSet<(NetnsId, String)> =
            installed.values().map(|p| (p.netns.id(), p.interface.clone())).collect();
        let mut removals: HashMap<(NetnsId, String), Removal> = HashMap::new();
        for previous in applied.pods.values() {
            let key = (previous.netns.id(), previous.interface.clone());
            if !covered.contains(&key) {
                removals.insert(key, (previous.netns.clone(), Some(previous.datapath.clone())));
            }
        }
        for adopted in applied.adopted.drain(..) {
            let key = (adopted.netns.id(), adopted.interface.clone());
            if !covered.contains(&key) {
                removals.entry(key).or_insert((adopted.netns, None));
            }
        }
        // The previous set goes before the removals run: the connections of pods that left the plan close as
        // soon as their tree is removed.
        applied.pods.clear();
        let removed = self.remove_trees(removals).await;

        let results: Vec<PodResult> = results.into_iter().map(|r| r.expect("every pod has a result")).collect();
        let mut total_mutations = 0;
        let mut errors = 0;
        for r in &results {
            total_mutations += r.mutations;
            if let PodOutcome::Failed(e) = &r.outcome {
                errors += 1;
                self.metrics.count_pod_error(e.kind);
                tracing::warn!(pod = %format!("{}/{}", r.namespace, r.name), uid = %r.uid, kind = ?e.kind, error = %e.message, "pod not applied");
            }
        }
        self.metrics.mutations.inc_by(total_mutations);
        self.metrics.pods_in_plan.set(results.len() as i64);
        self.metrics.count_apply(if errors == 0 { "applied" } else { "partial" });
        self.metrics.apply_duration_seconds.observe(started.elapsed().as_secs_f64());
        tracing::info!(
            version,
            pods = results.len(),
            errors,
            mutations = total_mutations,
            removed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plan applied"
        );

        applied.version = Some(version);
        applied.pods = installed;
        applied.last_results = results.clone();
        let mut pods: Vec<(String, Arc<InstalledPod>)> =
            applied.pods.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Snapshot { version, pods, adopted: Vec::new() });
        release_freed_memory();
        Ok(ApplyReply {
            node: self.config.name.clone(),
            version,
            stale: false,
            pods: results,
            capabilities: self.capabilities.clone(),
        })
    }

    /// Removes isthmus trees where the namespace still exists; a namespace gone with its pod took its tree
    /// along. Uses the pod's own connection where it has one.
    async fn remove_trees(&self, removals: HashMap<(NetnsId, String), Removal>) -> usize {
        if removals.is_empty() {
            return 0;
        }
        let resolver = self.resolver.clone();
        let ids: Vec<NetnsId> = removals.keys().map(|(id, _)| *id).collect();
        let live = tokio::task::spawn_blocking(move || {
            resolver.lock().unwrap_or_else(|p| p.into_inner()).still_reachable(ids)
        })
        .await
        .unwrap_or_default();
        let removed: Vec<bool> = futures::stream::iter(removals.into_iter().filter(|((id, _), _)| live.contains(id)))
            .map(|((id, interface), (netns, datapath))| async move {
                let outcome = async {
                    let datapath = match datapath {
                        Some(datapath) => datapath,
                        None => Arc::new(self.open_datapath(&netns).await?),
                    };
                    self.reconcile_pod(&datapath, &interface, &DesiredState::empty(), ReconcilePath::Full).await
                };
                match outcome.await {
                    Ok(_) => {
                        tracing::info!(netns = %id, %interface, "removed an isthmus tree the plan no longer wants");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(netns = %id, %interface, error = %e, "could not remove an isthmus tree");
                        false
                    }
                }
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;
        let count = removed.into_iter().filter(|r| *r).count();
        self.metrics.trees_removed.inc_by(count as u64);
        count
    }

    async fn observe_inline(&self) -> ObservedState {
        let snapshot = self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone();
        // Few pods at a time: each holds its whole dump until it is read.
        let pods: Vec<(ObservedPod, Vec<LinkSample>)> = futures::stream::iter(snapshot.pods.iter())
            .map(|(uid, pod)| async move {
                let counters = observe_with(&pod.datapath, &pod.netns, &pod.interface).await;
                let mut destinations = Vec::with_capacity(counters.len());
                let mut samples = Vec::with_capacity(counters.len());
                for (destination, counters) in counters {
                    let link = pod.link(&destination);
                    if let Some(link) = link {
                        samples.push(LinkSample { pod: pod.pod.clone(), destination, link: link.clone(), counters });
                    }
                    destinations.push(ObservedDestination {
                        destination,
                        link: link.map(|l| l.as_ref().clone()),
                        counters,
                    });
                }
                let observed = ObservedPod {
                    uid: uid.clone(),
                    namespace: pod.pod.namespace.clone(),
                    name: pod.pod.name.clone(),
                    destinations,
                };
                (observed, samples)
            })
            .buffered(OBSERVE_PARALLELISM.min(self.config.parallelism.max(1)))
            .collect()
            .await;
        let mut adopted = Vec::new();
        for entry in &snapshot.adopted {
            let destinations = observe_interface(&entry.netns, &entry.interface)
                .await
                .into_iter()
                .map(|(destination, counters)| ObservedDestination { destination, link: None, counters })
                .collect();
            adopted.push(AdoptedTree {
                netns_inode: entry.netns.id().inode,
                interface: entry.interface.clone(),
                destinations,
            });
        }
        let mut all_samples = Vec::with_capacity(pods.iter().map(|(_, l)| l.len()).sum());
        let mut observed_pods = Vec::with_capacity(pods.len());
        for (pod, samples) in pods {
            observed_pods.push(pod);
            all_samples.extend(samples);
        }
        self.metrics.set_link_counters(all_samples);
        ObservedState {
            node: self.config.name.clone(),
            version: snapshot.version,
            pods: observed_pods,
            capabilities: self.capabilities.clone(),
            adopted,
        }
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

fn failed(uid: &str, namespace: &str, name: &str, kind: PodErrorKind, message: String) -> PodResult {
    PodResult {
        uid: uid.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        outcome: PodOutcome::Failed(PodError { kind, message }),
        mutations: 0,
    }
}

fn failed_pod(pod: &PodPlan, kind: PodErrorKind, message: String) -> PodResult {
    failed(&pod.uid, &pod.namespace, &pod.name, kind, message)
}

/// The pod's identity from a pod entry that did not parse, as far as it can be read.
fn identity_of(value: &serde_json::Value) -> (String, String, String) {
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    (field("uid"), field("namespace"), field("name"))
}

/// The first destination of a pod entry whose impairment's fields are not a valid impairment, and why: serde's
/// message names the field inside the impairment but not the destination.
fn invalid_impairment(pod: &serde_json::Value) -> Option<String> {
    pod.get("destinations")?.as_array()?.iter().find_map(|entry| {
        let fields = ImpairmentFields::deserialize(entry.get("impairment")?).ok()?;
        let error = Impairment::try_from(fields).err()?;
        let destination = IpNet::deserialize(entry.get("destination")?).ok()?.trunc();
        Some(format!("destination {destination}: {error}"))
    })
}

/// Linux interface names: 1 to 15 bytes, no `/`, no whitespace, not `.` or `..`.
fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{name:?} must be 1 to 15 bytes long"));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}

async fn reconcile(netns: &Netns, interface: &str, desired: &DesiredState) -> Result<usize, DatapathError> {
    let datapath = Datapath::open(netns.fd()).await?;
    Ok(datapath.reconcile(interface, desired).await?.mutations)
}

/// The counters on `interface`, read over the pod's kept connection.
async fn observe_with(
    datapath: &Datapath,
    netns: &Netns,
    interface: &str,
) -> Vec<(IpNet, isthmus_agent_api::Counters)> {
    let observed = datapath.observe(interface).await;
    datapath.release_connection();
    match observed {
        Ok(Some(counters)) => counters,
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::debug!(netns = %netns.id(), %interface, error = %e, "cannot observe");
            Vec::new()
        }
    }
}

async fn observe_interface(netns: &Netns, interface: &str) -> Vec<(IpNet, isthmus_agent_api::Counters)> {
    let observed = async {
        let datapath = Datapath::open(netns.fd()).await?;
        datapath.observe(interface).await
    };
    match observed.await {
        Ok(Some(counters)) => counters,
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::debug!(netns = %netns.id(), %interface, error = %e, "cannot observe");
            Vec::new()
        }
    }
}

/// Every (namespace, interface) holding an isthmus tree, except in `skip` (the agent's own namespace).
async fn find_installed(
    sources: &Sources,
    skip: Option<NetnsId>,
    parallelism: usize,
) -> std::io::Result<Vec<AdoptedEntry>> {
    let sources = sources.clone();
    let (namespaces, inventories) = tokio::task::spawn_blocking(move || {
        let namespaces = netns::all_namespaces(&sources)?;
        let inventories = netns::inventory_many(namespaces.iter(), parallelism);
        Ok::<_, std::io::Error>((namespaces, inventories))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut candidates = Vec::new();
    for ns in namespaces {
        if Some(ns.id()) == skip {
            continue;
        }
        let Some(Some(inventory)) = inventories.get(&ns.id()) else { continue };
        let ns = Arc::new(ns);
        for interface in &inventory.interfaces {
            candidates.push(AdoptedEntry { netns: ns.clone(), interface: interface.clone() });
        }
    }
    let found: Vec<Option<AdoptedEntry>> = futures::stream::iter(candidates)
        .map(|entry| async move {
            let installed = async {
                let datapath = Datapath::open(entry.netns.fd()).await?;
                datapath.installed(&entry.interface).await
            };
            match installed.await {
                Ok(Some(_)) => Some(entry),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(netns = %entry.netns.id(), interface = %entry.interface, error = %e, "cannot read installed state");
                    None
                }
            }
        })
        .buffer_unordered(parallelism.max(1))
        .collect()
        .await;
    Ok(found.into_iter().flatten().collect())
}

/// Removes every isthmus tree from every interface of every namespace on the node (the `cleanup` mode).
/// Returns how many trees were removed; trees that could not be removed are reported as errors.
pub async fn cleanup(sources: &Sources, parallelism: usize) -> std::io::Result<(usize, Vec<String>)> {
    let installed = find_installed(sources, None, parallelism).await?;
    let outcomes: Vec<Result<(), String>> = futures::stream::iter(installed)
        .map(|entry| async move {
            reconcile(&entry.netns, &entry.interface, &DesiredState::empty())
                .await
                .map(
                    |_| tracing::info!(netns = %entry.netns.id(), interface = %entry.interface, "removed isthmus tree"),
                )
                .map_err(|e| format!("{} {}: {e}", entry.netns.id(), entry.interface))
        })
        .buffer_unordered(parallelism.max(1))
        .collect()
        .await;
    let removed = outcomes.iter().filter(|o| o.is_ok()).count();
    let errors = outcomes.into_iter().filter_map(Result::err).collect();
    Ok((removed, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_parses_pod_by_pod_and_shares_equal_links_and_impairments() {
        let destination = |ip: &str, rate: u64, link: &str| {
            serde_json::json!({
                "destination": ip,
                "impairment": {"rateBps": rate},
                "link": {"namespace": "default", "name": link, "direction": "forward"},
            })
        };
        let pod = |uid: &str, destinations: Vec<serde_json::Value>| serde_json::json!({"uid": uid, "namespace": "default", "name": uid, "ips": ["10.0.0.1"], "destinations": destinations});
        let json = serde_json::json!({
            "node": "n",
            "version": 7,
            "pods": [
                pod("a", vec![destination("10.0.0.3/32", 1000, "l1"), destination("10.0.0.2/32", 1000, "l1")]),
                {"uid": "bad", "namespace": "default", "name": "bad", "ips": "not a list"},
                pod("c", vec![destination("10.0.0.2/32", 2000, "l1")]),
                pod("zero", vec![destination("10.0.0.1/32", 0, "l1")]),
            ],
        });
        let plan = RawNodePlan::from_json(json.to_string().as_bytes()).unwrap();
        assert_eq!((plan.node.as_str(), plan.version, plan.pods.len()), ("n", 7, 4));
        let PlanPod::Valid { destinations: a, .. } = &plan.pods[0] else { panic!("{:?}", plan.pods[0]) };
        let PlanPod::Valid { destinations: c, .. } = &plan.pods[2] else { panic!("{:?}", plan.pods[2]) };
        assert_eq!(a.iter().map(|d| d.0.to_string()).collect::<Vec<_>>(), ["10.0.0.2/32", "10.0.0.3/32"], "sorted");
        assert!(Arc::ptr_eq(&a[0].2, &a[1].2) && Arc::ptr_eq(&a[0].2, &c[0].2), "one link, one allocation");
        assert!(Arc::ptr_eq(&a[0].1, &a[1].1), "equal impairments share one allocation");
        assert!(!Arc::ptr_eq(&a[0].1, &c[0].1), "different impairments do not");
        match &plan.pods[1] {
            PlanPod::Malformed { uid, message, .. } => {
                assert_eq!(uid, "bad");
                assert!(message.contains("sequence"), "{message}");
            }
            other => panic!("expected a malformed pod, got {other:?}"),
        }
        // An invalid impairment is the pod's error, naming the destination and the field.
        match &plan.pods[3] {
            PlanPod::Malformed { uid, message, .. } => {
                assert_eq!(uid, "zero");
                assert!(message.contains("10.0.0.1/32") && message.contains("rate"), "{message}");
            }
            other => panic!("expected a malformed pod, got {other:?}"),
        }
    }
}
