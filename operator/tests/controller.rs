//! The controller against a real kube-apiserver (no mock): the cleanup finalizer is added and removed, statuses
//! carry `observedGeneration` and the conditions, and leadership hands over between two controllers.
//!
//! Runs only when `ISTHMUS_TEST_KUBECONFIG` names a control plane's kubeconfig (`make operator-it` starts one);
//! without it each test says so and passes. The control plane has no nodes and no kubelet: agents are either
//! absent or one real `isthmus-agent` process on 127.0.0.1. Pods are made "running" by patching their status.
//! The same controller paths in memory, with an in-memory agent and API server: tests/scenarios/.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use isthmus_agent_api::client::{AgentClient, ClientConfig, TlsFiles};
use isthmus_operator::api::{FromSpec, ImpairmentSpec, NetworkLink, NetworkLinkSpec, ServiceInclusion, ToSpec};
use isthmus_operator::controller::finalizer::FINALIZER;
use isthmus_operator::controller::nodes::DispatchConfig;
use isthmus_operator::controller::version::Backoff;
use isthmus_operator::controller::watch::AgentSelector;
use isthmus_operator::controller::{self, Config, Context};
use isthmus_operator::leader::{Election, LeaderConfig};
use isthmus_operator::metrics::Metrics;
use k8s_openapi::api::coordination::v1::Lease;
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
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn client() -> Option<Client> {
    let path = std::env::var("ISTHMUS_TEST_KUBECONFIG").ok()?;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("usable kubeconfig");
    Some(Client::try_from(config).expect("client"))
}

async fn install_crd(client: &Client) {
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

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    eventually("old namespace gone", || async { api.get_opt(name).await.ok()?.is_none().then_some(()) }).await;
    api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
}

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
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
fn agent_client(dir: &std::path::Path) -> Arc<AgentClient> {
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
    Arc::new(AgentClient::new(ClientConfig::new(TlsFiles::in_dir(dir))).unwrap())
}

struct Running {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// Keeps a fixed leadership answer alive for the controller's lifetime.
    _leading: Option<watch::Sender<bool>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.shutdown.send(true);
        self.task.await.unwrap();
    }
}

fn start(
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

fn start_with_client(client: &Client, ns: &str, agents: Arc<AgentClient>, port: u16) -> Running {
    let (tx, rx) = watch::channel(true);
    let mut running = start_full(client, ns, "with-agent", rx, Duration::from_secs(120), agents, port);
    running._leading = Some(tx);
    running
}

fn start_full(
    client: &Client,
    ns: &str,
    identity: &str,
    leader: watch::Receiver<bool>,
    cleanup_timeout: Duration,
    agent_client: Arc<AgentClient>,
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
        },
        leader,
        ready: Arc::new(AtomicBool::new(false)),
    };
    let (shutdown, rx) = watch::channel(false);
    let task = tokio::spawn(controller::run(ctx, rx));
    Running { shutdown, task, _leading: None }
}

fn link(name: &str, latency: &str) -> NetworkLink {
    let sel = |app: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([("app".into(), app.into())])),
        match_expressions: None,
    };
    NetworkLink::new(
        name,
        NetworkLinkSpec {
            from: FromSpec { pod_selector: sel("client") },
            to: ToSpec {
                pod_selector: Some(sel("server")),
                namespace_selector: None,
                cidrs: vec![],
                services: ServiceInclusion::Matching,
            },
            impairment: Some(ImpairmentSpec { latency: Some(latency.into()), ..Default::default() }),
            reverse: None,
            symmetric: false,
            one_way: false,
            profile: None,
            priority: 0,
        },
    )
}

/// A pod that the API server holds as running on `node` (no kubelet: the test writes the status).
async fn running_pod(client: &Client, ns: &str, name: &str, app: &str, node: &str, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "localhost/none:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

fn condition(link: &NetworkLink, type_: &str) -> Option<(String, String)> {
    let c = link.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

async fn event_reasons(client: &Client, ns: &str, link: &str) -> Vec<String> {
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(link))
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn finalizer_and_status_follow_the_link() {
    let Some(client) = client().await else {
        eprintln!("ISTHMUS_TEST_KUBECONFIG is not set: skipped (run `make operator-it`)");
        return;
    };
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-status-{}", std::process::id());
    namespace(&client, &ns).await;
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);

    // No pod matches yet: the link is ready with nothing to do, and carries the finalizer.
    links.create(&PostParams::default(), &link("quiet", "10ms")).await.unwrap();
    let l = eventually("finalizer and first status", || async {
        let l = links.get("quiet").await.ok()?;
        let ok = l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)
            && l.status.as_ref()?.observed_generation == Some(1);
        ok.then_some(l)
    })
    .await;
    assert_eq!(condition(&l, "Ready"), Some(("True".into(), "NoPairs".into())));
    assert_eq!(condition(&l, "Degraded"), Some(("False".into(), "AsExpected".into())));

    // A source and a destination on a node whose agent does not exist: one pair, failed, Degraded says why.
    running_pod(&client, &ns, "client-0", "client", "ghost-node", "198.51.100.10").await;
    running_pod(&client, &ns, "server-0", "server", "ghost-node", "198.51.100.20").await;
    let l = eventually("degraded status", || async {
        let l = links.get("quiet").await.ok()?;
        (condition(&l, "Degraded")?.0 == "True").then_some(l)
    })
    .await;
    let s = l.status.clone().unwrap();
    assert_eq!((s.source_pods, s.destinations, s.pairs, s.pairs_applied, s.pairs_failed), (1, 1, 1, 0, 1));
    assert_eq!(condition(&l, "Degraded").unwrap().1, "AgentUnavailable");
    assert_eq!(condition(&l, "Ready"), Some(("False".into(), "Failed".into())));
    assert_eq!(s.failures[0].pod, format!("{ns}/client-0"));
    assert_eq!(s.failures[0].node.as_deref(), Some("ghost-node"));

    // A spec change is observed.
    links
        .patch("quiet", &PatchParams::default(), &Patch::Merge(json!({"spec": {"impairment": {"latency": "20ms"}}})))
        .await
        .unwrap();
    let l = eventually("generation 2 observed", || async {
        let l = links.get("quiet").await.ok()?;
        (l.status.as_ref()?.observed_generation == Some(2)).then_some(l)
    })
    .await;
    assert_eq!(l.status.unwrap().latency.as_deref().map(|s| s.contains("20ms")), Some(true));

    // Deleting: the only affected node has no Node object, so nothing blocks; the Event says so.
    links.delete("quiet", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("quiet").await.ok()?.is_none().then_some(()) }).await;
    let reasons = eventually("cleanup event", || async {
        let r = event_reasons(&client, &ns, "quiet").await;
        r.iter().any(|r| r == "CleanupSkippedNode").then_some(r)
    })
    .await;
    assert!(reasons.iter().any(|r| r == "AgentUnavailable"), "the Degraded transition was published: {reasons:?}");

    // A node that exists but whose agent never confirms: the finalizer goes after the timeout, with a warning.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = format!("op-it-node-{}", std::process::id());
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap())
        .await
        .unwrap();
    running_pod(&client, &ns, "client-1", "client", &node_name, "198.51.100.11").await;
    links.create(&PostParams::default(), &link("stuck", "10ms")).await.unwrap();
    eventually("stuck link has one pair", || async {
        let l = links.get("stuck").await.ok()?;
        let s = l.status.as_ref()?;
        (s.pairs == 2 && l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    links.delete("stuck", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        links.get_opt("stuck").await.unwrap().is_some(),
        "the finalizer holds the link while the node has not confirmed"
    );
    eventually("stuck link gone after the timeout", || async {
        links.get_opt("stuck").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(started.elapsed() >= Duration::from_secs(3), "not before the cleanup timeout");
    eventually("timeout event", || async {
        event_reasons(&client, &ns, "stuck").await.iter().any(|r| r == "CleanupTimedOut").then_some(())
    })
    .await;

    running.stop().await;
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}

#[tokio::test]
async fn leadership_hands_over_between_two_controllers() {
    let Some(client) = client().await else {
        eprintln!("ISTHMUS_TEST_KUBECONFIG is not set: skipped (run `make operator-it`)");
        return;
    };
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-leader-{}", std::process::id());
    namespace(&client, &ns).await;
    let lease = |identity: &str| LeaderConfig {
        lease_name: "isthmus-operator".into(),
        lease_namespace: ns.clone(),
        identity: identity.into(),
        duration_s: 4,
        grace_s: 1,
    };
    let a = Election::start(client.clone(), &lease("replica-a")).await.unwrap();
    let mut a_leads = a.is_leader.clone();
    a_leads.wait_for(|l| *l).await.unwrap();
    let b = Election::start(client.clone(), &lease("replica-b")).await.unwrap();
    let b_leads = b.is_leader.clone();
    let run_a = start(&client, &ns, "replica-a", a.is_leader.clone(), Duration::from_secs(30));
    let run_b = start(&client, &ns, "replica-b", b_leads.clone(), Duration::from_secs(30));

    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);
    links.create(&PostParams::default(), &link("shared", "10ms")).await.unwrap();
    eventually("the leader writes status and finalizer", || async {
        let l = links.get("shared").await.ok()?;
        let ok = l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)
            && l.status.as_ref()?.observed_generation == Some(1);
        ok.then_some(())
    })
    .await;
    assert!(!*b_leads.borrow(), "only one leader");

    // The leader stops and releases the lease; the follower takes over and handles the next change.
    run_a.stop().await;
    tokio::time::timeout(Duration::from_secs(20), a.release(vec![a_leads])).await.expect("lease released");
    let mut b_wait = b_leads.clone();
    tokio::time::timeout(Duration::from_secs(30), b_wait.wait_for(|l| *l)).await.expect("b leads").unwrap();
    let holder = Api::<Lease>::namespaced(client.clone(), &ns).get("isthmus-operator").await.unwrap();
    assert_eq!(holder.spec.and_then(|s| s.holder_identity).as_deref(), Some("replica-b"));

    links
        .patch("shared", &PatchParams::default(), &Patch::Merge(json!({"spec": {"impairment": {"latency": "30ms"}}})))
        .await
        .unwrap();
    eventually("the new leader observes generation 2", || async {
        let l = links.get("shared").await.ok()?;
        (l.status.as_ref()?.observed_generation == Some(2)).then_some(())
    })
    .await;
    links.delete("shared", &DeleteParams::default()).await.unwrap();
    eventually("the new leader removes the finalizer", || async {
        links.get_opt("shared").await.ok()?.is_none().then_some(())
    })
    .await;

    run_b.stop().await;
    drop(b_wait);
    tokio::time::timeout(Duration::from_secs(20), b.release(vec![b_leads])).await.expect("lease released");
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}

/// A real `isthmus-agent` process on 127.0.0.1 that sees no network namespace at all (empty `--proc` and
/// `--netns-dirs`), so it answers every pod with `PodNotFound` and can touch nothing on this machine.
struct RealAgent {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
    client: Arc<AgentClient>,
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
    async fn start(binary: &str, node: &str) -> RealAgent {
        let dir = std::env::temp_dir().join(format!("isth-op-it-agent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["agent-tls", "operator-tls", "empty-proc", "empty-netns"] {
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
        issue("isthmus-agent", true, "agent-tls");
        issue(OPERATOR_IDENTITY, false, "operator-tls");
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Two ports released in turn can be the same one; the agent then fails to bind and never answers.
        let port = free();
        let health = std::iter::repeat_with(free).find(|h| *h != port).unwrap();
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let child = std::process::Command::new(binary)
            .args(["serve", "--node-name", node, "--log-format", "text", "--tls-reload-seconds", "1"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--health-listen")
            .arg(format!("127.0.0.1:{health}"))
            .arg("--tls-dir")
            .arg(dir.join("agent-tls"))
            .arg("--proc")
            .arg(dir.join("empty-proc"))
            .arg("--netns-dirs")
            .arg(dir.join("empty-netns"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("isthmus-agent starts");
        let client = Arc::new(AgentClient::new(ClientConfig::new(TlsFiles::in_dir(dir.join("operator-tls")))).unwrap());
        let agent = RealAgent { child, dir, port, client };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        eventually("agent answers", || async { agent.client.capabilities(addr).await.ok() }).await;
        agent
    }
}

#[tokio::test]
async fn a_real_agent_confirms_plans_and_releases_the_finalizer() {
    let Some(client) = client().await else {
        eprintln!("ISTHMUS_TEST_KUBECONFIG is not set: skipped (run `make operator-it`)");
        return;
    };
    let Ok(binary) = std::env::var("ISTHMUS_TEST_AGENT_BIN") else {
        eprintln!("ISTHMUS_TEST_AGENT_BIN is not set: skipped (run `make operator-it`)");
        return;
    };
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-agent-{}", std::process::id());
    namespace(&client, &ns).await;
    let node_name = format!("op-it-agent-node-{}", std::process::id());
    let agent = RealAgent::start(&binary, &node_name).await;

    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap())
        .await
        .unwrap();
    // The agent's pod, as the DaemonSet would make it: on the node, ready, its IP where the agent listens.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let agent_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "agent", "labels": {"isthmus-it-agent": ns}},
        "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "localhost/none:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &agent_pod).await.unwrap();
    let ready = json!({"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("agent", &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
    running_pod(&client, &ns, "client-0", "client", &node_name, "198.51.100.30").await;
    running_pod(&client, &ns, "server-0", "server", &node_name, "198.51.100.40").await;

    // The controller's agent client carries the identity this agent trusts.
    let running = start_with_client(&client, &ns, agent.client.clone(), agent.port);

    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);
    links.create(&PostParams::default(), &link("real", "10ms")).await.unwrap();
    // The agent cannot find the pod's namespace (it sees none): the status says so, per pod and node.
    let l = eventually("the agent's per-pod answer in the status", || async {
        let l = links.get("real").await.ok()?;
        (condition(&l, "Degraded")?.1 == "PodNotFound").then_some(l)
    })
    .await;
    let s = l.status.unwrap();
    assert_eq!((s.pairs, s.pairs_applied, s.pairs_failed), (1, 0, 1));
    assert_eq!(s.failures[0].node.as_deref(), Some(node_name.as_str()));

    // Deleting: the agent acknowledges a plan without the link, and the finalizer goes long before the timeout.
    let started = std::time::Instant::now();
    links.delete("real", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("real").await.ok()?.is_none().then_some(()) }).await;
    assert!(started.elapsed() < Duration::from_secs(60), "released by the agent's acknowledgement, not the timeout");
    let reasons = event_reasons(&client, &ns, "real").await;
    assert!(!reasons.iter().any(|r| r == "CleanupTimedOut"), "{reasons:?}");
    let observed = agent.client.observed(std::net::SocketAddr::from(([127, 0, 0, 1], agent.port))).await.unwrap();
    assert!(observed.pods.is_empty(), "the agent holds an empty plan: {observed:?}");

    running.stop().await;
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}
