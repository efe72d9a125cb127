//! Helpers for the end-to-end suite: a cluster reached through `kubectl` (KUBECONFIG from the environment),
//! a namespace per test that is deleted when the test ends (pass or fail), and the probe run inside pods.
//!
//! Environment: `KUBECONFIG` (required), `ISTHMUS_E2E_KUBECTL` (kubectl binary, default `kubectl`),
//! `ISTHMUS_E2E_PROVIDER` (`local`, `vm` or `kind`; informational), `ISTHMUS_E2E_PROBE_IMAGE`
//! (default `localhost/isthmus-probe:0.1.0`), `ISTHMUS_E2E_CLUSTER` (the `e2e/cluster/cluster` script, for
//! commands on nodes).
//!
//! `smoke` and `snapshot` hold the pure verdicts of the cluster smoke test (`tests/cluster_smoke/`).

mod measured;
mod node;
mod probe;
pub mod smoke;
pub mod snapshot;
mod switch;
pub mod verdict;

pub use measured::*;
pub use node::*;
pub use probe::*;
pub use switch::*;

use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Goodput of a TCP bulk transfer through a rate limit that counts whole Ethernet frames (1514 B) carrying
/// 1448 B of payload each.
pub fn expected_goodput_bps(rate_bps: f64) -> f64 {
    rate_bps * 1448.0 / 1514.0
}

pub struct Output {
    pub ok: bool,
    /// The exit status (None when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn kubectl_raw(args: &[&str], stdin: Option<&str>) -> Output {
    let bin = std::env::var("ISTHMUS_E2E_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    assert!(std::env::var_os("KUBECONFIG").is_some(), "KUBECONFIG must point at the e2e cluster (make e2e sets it)");
    let mut child = Command::new(&bin)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// kubectl that must succeed; returns stdout.
pub fn kubectl(args: &[&str]) -> String {
    let out = kubectl_raw(args, None);
    assert!(out.ok, "kubectl {} failed: {}{}", args.join(" "), out.stdout, out.stderr);
    out.stdout
}

/// Prints what isthmus's own pods logged in the last `since` (every agent, prefixed with its pod, then the
/// operator): a failed scenario's record of what the product did meanwhile, which a CI log keeps and the cluster,
/// torn down after the run, does not.
pub fn print_isthmus_logs(since: Duration) {
    let since = format!("--since={}s", since.as_secs() + 5);
    for component in ["agent", "operator"] {
        let selector = format!("app.kubernetes.io/component={component}");
        let args =
            ["logs", "-n", "isthmus-system", "-l", &selector, "--prefix", "--tail=-1", "--max-log-requests=8", &since];
        let out = kubectl_raw(&args, None);
        println!("---- isthmus {component} logs ({since}):\n{}{}", out.stdout, out.stderr);
    }
}

pub fn kubectl_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(&all)).expect("kubectl -o json printed JSON")
}

pub fn provider() -> String {
    std::env::var("ISTHMUS_E2E_PROVIDER").unwrap_or_else(|_| "local".into())
}

pub fn probe_image() -> String {
    std::env::var("ISTHMUS_E2E_PROBE_IMAGE").unwrap_or_else(|_| "localhost/isthmus-probe:0.1.0".into())
}

/// Polls `f` every 100 ms until it returns Some or `timeout` passes (then panics with `what` and the last
/// value seen by `describe`).
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A namespace of its own for one test, deleted (with everything in it) on drop.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub fn new(test: &str) -> Self {
        let name = format!("e2e-{test}-{}", std::process::id());
        kubectl(&["create", "namespace", &name]);
        TestNamespace { name }
    }

    pub fn apply(&self, manifest: &str) {
        let out = kubectl_raw(&["apply", "-n", &self.name, "-f", "-"], Some(manifest));
        assert!(out.ok, "kubectl apply failed: {}{}", out.stdout, out.stderr);
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        kubectl(&all)
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend(args);
        kubectl_json(&all)
    }

    /// A Deployment of probe servers (`isthmus-probe serve`) labelled `app=<name>`, optionally pinned to a node.
    pub fn probe_deployment(&self, name: &str, node: Option<&str>) {
        self.apply(&probe_deployment_manifest(name, node, None));
    }

    /// Deletes Deployments (labelled `app=<name>`, as this crate makes them) and waits until their pods are gone:
    /// pods stopping on an emulated node load it for seconds, which spreads the round trips the next
    /// measurement takes.
    pub fn delete_deployments(&self, names: &[&str]) {
        let mut args = vec!["delete", "deployment", "--wait=true"];
        args.extend(names);
        self.kubectl(&args);
        let selector = format!("app in ({})", names.join(","));
        wait_for(&format!("the pods of {names:?} gone from {}", self.name), Duration::from_secs(120), || {
            self.json(&["get", "pods", "-l", &selector])["items"].as_array().is_some_and(Vec::is_empty).then_some(())
        });
    }

    /// The one Ready, not terminating pod labelled `app=<app>`: (name, IP, node).
    pub fn ready_pod(&self, app: &str) -> Option<(String, String, String)> {
        let pods = self.json(&["get", "pods", "-l", &format!("app={app}")]);
        let ready: Vec<&Value> = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .collect();
        let [p] = ready.as_slice() else { return None };
        Some((
            p["metadata"]["name"].as_str()?.to_owned(),
            p["status"]["podIP"].as_str()?.to_owned(),
            p["spec"]["nodeName"].as_str()?.to_owned(),
        ))
    }

    /// Pods start in tens of seconds on emulated nodes (the vm provider), in one or two elsewhere.
    pub fn wait_ready_pod(&self, app: &str) -> (String, String, String) {
        wait_for(&format!("a Ready pod app={app} in {}", self.name), Duration::from_secs(240), || self.ready_pod(app))
    }

    /// A condition of a NetworkLink: (status, reason, message), if present and written for the current
    /// generation.
    pub fn link_condition(&self, link: &str, type_: &str) -> Option<(String, String, String)> {
        let l = self.json(&["get", "networklink", link]);
        let generation = l["metadata"]["generation"].as_i64();
        let c = l["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?.clone();
        if c["observedGeneration"].as_i64() != generation {
            return None;
        }
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str().unwrap_or_default().to_owned(),
            c["message"].as_str().unwrap_or_default().to_owned(),
        ))
    }

    /// Waits until the link reports Ready=True with every pair applied; returns the number of pairs.
    pub fn wait_link_applied(&self, link: &str) -> i64 {
        wait_for(
            &format!("NetworkLink {}/{link} Ready with all pairs applied", self.name),
            Duration::from_secs(60),
            || {
                let (status, reason, _) = self.link_condition(link, "Ready")?;
                let s = self.json(&["get", "networklink", link]);
                let pairs = s["status"]["pairs"].as_i64()?;
                (status == "True" && reason == "Applied" && s["status"]["pairsApplied"].as_i64() == Some(pairs))
                    .then_some(pairs)
            },
        )
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Links first, so their finalizers run while the operator and the pods still exist; topologies before
        // links, or the operator would make their links again.
        let _ =
            kubectl_raw(&["-n", &self.name, "delete", "networktopologies", "--all", "--wait", "--timeout=60s"], None);
        let _ = kubectl_raw(&["-n", &self.name, "delete", "networklinks", "--all", "--wait", "--timeout=60s"], None);
        let _ = kubectl_raw(&["delete", "namespace", &self.name, "--wait", "--timeout=120s"], None);
    }
}

/// A Deployment of probe servers (`isthmus-probe serve`) labelled `app=<name>`, optionally pinned to a node and
/// with pod sysctls (a YAML flow list of `{name, value}`).
pub fn probe_deployment_manifest(name: &str, node: Option<&str>, sysctls: Option<&str>) -> String {
    let node_line = node.map(|n| format!("      nodeName: {n}\n")).unwrap_or_default();
    let sysctls = sysctls.map(|s| format!(", sysctls: {s}")).unwrap_or_default();
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
{node_line}      terminationGracePeriodSeconds: 1
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532{sysctls}}}
      containers:
        - name: probe
          image: {image}
          imagePullPolicy: IfNotPresent
          args: [serve]
          readinessProbe: {{tcpSocket: {{port: 7000}}, periodSeconds: 1}}
          securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
"#,
        image = probe_image()
    )
}

/// A NetworkLink from pods `app=<from>` to pods `app=<to>`, one way, with `impairment` as a YAML flow map.
pub fn link_manifest(name: &str, from: &str, to: &str, impairment: &str, priority: Option<i32>) -> String {
    let priority = priority.map(|p| format!("  priority: {p}\n")).unwrap_or_default();
    format!(
        r#"apiVersion: isthmus.dev/v1alpha1
kind: NetworkLink
metadata: {{name: {name}}}
spec:
  from: {{podSelector: {{matchLabels: {{app: {from}}}}}}}
  to: {{podSelector: {{matchLabels: {{app: {to}}}}}}}
  oneWay: true
{priority}  impairment: {impairment}
"#
    )
}

pub fn mbit(bps: f64) -> String {
    format!("{:.2} Mbit/s", bps / 1e6)
}
