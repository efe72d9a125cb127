//! Applying one plan, step by step: check each pod on its own (one pod's error never blocks another), find the
//! pods' namespaces, reconcile every pod found on its kept connection or a new one, then make the result the
//! installed set and remove the trees it no longer covers.

mod check;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use isthmus_agent_api::{
    ApplyReply, LinkRef, PodErrorKind, PodOutcome, PodPlan, PodResult, QueueCap, RefusedDestination,
};

use self::check::{Progress, applied_pod, failed_pod};
use super::datapath::{PodDatapath, PodDatapathError, ReconcilePath, Removal};
use super::plan::{Destination, RawNodePlan};
use super::state::{Applied, InstalledPod, Leftover, Snapshot};
use super::{Node, release_freed_memory};
use crate::metrics::PodName;
use crate::node::{ProbePod, ProbeView};
use isthmus_agent_api::unix_ms_now;
use isthmus_datapaths::datapath::{DatapathError, DesiredState};
use isthmus_datapaths::netns::{Netns, NetnsId, PodIdentity, ResolveError};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("node: the plan is for node {got:?} but this agent runs on {expected:?}")]
    WrongNode { expected: String, got: String },
    #[error("the apply task failed: {0}")]
    Task(String),
}

/// How a plan went, as the applies metric counts it.
#[derive(Debug, Clone, Copy)]
enum ApplyOutcome {
    /// Every pod applied.
    Applied,
    /// Some pods failed, or some destinations were refused.
    Partial,
    /// Older than the plan in force: nothing done.
    Stale,
}

impl ApplyOutcome {
    fn label(self) -> &'static str {
        match self {
            ApplyOutcome::Applied => "applied",
            ApplyOutcome::Partial => "partial",
            ApplyOutcome::Stale => "stale",
        }
    }
}

/// A pod ready to be reconciled: its plan without the destinations, which became `destinations`, and the
/// desired state they make, checked once (its impairments shared with `destinations`, so it costs an address
/// and a pointer per destination); dropped once the pod is reconciled.
struct PodJob {
    /// Its entry in the plan, where its result goes.
    index: usize,
    pod: PodPlan,
    destinations: Vec<Destination>,
    desired: DesiredState,
    /// Destinations whose `queueLimit` the budgets cut, reported with the pod's result.
    queue_caps: Vec<QueueCap>,
    /// Destinations left out of `destinations` and `desired` because the kernel cannot hold them, reported with
    /// the pod's result.
    refused: Vec<RefusedDestination>,
}

/// A pod whose namespace was found, with its kept connection while it is still in the same one.
struct Found {
    job: PodJob,
    netns: Arc<Netns>,
    kept: Option<Arc<PodDatapath>>,
}

/// A reconciled pod: the handle it was reconciled on (none when it could not be opened) and the mutations
/// sent.
struct Reconciled {
    job: PodJob,
    netns: Arc<Netns>,
    datapath: Option<Arc<PodDatapath>>,
    outcome: Result<usize, PodDatapathError>,
}

impl Node {
    pub(super) async fn apply_inline(&self, raw: RawNodePlan) -> Result<ApplyReply, ApplyError> {
        let started = Instant::now();
        if raw.node != self.config.name {
            return Err(ApplyError::WrongNode { expected: self.config.name.clone(), got: raw.node });
        }
        let mut applied = self.applied.lock().await;
        if let Some(current) = applied.version
            && raw.version < current
        {
            self.metrics.count_apply(ApplyOutcome::Stale.label());
            tracing::info!(version = raw.version, current, "stale plan ignored");
            return Ok(self.reply(current, true, applied.last_results.clone(), &applied.leftovers));
        }
        let version = raw.version;
        let probe_filter = raw.probe_filter;
        let timelines = raw.timelines;
        let mut progress = Progress::check(raw.pods, self.config.queue_budget, &timelines, unix_ms_now());
        let found = self.find_namespaces(&mut progress, &applied).await?;
        let reconciled = self.reconcile_found(found).await;
        let installed = self.installed_set(reconciled, &applied, &mut progress).await;
        let removed = self.remove_uncovered(&mut applied, &installed).await;
        let results = progress.into_results();
        self.record(version, &results, removed, applied.leftovers.len(), started);
        applied.version = Some(version);
        applied.pods = installed;
        applied.last_results = results.clone();
        applied.probe_filter = probe_filter;
        applied.timelines = timelines;
        self.phases_changed.notify_one();
        self.publish(&applied, version);
        release_freed_memory();
        Ok(self.reply(version, false, results, &applied.leftovers))
    }

    /// Step 2: each pod's namespace (blocking /proc work and namespace entering, on a blocking thread); a pod
    /// not found fails.
    async fn find_namespaces(&self, progress: &mut Progress, applied: &Applied) -> Result<Vec<Found>, ApplyError> {
        let identities: Vec<PodIdentity> = progress
            .jobs
            .iter()
            .map(|job| PodIdentity { uid: job.pod.uid.clone(), ips: job.pod.ips.clone() })
            .collect();
        let resolver = self.resolver.clone();
        let mut resolved = tokio::task::spawn_blocking(move || {
            resolver.lock().unwrap_or_else(|p| p.into_inner()).resolve(&identities)
        })
        .await
        .map_err(|e| ApplyError::Task(e.to_string()))?;
        let mut found = Vec::new();
        for job in std::mem::take(&mut progress.jobs) {
            match resolved.remove(&job.pod.uid) {
                Some(Ok(netns)) => {
                    let kept = applied.kept_datapath(&job.pod.uid, &netns);
                    found.push(Found { job, netns, kept });
                }
                Some(Err(e)) => progress.fail(&job, resolve_error_kind(&e), e.to_string()),
                None => progress.fail(&job, PodErrorKind::PodNotFound, "not resolved".into()),
            }
        }
        Ok(found)
    }

    /// Step 3: every pod found, reconciled from its connection's record, `parallelism` at once.
    async fn reconcile_found(&self, found: Vec<Found>) -> Vec<Reconciled> {
        futures::stream::iter(found)
            .map(|Found { job, netns, kept }| async move {
                let datapath = match kept {
                    Some(datapath) => Ok(datapath),
                    None => self.datapath.open(&netns).await.map(Arc::new),
                };
                let (datapath, outcome) = match datapath {
                    Ok(datapath) => {
                        let path = ReconcilePath::Record;
                        let outcome = self.datapath.reconcile(&datapath, &job.pod.interface, &job.desired, path).await;
                        (Some(datapath), outcome)
                    }
                    Err(e) => (None, Err(e)),
                };
                Reconciled { job, netns, datapath, outcome }
            })
            .buffer_unordered(self.config.parallelism.max(1))
            .collect()
            .await
    }

    /// Step 4: the new installed set, each reconciled pod with its result; a pod whose entry was refused keeps
    /// what is installed for it.
    async fn installed_set(
        &self,
        reconciled: Vec<Reconciled>,
        applied: &Applied,
        progress: &mut Progress,
    ) -> HashMap<String, Arc<InstalledPod>> {
        let mut installed = HashMap::new();
        for Reconciled {
            job: PodJob { index, pod, destinations, queue_caps, refused, .. },
            netns,
            datapath,
            outcome,
        } in reconciled
        {
            let datapath = match outcome {
                Ok(mutations) => {
                    progress.results[index] = Some(applied_pod(&pod, mutations, queue_caps, refused));
                    datapath
                }
                Err(e) => {
                    progress.results[index] = Some(failed_pod(&pod, e.kind(), e.to_string()));
                    self.datapath_after_failure(&e, datapath, applied, &pod.uid, &netns).await
                }
            };
            let Some(datapath) = datapath else { continue };
            let name = Arc::new(PodName { namespace: pod.namespace, name: pod.name });
            let entry = InstalledPod { pod: name, interface: pod.interface, netns, datapath, destinations };
            installed.insert(pod.uid, Arc::new(entry));
        }
        for uid in &progress.keep_as_is {
            if let Some(previous) = applied.pods.get(uid) {
                installed.entry(uid.clone()).or_insert_with(|| previous.clone());
            }
        }
        installed
    }

    /// Even a failed reconcile may have installed part of a tree: the pod is remembered, with a connection, so
    /// that its tree is removed once the plan drops it. Errors found before any change (a foreign root, no such
    /// interface) leave nothing of ours behind.
    async fn datapath_after_failure(
        &self,
        error: &PodDatapathError,
        failed_on: Option<Arc<PodDatapath>>,
        applied: &Applied,
        uid: &str,
        netns: &Arc<Netns>,
    ) -> Option<Arc<PodDatapath>> {
        if matches!(error.kind(), PodErrorKind::ForeignQdisc | PodErrorKind::InterfaceNotFound) {
            return None;
        }
        match failed_on.or_else(|| applied.kept_datapath(uid, netns)) {
            Some(datapath) => Some(datapath),
            None => self.datapath.open(netns).await.ok().map(Arc::new),
        }
    }

    /// Step 5: the trees the new set no longer covers go — pods that left the plan, the old namespace or
    /// interface of a pod that moved, adopted trees no plan claims, and the trees earlier plans could not remove.
    /// The previous set goes first: the connections of pods that left close as soon as their tree is removed.
    /// What cannot be removed stays a leftover: reported in the reply, tried again with the next plan.
    async fn remove_uncovered(&self, applied: &mut Applied, installed: &HashMap<String, Arc<InstalledPod>>) -> usize {
        let covered: HashSet<(NetnsId, &str)> =
            installed.values().map(|p| (p.netns.id(), p.interface.as_str())).collect();
        let mut removals: HashMap<(NetnsId, String), Removal> = HashMap::new();
        let previous = applied.pods.drain().map(|(_, p)| Removal {
            netns: p.netns.clone(),
            interface: p.interface.clone(),
            datapath: Some(p.datapath.clone()),
            pod: Some(p.pod.clone()),
            links: links_of(&p.destinations),
        });
        let adopted = applied.adopted.drain(..).map(|a| Removal::unowned(a.netns, a.interface));
        let leftovers = applied.leftovers.drain(..).map(|l| l.removal);
        for removal in previous.chain(adopted).chain(leftovers) {
            if !covered.contains(&(removal.netns.id(), removal.interface.as_str())) {
                removals.entry((removal.netns.id(), removal.interface.clone())).or_insert(removal);
            }
        }
        let (removed, leftovers) = self.remove_trees(removals.into_values().collect()).await;
        self.metrics.leftover_trees.set(leftovers.len() as i64);
        applied.leftovers = leftovers;
        removed
    }

    /// Removes trees where the namespace still exists (a namespace gone with its pod took its tree along, and so
    /// does an interface that is gone); returns how many went and the ones that could not be removed.
    async fn remove_trees(&self, removals: Vec<Removal>) -> (usize, Vec<Leftover>) {
        if removals.is_empty() {
            return (0, Vec::new());
        }
        let resolver = self.resolver.clone();
        let ids: Vec<NetnsId> = removals.iter().map(|r| r.netns.id()).collect();
        let live = tokio::task::spawn_blocking(move || {
            resolver.lock().unwrap_or_else(|p| p.into_inner()).still_reachable(ids)
        })
        .await
        .unwrap_or_default();
        let removals = removals.into_iter().filter(|r| live.contains(&r.netns.id())).collect();
        let mut removed = 0;
        let mut leftovers = Vec::new();
        for (removal, outcome) in self.datapath.remove(removals).await {
            let (netns, interface) = (removal.netns.id(), removal.interface.clone());
            match outcome {
                Ok(()) => {
                    tracing::info!(%netns, %interface, "removed an isthmus tree the plan no longer wants");
                    removed += 1;
                }
                Err(PodDatapathError::Tc(DatapathError::InterfaceNotFound { .. })) => {
                    tracing::info!(%netns, %interface, "the interface of an isthmus tree is gone, and the tree with it");
                }
                Err(e) => {
                    tracing::warn!(%netns, %interface, error = %e, "could not remove an isthmus tree; trying again with the next plan");
                    leftovers.push(Leftover { removal, message: e.to_string() });
                }
            }
        }
        self.metrics.trees_removed.inc_by(removed as u64);
        (removed, leftovers)
    }

    /// The apply in the metrics and the log.
    fn record(&self, version: u64, results: &[PodResult], removed: usize, leftovers: usize, started: Instant) {
        let mut mutations = 0;
        let mut errors = 0;
        let mut capped = 0;
        let mut refused = 0;
        for r in results {
            mutations += r.mutations;
            if let Some(first) = r.refused.first() {
                refused += r.refused.len() as i64;
                tracing::warn!(
                    pod = %format!("{}/{}", r.namespace, r.name),
                    destinations = r.refused.len(),
                    destination = %first.destination,
                    link = %format!("{}/{}", first.link.namespace, first.link.name),
                    error = %first.error.message,
                    "destinations refused: the kernel cannot hold their impairment; the pod's others are applied"
                );
            }
            // One line per pod (its first cap as the example), not one per destination: a plan of 10,000.
            if let Some(cap) = r.queue_caps.first() {
                capped += r.queue_caps.len() as i64;
                tracing::warn!(
                    pod = %format!("{}/{}", r.namespace, r.name),
                    destinations = r.queue_caps.len(),
                    destination = %cap.destination,
                    link = %format!("{}/{}", cap.link.namespace, cap.link.name),
                    requested = cap.requested_packets,
                    installed = cap.installed_packets,
                    "queueLimit cut to the queue budget"
                );
            }
            if let PodOutcome::Failed(e) = &r.outcome {
                errors += 1;
                self.metrics.count_pod_error(e.kind);
                tracing::warn!(pod = %format!("{}/{}", r.namespace, r.name), uid = %r.uid, kind = ?e.kind, error = %e.message, "pod not applied");
            }
        }
        let outcome = if errors == 0 && refused == 0 { ApplyOutcome::Applied } else { ApplyOutcome::Partial };
        self.metrics.mutations.inc_by(mutations);
        self.metrics.pods_in_plan.set(results.len() as i64);
        self.metrics.queue_limits_capped.set(capped);
        self.metrics.destinations_refused.set(refused);
        self.metrics.count_apply(outcome.label());
        self.metrics.apply_duration_seconds.observe(started.elapsed().as_secs_f64());
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            version,
            pods = results.len(),
            errors,
            mutations,
            removed,
            leftovers,
            elapsed_ms,
            "plan applied"
        );
    }

    /// Makes the installed set what observe and the metrics read.
    fn publish(&self, applied: &Applied, version: u64) {
        let mut pods: Vec<(String, Arc<InstalledPod>)> =
            applied.pods.iter().map(|(uid, pod)| (uid.clone(), pod.clone())).collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        let probe = self.config.verify.then(|| Arc::new(probe_view(applied, &pods, version)));
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Snapshot { version, pods, adopted: Vec::new(), probe });
    }

    fn reply(&self, version: u64, stale: bool, pods: Vec<PodResult>, leftovers: &[Leftover]) -> ApplyReply {
        ApplyReply {
            node: self.config.name.clone(),
            version,
            stale,
            pods,
            capabilities: self.capabilities.clone(),
            leftovers: leftovers.iter().map(Leftover::report).collect(),
        }
    }
}

/// The pods whose plan applied (a pod kept as it was, or one that failed, is not probed: its tree is not the
/// plan's), with their destinations and the plan's filter.
fn probe_view(applied: &Applied, pods: &[(String, Arc<InstalledPod>)], version: u64) -> ProbeView {
    let ok: HashSet<&str> = applied
        .last_results
        .iter()
        .filter(|r| matches!(r.outcome, PodOutcome::Applied))
        .map(|r| r.uid.as_str())
        .collect();
    ProbeView {
        version,
        pods: pods
            .iter()
            .filter(|(uid, _)| ok.contains(uid.as_str()))
            .map(|(uid, pod)| ProbePod {
                uid: uid.clone(),
                netns: pod.netns.clone(),
                destinations: pod.destinations.clone(),
            })
            .collect(),
        filter: applied.probe_filter.clone(),
        timelines: applied.timelines.shared(),
    }
}

/// The distinct links a pod's destinations served, sorted.
fn links_of(destinations: &[Destination]) -> Vec<LinkRef> {
    let links: std::collections::BTreeSet<&LinkRef> = destinations.iter().map(|(_, _, l)| &**l).collect();
    links.into_iter().cloned().collect()
}

fn resolve_error_kind(error: &ResolveError) -> PodErrorKind {
    match error {
        ResolveError::HostNetwork(_) => PodErrorKind::HostNetwork,
        ResolveError::NoIps => PodErrorKind::InvalidPlan,
        ResolveError::OwnedByAnotherPod { .. } | ResolveError::SharedByPods { .. } => PodErrorKind::NamespaceConflict,
        ResolveError::NotFound(_) | ResolveError::Ambiguous { .. } => PodErrorKind::PodNotFound,
    }
}
