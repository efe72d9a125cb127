//! Per-node plan dispatch: one task per node holds the node's latest desired plan and the address of its
//! agent, and sends the full plan whenever either changes, after a failure (with backoff), and periodically
//! (resync). Only while this replica leads; losing the lease stops a call in flight at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use isthmus_agent_api::{ApplyReply, Capabilities, NodePlan, PodOutcome, PodPlan, PodResult};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::agent_api::AgentApi;
use super::version::{Backoff, PlanVersions};
use crate::failure::FailureReason;
use crate::metrics::Metrics;

/// What a dispatcher should make true on its node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeInput {
    /// The desired plan (its version is assigned at send time); empty when nothing on the node is impaired.
    pub plan: Arc<NodePlan>,
    /// The ready agent's address, if the node has one.
    pub agent: Option<SocketAddr>,
    /// The agent's instance (its pod's UID and container restarts): a new one — a new pod, or the agent's
    /// container restarted in its pod — gets the plan at once even if nothing else changed. An agent with the
    /// userspace datapath starts with nothing installed (its captures died with the last one).
    pub agent_instance: Option<String>,
}

/// A plan the agent acknowledged, with its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedPlan {
    pub plan: Arc<NodePlan>,
    pub reply: ApplyReply,
    /// Positions in `plan.pods` and `reply.pods`, sorted by pod: each pod's confirmation is then a binary search.
    /// Scanning both lists cost the node's pods for each of its pods, at every status and gate decision.
    plan_order: Vec<usize>,
    reply_order: Vec<usize>,
}

impl AppliedPlan {
    pub fn new(plan: Arc<NodePlan>, reply: ApplyReply) -> Self {
        let mut plan_order: Vec<usize> = (0..plan.pods.len()).collect();
        plan_order.sort_by(|&a, &b| pod_key(&plan.pods[a]).cmp(&pod_key(&plan.pods[b])));
        // Stable: among equal pods, the reply's first one is found first, as a scan would find it.
        let mut reply_order: Vec<usize> = (0..reply.pods.len()).collect();
        reply_order.sort_by(|&a, &b| result_key(&reply.pods[a]).cmp(&result_key(&reply.pods[b])));
        AppliedPlan { plan, reply, plan_order, reply_order }
    }

    /// The agent's result for the pod, if the plan it acknowledged holds exactly the pod's entry.
    pub fn confirmed(&self, pod: &PodPlan) -> Option<&PodResult> {
        let key = pod_key(pod);
        let from = self.plan_order.partition_point(|&i| pod_key(&self.plan.pods[i]) < key);
        let same = self.plan_order[from..].iter().map(|&i| &self.plan.pods[i]).take_while(|p| pod_key(p) == key);
        if !same.into_iter().any(|p| p == pod) {
            return None;
        }
        let key = (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str());
        let at = self.reply_order.partition_point(|&i| result_key(&self.reply.pods[i]) < key);
        let result = &self.reply.pods[*self.reply_order.get(at)?];
        (result_key(result) == key).then_some(result)
    }
}

fn pod_key(p: &PodPlan) -> (&str, &str) {
    (&p.namespace, &p.name)
}

fn result_key(r: &PodResult) -> (&str, &str, &str) {
    (&r.namespace, &r.name, &r.uid)
}

/// Why the node's latest plan is not in force.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentFailure {
    /// `AgentUnreachable`, `AgentUnavailable`, `AgentRefused`.
    pub reason: FailureReason,
    pub message: String,
}

/// What the operator knows about a node's agent, for status and finalizers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeReport {
    /// The latest plan the agent acknowledged in this process.
    pub applied: Option<AppliedPlan>,
    /// Set while the desired plan could not be delivered.
    pub failure: Option<AgentFailure>,
    pub capabilities: Option<Capabilities>,
}

pub type Reports = Arc<Mutex<BTreeMap<String, NodeReport>>>;

/// How dispatchers behave; shared by all.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub resync: Duration,
    pub backoff: Backoff,
}

/// What every dispatcher shares.
#[derive(Clone)]
pub struct Shared {
    pub agent_api: Arc<dyn AgentApi>,
    pub config: DispatchConfig,
    pub reports: Reports,
    /// Nodes whose report changed, for the controller to refresh statuses and finalizers.
    pub reported: mpsc::UnboundedSender<String>,
    pub leader: watch::Receiver<bool>,
    pub metrics: Arc<Metrics>,
}

/// The dispatchers, by node. Dropping a node's sender ends its task.
pub struct Dispatchers {
    shared: Shared,
    nodes: BTreeMap<String, watch::Sender<NodeInput>>,
}

impl Dispatchers {
    pub fn new(shared: Shared) -> Self {
        Self { shared, nodes: BTreeMap::new() }
    }

    /// Sets a node's input, starting its dispatcher if needed.
    pub fn set(&mut self, node: &str, input: NodeInput) {
        match self.nodes.get(node) {
            Some(tx) => {
                tx.send_if_modified(|cur| {
                    let changed = *cur != input;
                    if changed {
                        *cur = input.clone();
                    }
                    changed
                });
            }
            None => {
                let (tx, rx) = watch::channel(input);
                tokio::spawn(dispatch(node.to_owned(), rx, self.shared.clone()));
                self.nodes.insert(node.to_owned(), tx);
            }
        }
    }

    pub fn remove(&mut self, node: &str) {
        self.nodes.remove(node);
    }
}

/// One node's loop: what it sent, what the agent confirmed, and when to call next.
struct NodeLoop {
    node: String,
    input: watch::Receiver<NodeInput>,
    leader: watch::Receiver<bool>,
    shared: Shared,
    versions: PlanVersions,
    /// What the agent confirmed: (plan, agent address, agent UID) as sent.
    confirmed: Option<NodeInput>,
    failures: u32,
    retry_at: Instant,
    resync_at: Instant,
    agent_seen: (Option<SocketAddr>, Option<String>),
}

/// One node's loop. Ends when the controller drops the node's sender.
async fn dispatch(node: String, input: watch::Receiver<NodeInput>, shared: Shared) {
    let state = NodeLoop {
        node,
        input,
        leader: shared.leader.clone(),
        versions: PlanVersions::default(),
        confirmed: None,
        failures: 0,
        retry_at: Instant::now(),
        resync_at: Instant::now() + shared.config.resync,
        agent_seen: (None, None),
        shared,
    };
    state.run().await
}

impl NodeLoop {
    async fn run(mut self) {
        loop {
            let current = self.input.borrow_and_update().clone();
            let leading = *self.leader.borrow_and_update();
            let agent_now = (current.agent, current.agent_instance.clone());
            if agent_now != self.agent_seen {
                // A new or restarted agent gets the plan at once, whatever the backoff of its predecessor.
                self.agent_seen = agent_now;
                self.failures = 0;
                self.retry_at = Instant::now();
            }
            if !leading {
                self.confirmed = None; // a new term resends everything
            }
            if leading && self.confirmed.as_ref() != Some(&current) && Instant::now() >= self.retry_at {
                match current.agent {
                    None => {
                        let failure = AgentFailure {
                            reason: FailureReason::AgentUnavailable,
                            message: format!("no ready isthmus agent on node {}", self.node),
                        };
                        self.record(|r| r.failure = Some(failure));
                    }
                    Some(addr) => {
                        self.deliver(addr, current).await;
                        continue;
                    }
                }
            }
            if !self.wait(leading, &current).await {
                return;
            }
        }
    }

    /// Sends the current plan under a new version and records what came of it.
    async fn deliver(&mut self, addr: SocketAddr, current: NodeInput) {
        let node = self.node.clone();
        let mut plan = (*current.plan).clone();
        plan.node = node.clone();
        plan.version = self.versions.next_now();
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = self.shared.agent_api.apply(addr, &plan) => Some(r),
            _ = self.leader.changed() => None,
        };
        let Some(result) = result else {
            tracing::info!(%node, "leadership lost during a call; abandoned it");
            return;
        };
        self.shared.metrics.agent_call(&node, started.elapsed(), result.as_ref().err().map(|e| e.kind));
        match result {
            Ok(reply) if reply.stale => {
                tracing::warn!(%node, sent = plan.version, in_force = reply.version, "agent holds a newer plan; resending above it");
                self.versions.observe(reply.version);
            }
            Ok(reply) => {
                let failed = reply.pods.iter().filter(|p| p.outcome != PodOutcome::Applied).count();
                // Destinations whose queueLimit the node's queue budgets cut (the agent logs which).
                let queue_limits_capped: usize = reply.pods.iter().map(|p| p.queue_caps.len()).sum();
                tracing::info!(%node, version = plan.version, pods = plan.pods.len(), failed, queue_limits_capped, "plan applied");
                self.failures = 0;
                self.retry_at = Instant::now();
                self.resync_at = Instant::now() + self.shared.config.resync;
                let capabilities = reply.capabilities.clone();
                let applied = AppliedPlan::new(Arc::new(plan), reply);
                self.record(|r| {
                    r.capabilities = Some(capabilities);
                    r.failure = None;
                    r.applied = Some(applied);
                });
                self.confirmed = Some(current);
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                let wait = self.shared.config.backoff.delay(self.failures);
                self.retry_at = Instant::now() + wait;
                tracing::warn!(%node, agent = %addr, error = %e, retry_in = ?wait, "plan not delivered");
                let failure = AgentFailure { reason: e.kind.reason(), message: format!("agent on node {node}: {e}") };
                self.record(|r| r.failure = Some(failure));
            }
        }
    }

    /// Sleeps until the input or the leadership changes, a retry or the periodic resync is due; false once the
    /// controller has dropped the node.
    async fn wait(&mut self, leading: bool, current: &NodeInput) -> bool {
        let pending = leading && self.confirmed.as_ref() != Some(current) && current.agent.is_some();
        let wake = if pending { self.retry_at } else { self.resync_at };
        tokio::select! {
            changed = self.input.changed() => changed.is_ok(),
            gone = self.leader.changed() => gone.is_ok(),
            _ = tokio::time::sleep_until(wake) => {
                if !pending {
                    // Periodic resync: the agent gets the full plan again, which repairs anything changed behind
                    // its back and re-reads its capabilities.
                    self.confirmed = None;
                    self.resync_at = Instant::now() + self.shared.config.resync;
                }
                true
            }
        }
    }

    fn record(&self, update: impl FnOnce(&mut NodeReport)) {
        let mut reports = self.shared.reports.lock().unwrap_or_else(|p| p.into_inner());
        let report = reports.entry(self.node.clone()).or_default();
        let before = report.clone();
        update(report);
        if *report != before {
            let _ = self.shared.reported.send(self.node.clone());
        }
    }
}
