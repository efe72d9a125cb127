//! The nodes, three pods from the locally built image on two of them (a1, a2 on node A; b1 on node B), kubectl
//! exec and logs in them, and traffic between them: ping and TCP within a node and across nodes.

use std::time::Instant;

use isthmus_e2e::kubectl;
use isthmus_e2e::smoke::{nodes_summary, ping_answered, tail_line};

use crate::{Smoke, apply, elapsed, env, node_names, pass, sleep_s, wait_nodes_ready};

/// The pods' nodes and addresses.
pub struct Pods {
    pub a: String,
    pub b: String,
    pub ip_a1: String,
    pub ip_a2: String,
    pub ip_b1: String,
}

/// Every node Ready; the first two schedulable ones (A, B).
pub fn schedulable_nodes() -> (String, String) {
    wait_nodes_ready();
    let nodes = node_names(&["-l", "!node-role.kubernetes.io/control-plane"]);
    assert!(nodes.len() >= 2, "expected 2 schedulable nodes, got: {}", nodes.join(" "));
    pass(&format!("nodes Ready: {}", nodes_summary(&kubectl(&["get", "nodes", "--no-headers"]))));
    (nodes[0].clone(), nodes[1].clone())
}

/// A pod on `node` that serves "hello from <name>" on :8080 (busybox httpd), logs "started <name>" and is Ready
/// once the port answers.
fn pod_manifest(smoke: &Smoke, name: &str, node: &str, labels: &str) -> String {
    let (ns, image) = (&smoke.ns, &smoke.image);
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo \"hello from $(hostname)\" > /tmp/index.html && httpd -p 8080 -h /tmp && echo started $(hostname) && trap 'exit 0' TERM && while :; do sleep 1; done"]
    ports: [{{containerPort: 8080}}]
    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
"#
    )
}

/// The namespace, and a1, a2 on `a` and b1 on `b`, Ready (scheduled by kube-scheduler through their node
/// selectors).
pub fn start(smoke: &Smoke, a: String, b: String) -> Pods {
    kubectl(&["create", "namespace", &smoke.ns]);
    let t = Instant::now();
    let manifest: String =
        [("a1", &a, "app: web, side: a"), ("a2", &a, "app: client"), ("b1", &b, "app: web, side: b")]
            .iter()
            .map(|(name, node, labels)| pod_manifest(smoke, name, node, labels))
            .collect();
    apply(&manifest);
    smoke.kn(&["wait", "--for=condition=Ready", "pod/a1", "pod/a2", "pod/b1", "--timeout=120s"]);
    pass(&format!("3 pods from the locally built image Ready in {} s (scheduled by kube-scheduler)", elapsed(t)));
    eprint!("{}", smoke.kn(&["get", "pods", "-o", "wide"]));
    let ip = |pod: &str| smoke.kn(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"]);
    Pods { ip_a1: ip("a1"), ip_a2: ip("a2"), ip_b1: ip("b1"), a, b }
}

pub fn exec_and_logs(smoke: &Smoke) {
    let out = smoke.exec("a1", &["cat", "/etc/isthmus-smoke"]);
    assert!(
        out.stdout.trim_end_matches('\n') == env("ISTHMUS_SMOKE_MARKER"),
        "kubectl exec: marker file not read back"
    );
    pass("kubectl exec runs in the container of the built image");
    let out = smoke.kn(&["logs", "a1"]);
    assert!(
        out.lines().any(|l| l == "started a1"),
        "kubectl logs a1 lacks 'started a1': {}",
        out.trim_end_matches('\n')
    );
    pass("kubectl logs");
}

/// Whether `from` pings `ip`. Connectivity, not a loss rate, is checked: a lost echo or a `kubectl exec` that
/// fails to start on a loaded machine is tried again (3 attempts); no route fails them all.
pub fn ping_ok(smoke: &Smoke, from: &str, ip: &str) -> bool {
    for _ in 0..3 {
        let out = smoke.exec(from, &["ping", "-c", "2", "-W", "2", ip]);
        if ping_answered(&format!("{}{}", out.stdout, out.stderr)) {
            return true;
        }
        sleep_s(1.0);
    }
    false
}

/// The last line `from` gets for `GET /` from `host:port` (busybox nc, 3 s); None when it got nothing.
pub fn http_get(smoke: &Smoke, from: &str, host: &str, port: &str) -> Option<String> {
    let request = format!(r"printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 {host} {port}");
    tail_line(&smoke.exec(from, &["sh", "-c", &request]).stdout).map(str::to_owned)
}

/// Whether `from` gets the page `expected` from `host:port`, asked up to 3 times.
pub fn http_expect(smoke: &Smoke, from: &str, host: &str, port: &str, expected: &str) -> bool {
    for _ in 0..3 {
        if http_get(smoke, from, host, port).as_deref() == Some(expected) {
            return true;
        }
        sleep_s(1.0);
    }
    false
}

pub fn connectivity(smoke: &Smoke, p: &Pods) {
    assert!(ping_ok(smoke, "a1", &p.ip_a2), "ping a1 -> a2 ({}) within {}", p.ip_a2, p.a);
    pass(&format!("ping within a node: a1 -> a2 ({})", p.ip_a2));
    assert!(ping_ok(smoke, "a1", &p.ip_b1), "ping a1 -> b1 ({}), {} -> {}", p.ip_b1, p.a, p.b);
    assert!(ping_ok(smoke, "b1", &p.ip_a1), "ping b1 -> a1 ({}), {} -> {}", p.ip_a1, p.b, p.a);
    pass(&format!("ping across nodes: a1 <-> b1 ({} <-> {})", p.ip_a1, p.ip_b1));
    assert!(http_expect(smoke, "a2", &p.ip_a1, "8080", "hello from a1"), "TCP a2 -> a1:8080 within {}", p.a);
    pass("TCP within a node: a2 -> a1:8080");
    assert!(http_expect(smoke, "a1", &p.ip_b1, "8080", "hello from b1"), "TCP a1 -> b1:8080 across nodes");
    assert!(http_expect(smoke, "b1", &p.ip_a1, "8080", "hello from a1"), "TCP b1 -> a1:8080 across nodes");
    pass("TCP across nodes: a1 <-> b1 :8080");
}
