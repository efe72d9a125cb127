//! The pods every scenario measures between, started once: `client` on the first node; `server` (fronted by the
//! Service `server`) and `near` on the second, so that traffic crosses from one node's kernel to the other's.

use std::time::Duration;

use isthmus_e2e::*;

#[path = "../common/mod.rs"]
mod common;

pub struct Pod {
    pub name: String,
    pub ip: String,
    pub node: String,
}

pub struct Fixture {
    pub ns: TestNamespace,
    pub n1: String,
    pub n2: String,
    pub client: Pod,
    pub server: Pod,
    pub near: Pod,
    /// The ClusterIP of Service `server` (UDP and TCP 7000, pods `app=server`).
    pub server_service_ip: String,
}

impl Fixture {
    pub fn new() -> Fixture {
        let (n1, n2) = common::two_nodes();
        // The tc datapath needs netem in the nodes' kernel; the userspace datapath emulates it.
        if datapath() == Datapath::Tc {
            for node in [&n1, &n2] {
                assert!(node_has_netem(node), "{node}'s kernel has no sch_netem: the tc datapath needs it");
            }
        }
        let ns = TestNamespace::new("netem");
        ns.probe_deployment("client", Some(&n1));
        ns.probe_deployment("server", Some(&n2));
        ns.probe_deployment("near", Some(&n2));
        ns.apply(
            "apiVersion: v1\nkind: Service\nmetadata: {name: server}\nspec:\n  selector: {app: server}\n  ports:\n\
             \x20 - {name: udp, protocol: UDP, port: 7000}\n  - {name: tcp, protocol: TCP, port: 7000}\n",
        );
        let pod = |app: &str| {
            let (name, ip, node) = ns.wait_ready_pod(app);
            Pod { name, ip, node }
        };
        let (client, server, near) = (pod("client"), pod("server"), pod("near"));
        let server_service_ip = ns.json(&["get", "service", "server"])["spec"]["clusterIP"]
            .as_str()
            .expect("the Service has a ClusterIP")
            .to_owned();
        println!(
            "fixture in {}: client {} on {n1}; server {} and near {} on {n2}; Service server {server_service_ip}",
            ns.name, client.ip, server.ip, near.ip
        );
        Fixture { ns, n1, n2, client, server, near, server_service_ip }
    }

    /// Applies a NetworkLink (`spec` is the YAML under `spec:`, indented by two) and waits until every pair is
    /// applied; the link is deleted, waiting for its removal, when the guard drops.
    pub fn link(&self, name: &str, spec: &str) -> Link<'_> {
        // The guard exists before the wait: a link that never gets Ready is deleted all the same.
        let link = self.link_unchecked(name, spec);
        let pairs = self.ns.wait_link_applied(name);
        // The status says which datapath applied the pairs: all emulated by the agents, or none.
        let status = self.ns.json(&["get", "networklink", name])["status"].clone();
        let emulated = status["pairsEmulated"].as_u64().unwrap_or(0);
        println!("link {name}: Ready, {pairs} pair(s) applied, {emulated} emulated by the agents");
        let want = if datapath() == Datapath::Userspace { status["pairsApplied"].as_u64().unwrap_or(0) } else { 0 };
        assert_eq!(emulated, want, "status.pairsEmulated through the {:?} datapath: {status}", datapath());
        link
    }

    /// Applies a NetworkLink without waiting for it; deleted when the guard drops.
    pub fn link_unchecked(&self, name: &str, spec: &str) -> Link<'_> {
        self.apply_link(name, spec);
        Link { ns: &self.ns, name: name.to_owned() }
    }

    /// Applies (or re-applies) a NetworkLink without waiting.
    pub fn apply_link(&self, name: &str, spec: &str) {
        self.ns.apply(&format!(
            "apiVersion: isthmus.dev/v1alpha1\nkind: NetworkLink\nmetadata: {{name: {name}}}\nspec:\n{spec}"
        ));
    }

    /// The first of up to three counted runs from `client` to `server` in which no full receive buffer dropped a
    /// datagram. A run with such drops is one in which the machine stalled a pod for hundreds of milliseconds, and
    /// a stall drops datagrams in queues no counter here reads as well (a CI run of the vm provider, 2026-11-29:
    /// 384 receive-buffer drops, round trips p90 542 ms against the baseline's 27 ms, and 7.5 % loss on a 5 % link
    /// over the remaining probes; stop 40's CI: 127 drops and 31 probes lost elsewhere on a link that loses none).
    /// What a clean run loses is the link's doing, to sampling error.
    pub fn clean_run(&self, what: &str, run: RttRun) -> RttReport {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let r = self.rtt_counted(&self.server, run);
            println!("{what}: {}", r.describe());
            if r.buffer_drops() == 0 {
                return r;
            }
            assert!(
                attempt < ATTEMPTS,
                "each of {ATTEMPTS} runs had datagrams dropped by a full receive buffer (the machine stalled the \
                 pods): no run tells the link's loss"
            );
        }
        unreachable!("the last attempt returns or fails")
    }

    /// Round trips from `client` to `to`, counting the datagrams a full receive buffer dropped at either end
    /// ([`TestNamespace::rtt_run_counted`]): for the figures that count losses.
    pub fn rtt_counted(&self, to: &Pod, run: RttRun) -> RttReport {
        self.ns.rtt_run_counted(&self.client.name, &to.name, &to.ip, run)
    }

    /// A one-way link from pods `app=<from>` to pods `app=<to>` with `impairment` (a YAML flow map).
    pub fn one_way(&self, name: &str, from: &str, to: &str, impairment: &str) -> Link<'_> {
        self.link(name, &one_way_spec(from, to, impairment))
    }
}

/// The pod's tree read on its node with iproute2 (the tc datapath; the capture interface through the userspace
/// one): see [`assert_pod_shaped`].
pub fn assert_shaped(pod: &Pod, expect: &[(&str, &str)]) {
    assert_pod_shaped(&pod.node, &pod.ip, expect);
}

pub fn one_way_spec(from: &str, to: &str, impairment: &str) -> String {
    format!(
        "  from: {{podSelector: {{matchLabels: {{app: {from}}}}}}}\n  to: {{podSelector: {{matchLabels: {{app: {to}}}}}}}\n\
         \x20 oneWay: true\n  impairment: {impairment}\n"
    )
}

/// A NetworkLink in place for the length of a scenario.
pub struct Link<'a> {
    ns: &'a TestNamespace,
    pub name: String,
}

impl Drop for Link<'_> {
    fn drop(&mut self) {
        let out = kubectl_raw(
            &[
                "delete",
                "-n",
                &self.ns.name,
                "networklink",
                &self.name,
                "--wait",
                "--timeout=90s",
                "--ignore-not-found",
            ],
            None,
        );
        if !out.ok {
            eprintln!("deleting link {}: {}{}", self.name, out.stdout, out.stderr);
        }
    }
}

/// Waits until a condition of `link` reads `status` with `reason` for the link's current generation, and returns
/// the link's whole status as read then: the rest of the status is judged from the same read, never from a
/// later one, which a new plan may already have turned back to Pending.
pub fn wait_condition(ns: &TestNamespace, link: &str, type_: &str, status: &str, reason: &str) -> serde_json::Value {
    wait_for(&format!("{link} {type_}={status} ({reason})"), Duration::from_secs(90), || {
        let l = ns.json(&["get", "networklink", link]);
        let c = l["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
        let current = c["observedGeneration"].as_i64() == l["metadata"]["generation"].as_i64();
        (current && c["status"] == status && c["reason"] == reason).then(|| l["status"].clone())
    })
}
