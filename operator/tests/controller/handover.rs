//! Leadership changes while plans are on their way, against a real API server and a real agent that shapes
//! real network namespaces (an `eth0` per pod, bandwidth only: this kernel has no netem):
//! - a deposed leader's plan that reaches the agent after the new leader's is refused as stale, and the node
//!   keeps the new leader's tree;
//! - a leader killed with a plan in flight, then a fresh controller: the node converges to the fresh
//!   controller's plan, and the tree of a pod deleted meanwhile is gone.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use isthmus_agent_api::{ApplyReply, NodePlan};
use isthmus_operator::api::{ImpairmentSpec, NetworkLink};
use isthmus_operator::controller::agent_api::{AgentApi, CallError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use super::cluster::*;

/// Each delivered plan's version and the agent's reply.
type Delivered = Vec<(u64, Result<ApplyReply, CallError>)>;

/// The agents' API with a hold: while held, each plan waits, as if on a slow network, and is then delivered by
/// a task of its own, so a caller that gives up waiting (a deposed leader does) cannot stop it from arriving.
struct Held {
    real: Arc<dyn AgentApi>,
    open: watch::Sender<bool>,
    delivered: Arc<Mutex<Delivered>>,
    waiting: Arc<Mutex<Vec<u64>>>,
}

impl Held {
    fn new(real: Arc<dyn AgentApi>, open: bool) -> Arc<Held> {
        Arc::new(Held { real, open: watch::channel(open).0, delivered: Arc::default(), waiting: Arc::default() })
    }

    fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }

    fn waiting(&self) -> Vec<u64> {
        self.waiting.lock().unwrap().clone()
    }

    fn delivered(&self) -> Delivered {
        self.delivered.lock().unwrap().clone()
    }
}

impl AgentApi for Held {
    fn apply<'a>(&'a self, agent: SocketAddr, plan: &'a NodePlan) -> BoxFuture<'a, Result<ApplyReply, CallError>> {
        let (real, plan) = (self.real.clone(), plan.clone());
        let (mut open, delivered, waiting) = (self.open.subscribe(), self.delivered.clone(), self.waiting.clone());
        let delivery = tokio::spawn(async move {
            waiting.lock().unwrap().push(plan.version);
            let _ = open.wait_for(|o| *o).await;
            waiting.lock().unwrap().retain(|v| *v != plan.version);
            let reply = real.apply(agent, &plan).await;
            delivered.lock().unwrap().push((plan.version, reply.clone()));
            reply
        });
        Box::pin(async move { delivery.await.expect("the delivery task") })
    }

    fn measured<'a>(
        &'a self,
        agent: SocketAddr,
        node: &'a str,
    ) -> BoxFuture<'a, Result<isthmus_agent_api::measure::MeasuredState, CallError>> {
        self.real.measured(agent, node)
    }
}

/// A pod's network namespace: `ip netns add`, an `eth0` (one end of a veth pair) with the pod's IP, pinned in
/// the agent's directory.
struct PodNetns {
    name: String,
    pin: std::path::PathBuf,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

impl PodNetns {
    fn new(dir: &std::path::Path, name: &str, ip: &str) -> PodNetns {
        let name = format!("isth-opit-{name}-{}", std::process::id());
        // A previous run's leftover, if any (none is the usual case: quiet).
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(std::process::Stdio::null()).status();
        run("ip", &["netns", "add", &name]);
        let pin = dir.join(&name);
        let ns = PodNetns { name, pin };
        // This kernel has no dummy interfaces: a veth pair, both ends inside.
        run("ip", &["-n", &ns.name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0"]);
        run("ip", &["-n", &ns.name, "link", "set", "peer0", "up"]);
        run("ip", &["-n", &ns.name, "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
        run("ip", &["-n", &ns.name, "link", "set", "eth0", "up"]);
        std::fs::File::create(&ns.pin).unwrap();
        run("mount", &["--bind", &format!("/run/netns/{}", ns.name), ns.pin.to_str().unwrap()]);
        ns
    }

    /// `tc qdisc show dev eth0` inside: the rate is the TBF's.
    fn qdiscs(&self) -> String {
        run("ip", &["netns", "exec", &self.name, "tc", "qdisc", "show", "dev", "eth0"])
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        // Lazily: the agent may still hold the namespace open through the pin.
        let _ = Command::new("umount").arg("--lazy").arg(&self.pin).status();
        let _ = std::fs::remove_file(&self.pin);
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The directory the agent finds the pods' namespaces in; removed last (declared first), also when a test fails.
struct Pins(std::path::PathBuf);

impl Pins {
    fn new() -> Pins {
        let dir = std::env::temp_dir().join(format!("isth-opit-pins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Pins(dir)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bandwidth(rate: &str) -> serde_json::Value {
    json!({"spec": {"impairment": {"latency": null, "bandwidth": rate}}})
}

async fn generation_applied(links: &Api<NetworkLink>, generation: i64, pairs: u32) {
    eventually(&format!("generation {generation} applied to {pairs} pairs"), || async {
        let l = links.get("wan").await.ok()?;
        let s = l.status.as_ref()?;
        let ready = condition(&l, "Ready")? == ("True".into(), "Applied".into());
        (s.observed_generation == Some(generation) && ready && s.pairs == pairs).then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a real API server and root (network namespaces): make operator-it starts one"]
async fn a_late_plan_from_a_deposed_leader_or_a_killed_one_never_wins() {
    let pins = Pins::new();
    let c1 = PodNetns::new(&pins.0, "c1", "198.51.100.31");
    let c2 = PodNetns::new(&pins.0, "c2", "198.51.100.32");
    let t = WithAgent::start_seeing("handover", Some(&pins.0)).await;
    let (client, ns) = (&t.client, &t.ns);
    running_pod(client, ns, "client-1", "client", &t.node, "198.51.100.31").await;
    running_pod(client, ns, "client-2", "client", &t.node, "198.51.100.32").await;
    running_pod(client, ns, "server-0", "server", &t.node, "198.51.100.40").await;
    let real: Arc<dyn AgentApi> = t.agent.client.clone();
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);

    // Leader A's first plan is held on the way to the agent.
    let a_api = Held::new(real.clone(), false);
    let (a_leads, rx) = watch::channel(true);
    let a = start_controller(client, ns, "replica-a", rx, a_api.clone(), t.agent.port);
    let mut wan = link("wan", "0ms");
    wan.spec.impairment = Some(ImpairmentSpec { bandwidth: Some("10Mbit".into()), ..Default::default() });
    links.create(&PostParams::default(), &wan).await.unwrap();
    let a_versions =
        eventually("A's plan in flight", || async { Some(a_api.waiting()).filter(|w| !w.is_empty()) }).await;

    // A is deposed; B leads, and the link changes.
    a_leads.send_replace(false);
    let b_api = Held::new(real.clone(), true);
    let (_b_leads, rx) = watch::channel(true);
    let b = start_controller(client, ns, "replica-b", rx, b_api.clone(), t.agent.port);
    links.patch("wan", &PatchParams::default(), &Patch::Merge(bandwidth("20Mbit"))).await.unwrap();
    generation_applied(&links, 2, 2).await;
    for pod in [&c1, &c2] {
        assert!(pod.qdiscs().contains("rate 20Mbit"), "{}: {}", pod.name, pod.qdiscs());
    }

    // A's plan arrives after B's: the agent refuses it as stale and the node keeps B's tree.
    a_api.set_open(true);
    let late = eventually("A's late plan answered", || async {
        let delivered = a_api.delivered();
        a_versions.iter().all(|v| delivered.iter().any(|(d, _)| d == v)).then_some(delivered)
    })
    .await;
    for (version, reply) in &late {
        let reply = reply.as_ref().expect("the agent answers");
        assert!(reply.stale, "A's plan {version} was applied over B's: {reply:?}");
    }
    for pod in [&c1, &c2] {
        assert!(pod.qdiscs().contains("rate 20Mbit"), "{}: {}", pod.name, pod.qdiscs());
    }
    a.stop().await;

    // B is killed with a plan in flight (client-2 deleted, 30Mbit); then a fresh controller C takes over.
    b_api.set_open(false);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete("client-2", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    links.patch("wan", &PatchParams::default(), &Patch::Merge(bandwidth("30Mbit"))).await.unwrap();
    eventually("B's plan in flight", || async { (!b_api.waiting().is_empty()).then_some(()) }).await;
    b.kill().await;
    let (_c_leads, rx) = watch::channel(true);
    let c = start_controller(client, ns, "replica-c", rx, real.clone(), t.agent.port);
    generation_applied(&links, 3, 1).await;
    assert!(c1.qdiscs().contains("rate 30Mbit"), "{}", c1.qdiscs());
    eventually("client-2's tree removed", || async { (!c2.qdiscs().contains("htb")).then_some(()) }).await;
    let observed =
        t.agent.client.observed(SocketAddr::from(([127, 0, 0, 1], t.agent.port)), &t.agent.node).await.unwrap();
    let shaped: Vec<&str> = observed.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(shaped, ["client-1"], "nothing extra remains");

    links.delete("wan", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("wan").await.ok()?.is_none().then_some(()) }).await;
    assert!(!c1.qdiscs().contains("htb"), "{}", c1.qdiscs());
    c.stop().await;
    t.finish().await;
}
