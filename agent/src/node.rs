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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::Instant;

use futures::StreamExt;
use ipnet::IpNet;
use isthmus_agent_api::{
    AdoptedTree, ApplyReply, Capabilities, LinkRef, NodePlan, ObservedDestination, ObservedPod, ObservedState,
    PodError, PodErrorKind, PodOutcome, PodPlan, PodResult,
};
use serde::Deserialize;

use crate::datapath::{Datapath, DatapathError, DesiredState};
use crate::metrics::{LinkLabels, Metrics};
use crate::netns::{self, Netns, NetnsId, PodIdentity, ResolveError, Resolver, Sources};

/// One reconciled pod: its index in the plan, its plan, its namespace and what the datapath said.
type PodOutcomeOf = (usize, PodPlan, Arc<Netns>, Result<usize, DatapathError>);

/// A plan whose pods are parsed one by one, so that one malformed pod does not reject the whole plan.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawNodePlan {
    pub node: String,
    pub version: u64,
    #[serde(default)]
    pub pods: Vec<serde_json::Value>,
}

impl From<&NodePlan> for RawNodePlan {
    fn from(plan: &NodePlan) -> Self {
        Self {
            node: plan.node.clone(),
            version: plan.version,
            pods: plan.pods.iter().map(|p| serde_json::to_value(p).expect("plan types serialize")).collect(),
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

/// One pod's tree as installed by the plan in force.
#[derive(Debug, Clone)]
struct InstalledPod {
    namespace: String,
    name: String,
    interface: String,
    netns: Arc<Netns>,
    links: HashMap<IpNet, LinkRef>,
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
    pods: HashMap<String, InstalledPod>,
    adopted: Vec<AdoptedEntry>,
    last_results: Vec<PodResult>,
}

/// What observe and the metrics read, replaced at the end of each apply.
#[derive(Debug, Default)]
struct Snapshot {
    version: u64,
    pods: Vec<(String, InstalledPod)>,
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

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Applies a plan on a thread of its own (it completes even if the caller goes away).
    ///
    /// Datapath futures are driven with `block_on` on a blocking-pool thread: they need not be `Send` there
    /// (rustc cannot prove `Send` for some of them through higher-ranked closure lifetimes), and the pods of one
    /// apply still progress concurrently because their netlink I/O is asynchronous.
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

        // 1. Parse and check every pod on its own.
        let mut results: Vec<Option<PodResult>> = Vec::with_capacity(raw.pods.len());
        let mut jobs: Vec<(usize, PodPlan, DesiredState)> = Vec::new();
        let mut seen = HashSet::new();
        let mut keep_as_is: HashSet<String> = HashSet::new();
        for (index, value) in raw.pods.iter().enumerate() {
            let pod = match PodPlan::deserialize(value) {
                Ok(pod) => pod,
                Err(e) => {
                    let (uid, namespace, name) = identity_of(value);
                    keep_as_is.insert(uid.clone());
                    results.push(Some(failed(
                        &uid,
                        &namespace,
                        &name,
                        PodErrorKind::InvalidPlan,
                        format!("pods[{index}]: {e}"),
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
            match DesiredState::new(pod.destinations.iter().map(|d| (d.destination, d.impairment.clone()))) {
                Ok(desired) => {
                    results.push(None);
                    jobs.push((index, pod, desired));
                }
                Err(e) => {
                    keep_as_is.insert(pod.uid.clone());
                    results.push(Some(failed_pod(&pod, e.kind(), format!("pods[{index}]: {e}"))));
                }
            }
        }

        // The plan's JSON is no longer needed; a large one is megabytes.
        drop(raw.pods);

        // 2. Find the namespaces (blocking /proc work and namespace entering on a blocking thread).
        let identities: Vec<PodIdentity> =
            jobs.iter().map(|(_, pod, _)| PodIdentity { uid: pod.uid.clone(), ips: pod.ips.clone() }).collect();
        let resolver = self.resolver.clone();
        let mut resolved = tokio::task::spawn_blocking(move || {
            resolver.lock().unwrap_or_else(|p| p.into_inner()).resolve(&identities)
        })
        .await
        .map_err(|e| ApplyError::Task(e.to_string()))?;

        // 3. Reconcile each found pod, bounded.
        let mut work = Vec::new();
        for (index, pod, desired) in jobs {
            match resolved.remove(&pod.uid) {
                Some(Ok(netns)) => work.push((index, pod, desired, netns)),
                Some(Err(e)) => {
                    let kind = match e {
                        ResolveError::HostNetwork(_) => PodErrorKind::HostNetwork,
                        ResolveError::NoIps => PodErrorKind::InvalidPlan,
                        _ => PodErrorKind::PodNotFound,
                    };
                    results[index] = Some(failed_pod(&pod, kind, e.to_string()));
                }
                None => results[index] = Some(failed_pod(&pod, PodErrorKind::PodNotFound, "not resolved".into())),
            }
        }
        let outcomes: Vec<PodOutcomeOf> = futures::stream::iter(work)
            .map(|(index, pod, desired, netns)| async move {
                let outcome = reconcile(&netns, &pod.interface, &desired).await;
                (index, pod, netns, outcome)
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await;

        // 4. The new installed set; what it no longer covers is removed.
        let mut installed: HashMap<String, InstalledPod> = HashMap::new();
        for (index, pod, netns, outcome) in outcomes {
            let links = pod.destinations.iter().map(|d| (d.destination, d.link.clone())).collect();
            let mutations = match &outcome {
                Ok(m) => *m as u64,
                Err(_) => 0,
            };
            results[index] = Some(match outcome {
                Ok(_) => PodResult {
                    uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    outcome: PodOutcome::Applied,
                    mutations,
                },
                Err(e) => failed_pod(&pod, e.kind(), e.to_string()),
            });
            // Even a failed reconcile may have installed part of a tree: remember it so that it is removed
            // once the plan drops the pod. Errors found before any change (a foreign root, no such interface)
            // leave nothing of ours behind.
            if matches!(&results[index], Some(PodResult { outcome: PodOutcome::Failed(e), .. })
                if matches!(e.kind, PodErrorKind::ForeignQdisc | PodErrorKind::InterfaceNotFound))
            {
                continue;
            }
            installed.insert(
                pod.uid.clone(),
                InstalledPod { namespace: pod.namespace, name: pod.name, interface: pod.interface, netns, links },
            );
        }
        for uid in &keep_as_is {
            if let Some(previous) = applied.pods.get(uid) {
                installed.entry(uid.clone()).or_insert_with(|| previous.clone());
            }
        }
        let covered: HashSet<(NetnsId, String)> =
            installed.values().map(|p| (p.netns.id(), p.interface.clone())).collect();
        let mut removals: HashMap<(NetnsId, String), Arc<Netns>> = HashMap::new();
        for previous in applied.pods.values() {
            let key = (previous.netns.id(), previous.interface.clone());
            if !covered.contains(&key) {
                removals.insert(key, previous.netns.clone());
            }
        }
        for adopted in applied.adopted.drain(..) {
            let key = (adopted.netns.id(), adopted.interface.clone());
            if !covered.contains(&key) {
                removals.insert(key, adopted.netns);
            }
        }
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
            version = raw.version,
            pods = results.len(),
            errors,
            mutations = total_mutations,
            removed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plan applied"
        );

        release_freed_memory();
        applied.version = Some(raw.version);
        applied.pods = installed;
        applied.last_results = results.clone();
        let mut pods: Vec<(String, InstalledPod)> = applied.pods.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Snapshot { version: raw.version, pods, adopted: Vec::new() });
        Ok(ApplyReply {
            node: self.config.name.clone(),
            version: raw.version,
            stale: false,
            pods: results,
            capabilities: self.capabilities.clone(),
        })
    }

    /// Removes isthmus trees where the namespace still exists; a namespace gone with its pod took its tree
    /// along.
    async fn remove_trees(&self, removals: HashMap<(NetnsId, String), Arc<Netns>>) -> usize {
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
            .map(|((id, interface), netns)| async move {
                match reconcile(&netns, &interface, &DesiredState::empty()).await {
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
        let pods: Vec<(ObservedPod, Vec<(LinkLabels, isthmus_agent_api::Counters)>)> =
            futures::stream::iter(snapshot.pods.iter())
                .map(|(uid, pod)| async move {
                    let counters = observe_interface(&pod.netns, &pod.interface).await;
                    let mut destinations = Vec::new();
                    let mut labelled = Vec::new();
                    for (destination, counters) in counters {
                        let link = pod.links.get(&destination).cloned();
                        if let Some(link) = &link {
                            labelled.push((
                                LinkLabels {
                                    link_namespace: link.namespace.clone(),
                                    link_name: link.name.clone(),
                                    direction: format!("{:?}", link.direction).to_lowercase(),
                                    pod_namespace: pod.namespace.clone(),
                                    pod_name: pod.name.clone(),
                                    destination: destination.to_string(),
                                },
                                counters,
                            ));
                        }
                        destinations.push(ObservedDestination { destination, link, counters });
                    }
                    let observed = ObservedPod {
                        uid: uid.clone(),
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        destinations,
                    };
                    (observed, labelled)
                })
                .buffered(self.config.parallelism.max(1))
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
        let mut all_labelled = Vec::new();
        let mut observed_pods = Vec::new();
        for (pod, labelled) in pods {
            observed_pods.push(pod);
            all_labelled.extend(labelled);
        }
        self.metrics.set_link_counters(all_labelled);
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
fn release_freed_memory() {
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
