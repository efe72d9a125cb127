//! Which agent serves each node: the agent pods and Node objects the controller watches, and each node's input
//! for its dispatcher (desired plan and ready agent).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use isthmus_agent_api::NodePlan;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::Controller;
use super::nodes::NodeInput;
use crate::index::ObjectKey;

/// An agent pod as far as dispatch cares.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AgentPod {
    node: Option<String>,
    ip: Option<IpAddr>,
    ready: bool,
    uid: String,
    /// Restarts of the pod's containers: a restarted agent is a new instance in the same pod.
    restarts: i64,
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
            restarts: status
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| i64::from(c.restart_count)).sum()),
        }
    }

    fn instance(&self) -> String {
        format!("{}#{}", self.uid, self.restarts)
    }
}

impl Controller {
    pub(super) fn upsert_agent(&mut self, key: ObjectKey, pod: &Pod) {
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

    pub(super) fn delete_agent(&mut self, key: &ObjectKey) {
        if let Some(node) = self.agents.remove(key).and_then(|a| a.node) {
            self.dirty_nodes.insert(node);
        }
    }

    pub(super) fn upsert_node(&mut self, node: String) {
        if self.nodes.insert(node.clone()) {
            // A new node gets its plan (empty or not) as soon as its agent is there.
            self.dirty_nodes.insert(node);
        }
    }

    pub(super) fn delete_node(&mut self, node: &str) {
        self.nodes.remove(node);
        self.dirty_nodes.insert(node.to_owned());
    }

    /// The node's plan and its ready agent (when a rolling update shows two ready agents, the one with the
    /// greatest UID, so that the choice is stable).
    pub(super) fn node_input(&self, node: &str) -> NodeInput {
        let plan = self
            .planner
            .node_plan(node)
            .cloned()
            .unwrap_or_else(|| NodePlan { node: node.to_owned(), ..NodePlan::default() });
        let agent = self
            .agents
            .values()
            .filter(|a| a.node.as_deref() == Some(node) && a.ready && a.ip.is_some())
            .max_by(|a, b| a.uid.cmp(&b.uid));
        NodeInput {
            plan: Arc::new(plan),
            agent: agent.and_then(|a| a.ip).map(|ip| SocketAddr::new(ip, self.ctx.config.agent_port)),
            agent_instance: agent.map(AgentPod::instance),
        }
    }
}
