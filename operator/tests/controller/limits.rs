//! The plan limits against a real API server, the operator binary and a real agent: 5,000 pods across 50
//! namespaces on one node and one link `{}` → `{}` with `namespaceSelector: {}`. That link is refused with
//! `TooManyDestinations`; the other namespaces' links on the same node get every pair planned and answered by
//! the agent; the operator process stays under the chart's memory limit.

use std::time::Duration;

use futures::StreamExt;
use isthmus_operator::api::NetworkLink;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::cluster::*;

const NAMESPACES: usize = 50;
const PODS_PER_NAMESPACE: usize = 100;
/// Namespaces besides the first that get a link of their own.
const TENANTS: usize = 3;

/// The operator's memory limit in the chart's values (`limits: {memory: <n>Mi}`), in bytes.
fn chart_memory_limit() -> u64 {
    let values = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/isthmus/values.yaml"))
        .expect("the chart's values");
    let operator = &values[values.find("\noperator:").expect("operator values")..];
    let limit = &operator[operator.find("limits: {memory: ").expect("the operator's memory limit") + 17..];
    let mebibytes: u64 = limit[..limit.find("Mi}").expect("a limit in Mi")].parse().expect("a number");
    mebibytes << 20
}

/// The peak resident memory of a process (`VmHWM`), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the operator is running");
    isthmus_test_kit::proc::status_kib(&status, "VmHWM").expect("VmHWM") * 1024
}

/// The operator binary, leading at once, finding the test's agent by its label.
struct Operator(std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Operator {
    /// The operator binary as the chart runs it, its CA the one that signed the test agent's certificate (a Secret
    /// in the test's namespace, which it loads instead of making one), so that its in-memory client certificate
    /// is one the agent accepts.
    async fn start(t: &WithAgent, log: std::path::PathBuf) -> Operator {
        let read = |name: &str| std::fs::read_to_string(t.agent.dir.join("ca").join(name)).unwrap();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "isthmus-ca"},
            "stringData": {"ca.crt": read("ca.crt"), "ca.key": read("ca.key")},
        }))
        .unwrap();
        Api::<Secret>::namespaced(t.client.clone(), &t.ns).create(&PostParams::default(), &secret).await.unwrap();
        let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_isthmus-operator"))
            .env("KUBECONFIG", std::env::var("ISTHMUS_TEST_KUBECONFIG").unwrap())
            .env("RUST_LOG", "info")
            .env("POD_NAMESPACE", &t.ns)
            .args(["--leader-election", "false", "--log-format", "text"])
            .args(["--agent-namespace", &t.ns, "--agent-selector", &format!("isthmus-it-agent={}", t.ns)])
            .args(["--agent-port", &t.agent.port.to_string(), "--metrics-addr", &metrics.to_string()])
            .args(["--ca-secret", "isthmus-ca", "--ca-bundle", "isthmus-ca-bundle"])
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("isthmus-operator starts");
        Operator(child)
    }
}

fn pod_ip(ns: usize, i: usize) -> String {
    let n = ns * PODS_PER_NAMESPACE + i;
    format!("10.64.{}.{}", n / 250, n % 250 + 1)
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_link_selecting_every_pod_of_the_cluster_is_refused_and_others_are_served() {
    let t = WithAgent::start("limits").await;
    let client = &t.client;
    let names: Vec<String> = (0..NAMESPACES).map(|i| format!("{}-{i}", t.ns)).collect();
    for ns in &names {
        namespace(client, ns).await;
    }
    // Half clients, half servers, all on the agent's node: 50 destinations per tenant link.
    let pods = (0..NAMESPACES).flat_map(|ns| (0..PODS_PER_NAMESPACE).map(move |i| (ns, i)));
    futures::stream::iter(pods)
        .for_each_concurrent(16, |(ns, i)| {
            let app = if i % 2 == 0 { "client" } else { "server" };
            let (names, node) = (&names, &t.node);
            async move { running_pod(client, &names[ns], &format!("pod-{i}"), app, node, &pod_ip(ns, i)).await }
        })
        .await;

    let log = t.agent.dir.join("operator.log");
    let operator = Operator::start(&t, log.clone()).await;
    let mut everything: NetworkLink = serde_json::from_value(json!({
        "metadata": {"name": "everything"},
        "spec": {"from": {"podSelector": {}}, "to": {"podSelector": {}, "namespaceSelector": {}},
                 "impairment": {"latency": "100ms"}},
    }))
    .unwrap();
    everything.metadata.namespace = Some(names[0].clone());
    let first: Api<NetworkLink> = Api::namespaced(client.clone(), &names[0]);
    first.create(&PostParams::default(), &everything).await.unwrap();
    for ns in &names[1..=TENANTS] {
        let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);
        links.create(&PostParams::default(), &link("wan", "40ms")).await.unwrap();
    }

    // Every pod of the cluster: the 5,000 and the agent's own pod.
    let all = (NAMESPACES * PODS_PER_NAMESPACE + 1) as u32;
    let refused = eventually("the link over the limit says so, all pods counted", || async {
        let l = first.get("everything").await.ok()?;
        let counted = l.status.as_ref()?.destinations == all;
        (counted && condition(&l, "Ready")? == ("False".into(), "TooManyDestinations".into())).then_some(l)
    })
    .await;
    let status = refused.status.unwrap();
    assert_eq!((status.destinations, status.pairs), (all, 0));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(ready.message.contains("5001 destinations") && ready.message.contains("limit of 512"), "{ready:?}");
    assert!(event_reasons(client, &names[0], "everything").await.iter().any(|r| r == "TooManyDestinations"));

    // The tenants' links: every pair planned and answered by the node's agent, which sees no network
    // namespace here and says so per pod (PodNotFound): their plans reached it, nothing was refused.
    let pairs = (PODS_PER_NAMESPACE / 2 * PODS_PER_NAMESPACE / 2) as u32;
    for ns in &names[1..=TENANTS] {
        let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);
        let l = eventually(&format!("{ns}/wan answered by the agent"), || async {
            let l = links.get("wan").await.ok()?;
            let s = l.status.as_ref()?;
            (s.pairs == pairs && s.pairs_failed == pairs).then_some(l)
        })
        .await;
        let s = l.status.unwrap();
        assert!(s.failures.iter().all(|f| f.reason == "PodNotFound"), "{ns}: {:?}", s.failures);
    }
    let peak = peak_memory(operator.0.id());
    let limit = chart_memory_limit();
    println!("operator peak memory: {} MiB (chart limit {} MiB)", peak >> 20, limit >> 20);
    assert!(peak < limit, "the operator peaked at {peak} bytes, over the chart's limit of {limit}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.lines().all(|l| l.len() < 4096), "no log line dumps a list");

    // The links go while the operator runs (their finalizers), then the operator.
    for ns in &names[..=TENANTS] {
        let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);
        links.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
        eventually("links gone", || async {
            links.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
    }
    drop(operator);

    // Pods without a kubelet go at once only with no grace period.
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for ns in &names {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let _ = pods.delete_collection(&now, &ListParams::default()).await;
        let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    t.finish().await;
}
