//! What the tests against a real API server share: the client from `ISTHMUS_TEST_KUBECONFIG`, the CRD, fresh
//! namespaces, controllers started as `controller::run` would be, NetworkLinks and pods made "running" without a
//! kubelet, and a real `isthmus-agent` process on 127.0.0.1 with its Node and pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use isthmus_agent_api::client::{AgentClient, ClientConfig, TlsFiles};
use isthmus_operator::api::{ImpairmentSpec, NetworkLink, NetworkLinkSpec};
use isthmus_operator::controller::agent_api::AgentApi;
use isthmus_operator::controller::nodes::DispatchConfig;
use isthmus_operator::controller::version::Backoff;
use isthmus_operator::controller::watch::AgentSelector;
use isthmus_operator::controller::{self, Config, Context};
use isthmus_operator::gate::CONDITION_TYPE;
use isthmus_operator::metrics::Metrics;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, CustomResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The controllers of different tests would act on each other's links: one test at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn client() -> Option<Client> {
    let path = std::env::var("ISTHMUS_TEST_KUBECONFIG").ok()?;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("usable kubeconfig");
    Some(Client::try_from(config).expect("client"))
}

pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = NetworkLink::crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(&name, &PatchParams::apply("isthmus-operator-it").force(), &Patch::Apply(&crd)).await.unwrap();
    eventually("CRD established", || async {
        let c = crds.get(&name).await.ok()?;
        c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

pub async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    eventually("old namespace gone", || async { api.get_opt(name).await.ok()?.is_none().then_some(()) }).await;
    api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
}

pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator's client identity for the agents (never used here, but loaded as in production).
pub fn agent_client(dir: &std::path::Path) -> Arc<AgentClient> {
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["isthmus-operator".to_owned()]).unwrap();
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    Arc::new(AgentClient::new(ClientConfig::new(TlsFiles::in_dir(dir)).unwrap()))
}

pub struct Running {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// Keeps a fixed leadership answer alive for the controller's lifetime.
    _leading: Option<watch::Sender<bool>>,
}

impl Running {
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        self.task.await.unwrap();
    }

    /// Ends the controller where it stands, as a crash or a killed pod would: no shutdown, calls in flight dropped.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

pub fn start(
    client: &Client,
    ns: &str,
    identity: &str,
    leader: watch::Receiver<bool>,
    cleanup_timeout: Duration,
) -> Running {
    let dir = std::env::temp_dir().join(format!("isth-op-it-{}-{identity}", std::process::id()));
    let agents = agent_client(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    start_full(client, ns, identity, leader, cleanup_timeout, agents, 9443)
}

/// A controller whose leadership the test sets, calling the agents through `agents` on `port`.
pub fn start_controller(
    client: &Client,
    ns: &str,
    identity: &str,
    leader: watch::Receiver<bool>,
    agents: Arc<dyn AgentApi>,
    port: u16,
) -> Running {
    start_full(client, ns, identity, leader, Duration::from_secs(120), agents, port)
}

pub fn start_with_client(client: &Client, ns: &str, agents: Arc<AgentClient>, port: u16) -> Running {
    let (tx, rx) = watch::channel(true);
    let mut running = start_controller(client, ns, "with-agent", rx, agents, port);
    running._leading = Some(tx);
    running
}

fn start_full(
    client: &Client,
    ns: &str,
    identity: &str,
    leader: watch::Receiver<bool>,
    cleanup_timeout: Duration,
    agent_client: Arc<dyn AgentApi>,
    agent_port: u16,
) -> Running {
    let ctx = Context {
        client: client.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter { controller: "isthmus-operator".into(), instance: Some(identity.into()) },
        ),
        metrics: Arc::new(Metrics::new()),
        agent_api: agent_client,
        config: Config {
            agent_port,
            // No agent runs on a control plane without nodes; the selector matches nothing of other tests.
            agents: AgentSelector { namespace: Some(ns.into()), labels: format!("isthmus-it-agent={ns}") },
            dispatch: DispatchConfig { resync: Duration::from_secs(60), backoff: Backoff::default() },
            cleanup_timeout,
            field_manager: "isthmus-operator".into(),
            limits: Default::default(),
            measure: Default::default(),
        },
        leader,
        ready: Arc::new(AtomicBool::new(false)),
    };
    let (shutdown, rx) = watch::channel(false);
    let task = tokio::spawn(controller::run(ctx, rx));
    Running { shutdown, task, _leading: None }
}

pub fn link(name: &str, latency: &str) -> NetworkLink {
    let sel = |app: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([("app".into(), app.into())])),
        match_expressions: None,
    };
    NetworkLink::new(
        name,
        NetworkLinkSpec::between(
            sel("client"),
            sel("server"),
            ImpairmentSpec { latency: Some(latency.into()), ..Default::default() },
        ),
    )
}

/// A pod that the API server holds as running on `node` (no kubelet: the test writes the status).
pub async fn running_pod(client: &Client, ns: &str, name: &str, app: &str, node: &str, ip: &str) {
    create_pod(client, ns, name, app, node, Some(ip), "Running", false).await
}

/// [`running_pod`] declaring the readiness gate, with the conditions a kubelet reports while a gate is not True:
/// the containers ready, the pod not.
pub async fn gated_pod(client: &Client, ns: &str, name: &str, app: &str, node: &str, ip: &str) {
    create_pod(client, ns, name, app, node, Some(ip), "Running", true).await
}

/// [`gated_pod`] still `Pending` (its init containers run), with its sandbox's IP or none yet.
pub async fn pending_gated_pod(client: &Client, ns: &str, name: &str, app: &str, node: &str, ip: Option<&str>) {
    create_pod(client, ns, name, app, node, ip, "Pending", true).await
}

#[allow(clippy::too_many_arguments)] // each is a field of the pod, named at the three call sites above
async fn create_pod(
    client: &Client,
    ns: &str,
    name: &str,
    app: &str,
    node: &str,
    ip: Option<&str>,
    phase: &str,
    gated: bool,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod = json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "localhost/none:1"}]},
    });
    let mut status = json!({"status": {"phase": phase}});
    if let Some(ip) = ip {
        status["status"]["podIP"] = json!(ip);
        status["status"]["podIPs"] = json!([{"ip": ip}]);
    }
    if gated {
        pod["spec"]["readinessGates"] = json!([{"conditionType": CONDITION_TYPE}]);
        let containers_ready = if phase == "Running" { "True" } else { "False" };
        status["status"]["conditions"] = json!([
            {"type": "ContainersReady", "status": containers_ready},
            {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
        ]);
    }
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

pub fn condition(link: &NetworkLink, type_: &str) -> Option<(String, String)> {
    let c = link.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

pub async fn event_reasons(client: &Client, ns: &str, link: &str) -> Vec<String> {
    events_of(client, ns, link).await.into_iter().filter_map(|e| e.reason).collect()
}

/// The Events regarding the NetworkLink `link`.
pub async fn events_of(client: &Client, ns: &str, link: &str) -> Vec<K8sEvent> {
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(link)).collect()
}

/// A real `isthmus-agent` process on 127.0.0.1 that sees no network namespace at all (empty `--proc` and
/// `--netns-dirs`), so it answers every pod with `PodNotFound` and can touch nothing on this machine.
pub struct RealAgent {
    child: std::process::Child,
    /// Its TLS files (`agent-tls`, `operator-tls`) and logs.
    pub dir: std::path::PathBuf,
    pub port: u16,
    /// The node it serves (its certificate names it).
    pub node: String,
    pub client: Arc<AgentClient>,
}

impl Drop for RealAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const OPERATOR_IDENTITY: &str = "isthmus-operator.isthmus-system.serviceaccount.isthmus";

impl RealAgent {
    /// An agent that finds pods in the network namespaces pinned in `netns_dir` (none when `None`).
    pub async fn start(binary: &str, node: &str, netns_dir: Option<&std::path::Path>) -> RealAgent {
        let dir = std::env::temp_dir().join(format!("isth-op-it-agent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["agent-tls", "operator-tls", "ca", "empty-proc", "empty-netns"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issue = |name: &str, server: bool, to: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
            p.extended_key_usages = vec![if server {
                rcgen::ExtendedKeyUsagePurpose::ServerAuth
            } else {
                rcgen::ExtendedKeyUsagePurpose::ClientAuth
            }];
            let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
            std::fs::write(dir.join(to).join("ca.crt"), ca_cert.pem()).unwrap();
            std::fs::write(dir.join(to).join("tls.crt"), cert.pem()).unwrap();
            std::fs::write(dir.join(to).join("tls.key"), key.serialize_pem()).unwrap();
        };
        // The CA itself, for a test that runs the operator binary: it loads its CA from a Secret made of these.
        std::fs::write(dir.join("ca").join("ca.crt"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("ca").join("ca.key"), ca_key.serialize_pem()).unwrap();
        issue(&isthmus_agent_api::identity::node_server_name(node).unwrap(), true, "agent-tls");
        issue(OPERATOR_IDENTITY, false, "operator-tls");
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Two ports released in turn can be the same one; the agent then fails to bind and never answers.
        let port = free();
        let health = std::iter::repeat_with(free).find(|h| *h != port).unwrap();
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let child = std::process::Command::new(binary)
            .args(["serve", "--node-name", node, "--log-format", "text", "--tls-reload-seconds", "1"])
            // These tests read the tc trees the agent installs (this kernel has no netem: auto would emulate).
            .args(["--datapath", "tc"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--health-listen")
            .arg(format!("127.0.0.1:{health}"))
            .arg("--tls-dir")
            .arg(dir.join("agent-tls"))
            .arg("--proc")
            .arg(dir.join("empty-proc"))
            .arg("--netns-dirs")
            .arg(netns_dir.map_or_else(|| dir.join("empty-netns"), std::path::Path::to_path_buf))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("isthmus-agent starts");
        let client = Arc::new(AgentClient::new(ClientConfig::new(TlsFiles::in_dir(dir.join("operator-tls"))).unwrap()));
        let agent = RealAgent { child, dir, port, node: node.to_owned(), client };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        eventually("agent answers", || async { agent.client.capabilities(addr, &agent.node).await.ok() }).await;
        agent
    }
}

/// A test with a real agent: the client, a fresh namespace, the agent on 127.0.0.1 with its Node and its pod
/// (as the DaemonSet would make it: on the node, ready, its IP where the agent listens), and the test's turn.
pub struct WithAgent {
    pub client: Client,
    pub ns: String,
    pub node: String,
    pub agent: RealAgent,
    _made: Made,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl WithAgent {
    /// Needs the environment `make operator-it` sets: a real API server and a built agent.
    pub async fn start(name: &str) -> WithAgent {
        Self::start_seeing(name, None).await
    }

    /// [`WithAgent::start`] with an agent that sees the namespaces pinned in `netns_dir`.
    pub async fn start_seeing(name: &str, netns_dir: Option<&std::path::Path>) -> WithAgent {
        let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
        let binary = std::env::var("ISTHMUS_TEST_AGENT_BIN")
            .expect("ISTHMUS_TEST_AGENT_BIN: the agent (make operator-it sets it)");
        let serial = SERIAL.lock().await;
        install_crd(&client).await;
        let ns = format!("op-it-{name}-{}", std::process::id());
        namespace(&client, &ns).await;
        let node = format!("op-it-{name}-node-{}", std::process::id());
        let agent = RealAgent::start(&binary, &node, netns_dir).await;
        let nodes: Api<Node> = Api::all(client.clone());
        let _ = nodes.delete(&node, &DeleteParams::default()).await;
        let object = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
        nodes.create(&PostParams::default(), &object).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let agent_pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent", "labels": {"isthmus-it-agent": ns}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "localhost/none:1"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &agent_pod).await.unwrap();
        let ready = json!({"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status("agent", &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
        let made = Made::new(&ns, &node);
        WithAgent { client, ns, node, agent, _made: made, _serial: serial }
    }

    /// A leading controller whose agent client carries the identity this agent trusts.
    pub fn controller(&self) -> Running {
        start_with_client(&self.client, &self.ns, self.agent.client.clone(), self.agent.port)
    }

    /// Removes the test's pods, namespace and Node; the agent stops.
    pub async fn finish(self) {
        drop(self);
    }
}

/// A test's namespace (with its pods) and Node, removed when this is dropped: also when the test fails, for the
/// next test's link that selects every namespace would count its pods.
pub struct Made {
    ns: String,
    node: String,
}

impl Made {
    pub fn new(ns: &str, node: &str) -> Self {
        Made { ns: ns.to_owned(), node: node.to_owned() }
    }
}

/// Its own runtime on its own thread, as the test's may be unwinding (and its client with it).
impl Drop for Made {
    fn drop(&mut self) {
        let (ns, node) = (self.ns.clone(), self.node.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                if let Some(client) = client().await {
                    remove(&client, &ns, &node).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Pods without a kubelet go at once only with no grace period; then their namespace and Node.
async fn remove(client: &Client, ns: &str, node: &str) {
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    let _ = Api::<Pod>::namespaced(client.clone(), ns).delete_collection(&now, &ListParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    let _ = Api::<Node>::all(client.clone()).delete(node, &DeleteParams::default()).await;
}
