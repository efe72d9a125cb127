//! Services through their ClusterIP (kube-proxy): `web-b` (b1 only) across nodes, `web` (a1 and b1) balancing
//! 12 requests between them; and the kubernetes Service from a pod.

use isthmus_e2e::kubectl;
use isthmus_e2e::smoke::Tally;

use crate::pods::{Pods, http_get};
use crate::{Smoke, apply, pass, sleep_s};

/// The requests of the load-balance check.
const REQUESTS: usize = 12;

pub fn services(smoke: &Smoke, pods: &Pods) {
    let ns = &smoke.ns;
    apply(&format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-b, namespace: {ns}}}
spec: {{selector: {{app: web, side: b}}, ports: [{{port: 80, targetPort: 8080}}]}}
"#
    ));
    let cluster_ip = |svc: &str| smoke.kn(&["get", "svc", svc, "-o", "jsonpath={.spec.clusterIP}"]);
    let (cip, bcip) = (cluster_ip("web"), cluster_ip("web-b"));
    let from_b = || http_get(smoke, "a2", &bcip, "80");
    // kube-proxy programs the rules asynchronously after the EndpointSlices appear.
    for _ in 0..50 {
        if from_b().as_deref() == Some("hello from b1") {
            break;
        }
        sleep_s(0.2);
    }
    let (a, b) = (&pods.a, &pods.b);
    assert!(from_b().as_deref() == Some("hello from b1"), "Service web-b ({bcip}:80) from a2 on {a} to b1 on {b}");
    pass(&format!("Service ClusterIP across nodes: a2 -> web-b {bcip}:80 -> b1"));
    for _ in 0..50 {
        if http_get(smoke, "a2", &cip, "80").is_some_and(|answer| answer.contains("hello")) {
            break;
        }
        sleep_s(0.2);
    }
    let answers: Vec<Option<String>> = (0..REQUESTS).map(|_| http_get(smoke, "a2", &cip, "80")).collect();
    let tally = Tally::of(&answers);
    let seen = tally.seen();
    assert!(!tally.others(&["hello from a1", "hello from b1"]), "Service web answered something else: {seen}");
    assert!(tally.answered() == REQUESTS, "Service web: not all {REQUESTS} requests answered: {seen}");
    pass(&format!("Service ClusterIP load-balances: {REQUESTS} requests to {cip}:80 -> {seen}"));

    let ksvc = kubectl(&["get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
    let out = smoke.exec("a1", &["sh", "-c", &format!("echo | nc -w 3 {ksvc} 443 >/dev/null")]);
    assert!(out.ok, "kubernetes Service {ksvc}:443 unreachable from a pod");
    pass(&format!("kubernetes Service {ksvc}:443 reachable from a pod"));
}
