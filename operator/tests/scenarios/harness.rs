//! One controller, as `controller::run` would start it, fed by the test instead of watches: its agent API is
//! [`FakeAgents`] and its Kubernetes client is [`FakeApiServer`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::controller::measure::MeasureConfig;
use isthmus_operator::controller::nodes::DispatchConfig;
use isthmus_operator::controller::version::Backoff;
use isthmus_operator::controller::watch::{AgentSelector, Update, WatchKind};
use isthmus_operator::controller::{self, Config, Context};
use isthmus_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::agent::FakeAgents;
use super::apiserver::FakeApiServer;

pub const AGENT_PORT: u16 = 9443;
pub const NS: &str = "team";

pub struct Scenario {
    pub api: FakeApiServer,
    pub agents: Arc<FakeAgents>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    updates: mpsc::Sender<Update>,
    leader: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// How the scenarios' dispatchers behave: quick retries, and a resync only where a test asks for one.
pub fn dispatch(resync: Duration) -> DispatchConfig {
    DispatchConfig { resync, backoff: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) } }
}

impl Scenario {
    /// A controller that leads (or not) and has not seen any watch list yet.
    pub fn start(leading: bool, dispatch: DispatchConfig) -> Scenario {
        let (updates, rx) = mpsc::channel(1024);
        let api = FakeApiServer::new(updates.clone());
        let client = api.client();
        let agents = Arc::new(FakeAgents::default());
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(AtomicBool::new(false));
        let (leader, leader_rx) = watch::channel(leading);
        let ctx = Context {
            recorder: Recorder::new(client.clone(), Reporter { controller: "isthmus-operator".into(), instance: None }),
            client,
            metrics: metrics.clone(),
            agent_api: agents.clone(),
            config: Config {
                agent_port: AGENT_PORT,
                agents: AgentSelector { namespace: None, labels: "app=isthmus-agent".into() },
                dispatch,
                cleanup_timeout: Duration::from_secs(60),
                field_manager: "isthmus-operator".into(),
                limits: Default::default(),
                // Every tick of the controller (1 s): a scenario waits for a poll, not for the default 10 s.
                measure: MeasureConfig { enabled: true, interval: Duration::from_secs(1) },
            },
            leader: leader_rx,
            ready: ready.clone(),
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(controller::run_with_updates(ctx, rx, shutdown_rx));
        Scenario { api, agents, metrics, ready, updates, leader, shutdown, task }
    }

    /// A leading controller whose watches have all listed an empty cluster.
    pub async fn synced(dispatch: DispatchConfig) -> Scenario {
        let s = Scenario::start(true, dispatch);
        for kind in WatchKind::ALL {
            s.list(kind, Vec::new()).await;
        }
        s.eventually("ready", || s.ready.load(Ordering::Relaxed).then_some(())).await;
        s
    }

    /// A restarted leader on node n1 (its Node and its ready agent at 10.255.0.1) holding `pods`: every watch but
    /// `last` lists what the cluster has (`links` among it); returns what `last` will list when the test lets it.
    pub async fn restarted_but(last: WatchKind, pods: Vec<Pod>, links: Vec<NetworkLink>) -> (Scenario, Vec<Update>) {
        let s = Scenario::start(true, dispatch(Duration::from_secs(3600)));
        s.agents.add(SocketAddr::new("10.255.0.1".parse().unwrap(), AGENT_PORT), "n1");
        for p in &pods {
            s.api.store_pod(p);
        }
        let node: PartialObjectMeta<Node> = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        let mut held = Vec::new();
        for kind in WatchKind::ALL {
            let objects = match kind {
                WatchKind::Pod => pods.iter().map(|p| Update::Pod(Event::InitApply(p.clone()))).collect(),
                WatchKind::Link => {
                    links.iter().map(|l| Update::Link(Box::new(Event::InitApply(l.clone().into())))).collect()
                }
                WatchKind::Node => vec![Update::Node(Event::InitApply(node.clone()))],
                WatchKind::Agent => {
                    vec![Update::Agent(Event::InitApply(agent_pod("n1", "10.255.0.1", "uid-agent-n1")))]
                }
                WatchKind::Namespace | WatchKind::Service | WatchKind::TraceMap => Vec::new(),
            };
            if kind == last {
                held = objects;
            } else {
                s.list(kind, objects).await;
            }
        }
        (s, held)
    }

    pub async fn send(&self, update: Update) {
        self.updates.send(update).await.expect("the controller runs");
    }

    /// A watch's (re)list: `Init`, one `InitApply` per object, `InitDone`.
    pub async fn list(&self, kind: WatchKind, objects: Vec<Update>) {
        self.send(list_marker(kind, false)).await;
        for o in objects {
            self.send(o).await;
        }
        self.send(list_marker(kind, true)).await;
    }

    pub fn set_leading(&self, leading: bool) {
        self.leader.send_replace(leading);
    }

    /// A Node object and its ready agent pod (with its own IP); returns the agent's address.
    pub async fn node_with_agent(&self, node: &str, ip: &str) -> SocketAddr {
        let addr = SocketAddr::new(ip.parse().unwrap(), AGENT_PORT);
        self.agents.add(addr, node);
        let meta: PartialObjectMeta<Node> = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
        self.send(Update::Node(Event::Apply(meta))).await;
        self.send(Update::Agent(Event::Apply(agent_pod(node, ip, &format!("uid-agent-{node}"))))).await;
        addr
    }

    pub async fn create(&self, link: &NetworkLink) {
        self.api.create(link);
    }

    pub async fn eventually<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        self.task.await.unwrap();
    }
}

/// The start (`Init`) or end (`InitDone`) of a list, for any kind.
fn list_marker(kind: WatchKind, done: bool) -> Update {
    fn marker<K>(done: bool) -> Event<K> {
        if done { Event::InitDone } else { Event::Init }
    }
    match kind {
        WatchKind::Link => Update::Link(Box::new(marker(done))),
        WatchKind::Pod => Update::Pod(marker(done)),
        WatchKind::Namespace => Update::Namespace(marker(done)),
        WatchKind::Service => Update::Service(marker(done)),
        WatchKind::Agent => Update::Agent(marker(done)),
        WatchKind::Node => Update::Node(marker(done)),
        WatchKind::TraceMap => Update::TraceMap(marker(done)),
    }
}

/// A running pod with its own network on `node`.
pub fn pod(name: &str, app: &str, node: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "none"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }))
    .unwrap()
}

/// [`pod`], declaring the readiness gate `isthmus.dev/links-applied`.
pub fn gated_pod(name: &str, app: &str, node: &str, ip: &str) -> Pod {
    let mut pod = pod(name, app, node, ip);
    let gate = json!([{"conditionType": isthmus_operator::gate::CONDITION_TYPE}]);
    pod.spec.as_mut().unwrap().readiness_gates = Some(serde_json::from_value(gate).unwrap());
    pod
}

pub fn agent_pod(node: &str, ip: &str, uid: &str) -> Pod {
    agent_pod_restarted(node, ip, uid, 0)
}

/// An agent pod whose container restarted `restarts` times.
pub fn agent_pod_restarted(node: &str, ip: &str, uid: &str, restarts: i32) -> Pod {
    let container =
        json!({"name": "agent", "ready": true, "restartCount": restarts, "image": "none", "imageID": "none"});
    serde_json::from_value(json!({
        "metadata": {"name": format!("agent-{node}"), "namespace": "isthmus-system", "uid": uid,
            "labels": {"app": "isthmus-agent"}},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "none"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [container]},
    }))
    .unwrap()
}
