//! An in-memory stand-in for the node agents, behind the operator's `AgentApi`: it records every plan it is
//! sent, answers like the real agent (a plan older than the one in force is stale; the reply lists every pod
//! of the plan), and can be told to fail a pod, to be unreachable, to hold a newer version, or to take its time
//! (a call waits while the agent is paused, like a slow node's agent installing its trees).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use futures::future::BoxFuture;
use isthmus_agent_api::measure::{LinkMeasurement, MeasuredState};
use isthmus_agent_api::{
    ApplyReply, Capabilities, LeftoverTree, NodePlan, PodError, PodErrorKind, PodOutcome, PodResult,
};
use isthmus_operator::controller::agent_api::{AgentApi, CallError};
use isthmus_operator::failure::CallErrorKind;

#[derive(Debug)]
struct Agent {
    node: String,
    capabilities: Capabilities,
    /// Every plan received, in order, stale ones included.
    received: Vec<NodePlan>,
    in_force: Option<u64>,
    last_results: Vec<PodResult>,
    unreachable: bool,
    /// Calls wait, unanswered, while set.
    paused: bool,
    /// Pod name → the error the agent answers for it.
    pod_errors: BTreeMap<String, PodError>,
    /// Trees it reports it could not remove.
    leftovers: Vec<LeftoverTree>,
    /// What `GET /v1/measured` answers.
    measured: MeasuredState,
}

/// The agents of every node, by address.
#[derive(Debug, Default)]
pub struct FakeAgents {
    agents: Mutex<BTreeMap<SocketAddr, Agent>>,
}

pub fn capabilities(netem: bool) -> Capabilities {
    Capabilities {
        kernel_release: "6.1.0-fake".into(),
        htb: true,
        tbf: true,
        netem,
        u32: true,
        duplicate_restricted: false,
        datapath: Default::default(),
    }
}

impl FakeAgents {
    /// An agent at `addr` on `node`; one already there keeps its state.
    pub fn add(&self, addr: SocketAddr, node: &str) {
        let agent = || Agent {
            node: node.to_owned(),
            capabilities: capabilities(true),
            received: Vec::new(),
            in_force: None,
            last_results: Vec::new(),
            unreachable: false,
            paused: false,
            pod_errors: BTreeMap::new(),
            leftovers: Vec::new(),
            measured: MeasuredState { node: node.to_owned(), enabled: true, ..MeasuredState::default() },
        };
        self.agents.lock().unwrap().entry(addr).or_insert_with(agent);
    }

    fn with<T>(&self, addr: SocketAddr, f: impl FnOnce(&mut Agent) -> T) -> T {
        f(self.agents.lock().unwrap().get_mut(&addr).expect("a known agent"))
    }

    pub fn set_unreachable(&self, addr: SocketAddr, unreachable: bool) {
        self.with(addr, |a| a.unreachable = unreachable);
    }

    /// While paused, a call waits before the agent looks at the plan; it is answered once resumed.
    pub fn set_paused(&self, addr: SocketAddr, paused: bool) {
        self.with(addr, |a| a.paused = paused);
    }

    fn paused(&self, addr: SocketAddr) -> bool {
        self.agents.lock().unwrap().get(&addr).is_some_and(|a| a.paused)
    }

    pub fn set_netem(&self, addr: SocketAddr, netem: bool) {
        self.with(addr, |a| a.capabilities = capabilities(netem));
    }

    pub fn fail_pod(&self, addr: SocketAddr, pod: &str, kind: PodErrorKind, message: &str) {
        self.with(addr, |a| a.pod_errors.insert(pod.to_owned(), PodError { kind, message: message.to_owned() }));
    }

    pub fn heal_pod(&self, addr: SocketAddr, pod: &str) {
        self.with(addr, |a| a.pod_errors.remove(pod));
    }

    /// The trees the agent reports, from its next answer on, that it could not remove.
    pub fn set_leftovers(&self, addr: SocketAddr, leftovers: Vec<LeftoverTree>) {
        self.with(addr, |a| a.leftovers = leftovers);
    }

    /// What the agent answers, from now on, when asked what it measured.
    pub fn set_measured(&self, addr: SocketAddr, links: Vec<LinkMeasurement>) {
        self.with(addr, |a| a.measured.links = links);
    }

    /// As if another operator had sent a plan with this version.
    pub fn hold_version(&self, addr: SocketAddr, version: u64) {
        self.with(addr, |a| a.in_force = Some(version));
    }

    pub fn received(&self, addr: SocketAddr) -> Vec<NodePlan> {
        self.with(addr, |a| a.received.clone())
    }

    /// The plan in force: the last one received that was not stale.
    pub fn in_force(&self, addr: SocketAddr) -> Option<NodePlan> {
        self.with(addr, |a| a.received.iter().rev().find(|p| Some(p.version) == a.in_force).cloned())
    }

    fn answer(&self, addr: SocketAddr, plan: &NodePlan) -> Result<ApplyReply, CallError> {
        let mut agents = self.agents.lock().unwrap();
        let refused = || CallError {
            kind: CallErrorKind::Connect,
            message: format!("connecting to agent {addr}: Connection refused (os error 111)"),
        };
        let Some(agent) = agents.get_mut(&addr) else { return Err(refused()) };
        if agent.unreachable {
            return Err(refused());
        }
        agent.received.push(plan.clone());
        if let Some(current) = agent.in_force
            && plan.version < current
        {
            return Ok(reply(agent, current, true));
        }
        agent.in_force = Some(plan.version);
        agent.last_results = plan
            .pods
            .iter()
            .map(|p| {
                let outcome = match agent.pod_errors.get(&p.name) {
                    Some(e) => PodOutcome::Failed(e.clone()),
                    None => PodOutcome::Applied,
                };
                PodResult { mutations: 1, ..PodResult::of(p, outcome) }
            })
            .collect();
        Ok(reply(agent, plan.version, false))
    }
}

fn reply(agent: &Agent, version: u64, stale: bool) -> ApplyReply {
    ApplyReply {
        node: agent.node.clone(),
        version,
        stale,
        pods: agent.last_results.clone(),
        capabilities: agent.capabilities.clone(),
        leftovers: agent.leftovers.clone(),
    }
}

impl AgentApi for FakeAgents {
    fn apply<'a>(&'a self, agent: SocketAddr, plan: &'a NodePlan) -> BoxFuture<'a, Result<ApplyReply, CallError>> {
        Box::pin(async move {
            // A real call always waits for the network; so must this one, or a dispatcher that calls in a loop
            // would starve everything else on the test's runtime.
            tokio::task::yield_now().await;
            while self.paused(agent) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            self.answer(agent, plan)
        })
    }

    fn measured<'a>(&'a self, agent: SocketAddr, node: &'a str) -> BoxFuture<'a, Result<MeasuredState, CallError>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            let agents = self.agents.lock().unwrap();
            match agents.get(&agent) {
                Some(a) if !a.unreachable && a.node == node => Ok(a.measured.clone()),
                _ => Err(CallError {
                    kind: CallErrorKind::Connect,
                    message: format!("connecting to agent {agent}: Connection refused (os error 111)"),
                }),
            }
        })
    }
}
