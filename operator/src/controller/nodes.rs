//! Per-node plan dispatch: one task per node holds the node's latest desired plan and the address of its
//! agent, and sends the full plan whenever either changes, after a failure (with backoff), and periodically
//! (resync). Only while this replica leads; losing the lease stops a call in flight at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use isthmus_agent_api::client::{AgentClient, ClientError};
use isthmus_agent_api::{ApplyReply, Capabilities, NodePlan};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::version::{Backoff, PlanVersions};
use crate::failure::{CallErrorKind, FailureReason};
use crate::metrics::Metrics;

/// What a dispatcher should make true on its node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeInput {
    /// The desired plan (its version is assigned at send time); empty when nothing on the node is impaired.
    pub plan: Arc<NodePlan>,
    /// The ready agent's address, if the node has one.
    pub agent: Option<SocketAddr>,
    /// The agent pod's UID: a new one (restarted agent) gets the plan at once even if nothing else changed.
    pub agent_uid: Option<String>,
}

/// A plan the agent acknowledged, with its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedPlan {
    pub plan: Arc<NodePlan>,
    pub reply: ApplyReply,
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
    pub client: Arc<AgentClient>,
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

fn record(shared: &Shared, node: &str, update: impl FnOnce(&mut NodeReport)) {
    let mut reports = shared.reports.lock().unwrap_or_else(|p| p.into_inner());
    let report = reports.entry(node.to_owned()).or_default();
    let before = report.clone();
    update(report);
    if *report != before {
        let _ = shared.reported.send(node.to_owned());
    }
}

fn error_kind(e: &ClientError) -> CallErrorKind {
    match e {
        ClientError::Tls(_) => CallErrorKind::Tls,
        ClientError::ServerName(_) => CallErrorKind::ServerName,
        ClientError::Connect { .. } => CallErrorKind::Connect,
        ClientError::Timeout { .. } => CallErrorKind::Timeout,
        ClientError::Http { .. } => CallErrorKind::Http,
        ClientError::Status { .. } if e.is_forbidden() => CallErrorKind::Forbidden,
        ClientError::Status { .. } => CallErrorKind::Status,
        ClientError::Decode { .. } => CallErrorKind::Decode,
    }
}

/// One node's loop. Ends when the controller drops the node's sender.
async fn dispatch(node: String, mut input: watch::Receiver<NodeInput>, shared: Shared) {
    let mut leader = shared.leader.clone();
    let mut versions = PlanVersions::default();
    // What the agent confirmed: (plan, agent address, agent UID) as sent.
    let mut confirmed: Option<NodeInput> = None;
    let mut failures: u32 = 0;
    let mut retry_at = Instant::now();
    let mut resync_at = Instant::now() + shared.config.resync;
    let mut agent_seen: (Option<SocketAddr>, Option<String>) = (None, None);
    loop {
        let current = input.borrow_and_update().clone();
        let leading = *leader.borrow_and_update();
        let agent_now = (current.agent, current.agent_uid.clone());
        if agent_now != agent_seen {
            // A new or restarted agent gets the plan at once, whatever the backoff of its predecessor.
            agent_seen = agent_now;
            failures = 0;
            retry_at = Instant::now();
        }
        if !leading {
            confirmed = None; // a new term resends everything
        }
        let due = leading && confirmed.as_ref() != Some(&current) && Instant::now() >= retry_at;
        if due {
            match current.agent {
                None => record(&shared, &node, |r| {
                    r.failure = Some(AgentFailure {
                        reason: FailureReason::AgentUnavailable,
                        message: format!("no ready isthmus agent on node {node}"),
                    })
                }),
                Some(addr) => {
                    let mut plan = (*current.plan).clone();
                    plan.node = node.clone();
                    plan.version = versions.next_now();
                    let started = std::time::Instant::now();
                    let result = tokio::select! {
                        r = shared.client.apply(addr, &plan) => Some(r),
                        _ = leader.changed() => None,
                    };
                    let Some(result) = result else {
                        tracing::info!(%node, "leadership lost during a call; abandoned it");
                        continue;
                    };
                    shared.metrics.agent_call(&node, started.elapsed(), result.as_ref().err().map(error_kind));
                    match result {
                        Ok(reply) if reply.stale => {
                            tracing::warn!(%node, sent = plan.version, in_force = reply.version, "agent holds a newer plan; resending above it");
                            versions.observe(reply.version);
                        }
                        Ok(reply) => {
                            let failed = reply
                                .pods
                                .iter()
                                .filter(|p| p.outcome != isthmus_agent_api::PodOutcome::Applied)
                                .count();
                            tracing::info!(%node, version = plan.version, pods = plan.pods.len(), failed, "plan applied");
                            failures = 0;
                            retry_at = Instant::now();
                            resync_at = Instant::now() + shared.config.resync;
                            let applied = AppliedPlan { plan: Arc::new(plan), reply: reply.clone() };
                            record(&shared, &node, |r| {
                                r.capabilities = Some(reply.capabilities.clone());
                                r.failure = None;
                                r.applied = Some(applied);
                            });
                            confirmed = Some(current);
                        }
                        Err(e) => {
                            failures = failures.saturating_add(1);
                            let wait = shared.config.backoff.delay(failures);
                            retry_at = Instant::now() + wait;
                            tracing::warn!(%node, agent = %addr, error = %e, retry_in = ?wait, "plan not delivered");
                            let reason = error_kind(&e).reason();
                            record(&shared, &node, |r| {
                                r.failure = Some(AgentFailure { reason, message: format!("agent on node {node}: {e}") })
                            });
                        }
                    }
                    continue;
                }
            }
        }
        let pending = leading && confirmed.as_ref() != Some(&current) && current.agent.is_some();
        let wake = if pending { retry_at } else { resync_at };
        tokio::select! {
            changed = input.changed() => if changed.is_err() { return },
            gone = leader.changed() => if gone.is_err() { return },
            _ = tokio::time::sleep_until(wake) => {
                if !pending {
                    // Periodic resync: the agent gets the full plan again, which repairs anything changed behind
                    // its back and re-reads its capabilities.
                    confirmed = None;
                    resync_at = Instant::now() + shared.config.resync;
                }
            }
        }
    }
}
