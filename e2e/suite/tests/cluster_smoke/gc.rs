//! Garbage collection by kube-controller-manager: a ConfigMap owned by another goes with its owner; a Deployment's
//! ReplicaSet and pod go with the Deployment.

use std::time::Instant;

use crate::{Smoke, apply, elapsed, pass, sleep_s};

/// Polls (every 0.2 s, 150 times: 30 s) until `kubectl -n NS ARGS` fails, i.e. the object is gone.
fn wait_gone(smoke: &Smoke, what: &str, args: &[&str]) {
    for _ in 0..150 {
        if !smoke.kn_raw(args).ok {
            return;
        }
        sleep_s(0.2);
    }
    panic!("{what} still exists 30 s after its owner was deleted");
}

pub fn garbage_collection(smoke: &Smoke) {
    let (ns, image) = (&smoke.ns, &smoke.image);
    smoke.kn(&["create", "configmap", "gc-owner", "--from-literal=k=v"]);
    let uid = smoke.kn(&["get", "configmap", "gc-owner", "-o", "jsonpath={.metadata.uid}"]);
    apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: gc-owned
  namespace: {ns}
  ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: gc-owner, uid: {uid}}}]
data: {{k: v}}
"#
    ));
    let t = Instant::now();
    smoke.kn(&["delete", "configmap", "gc-owner"]);
    wait_gone(smoke, "ConfigMap gc-owned", &["get", "configmap", "gc-owned"]);
    pass(&format!("garbage collection: owned ConfigMap deleted {} s after its owner", elapsed(t)));

    apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: gc-deploy, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: gc}}}}
  template:
    metadata: {{labels: {{app: gc}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{{name: main, image: {image}, imagePullPolicy: Never, command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}}]
"#
    ));
    smoke.kn(&["rollout", "status", "deploy/gc-deploy", "--timeout=90s"]);
    let rs = smoke.kn(&["get", "rs", "-l", "app=gc", "-o", "jsonpath={.items[0].metadata.name}"]);
    let rs = rs.trim();
    assert!(!rs.is_empty(), "Deployment gc-deploy has no ReplicaSet");
    let t = Instant::now();
    smoke.kn(&["delete", "deployment", "gc-deploy", "--wait=false"]);
    wait_gone(smoke, &format!("ReplicaSet {rs}"), &["get", "rs", rs]);
    let no_pods = || smoke.kn_raw(&["get", "pods", "-l", "app=gc", "-o", "name"]).stdout.trim().is_empty();
    for _ in 0..150 {
        if no_pods() {
            break;
        }
        sleep_s(0.2);
    }
    assert!(no_pods(), "pods of ReplicaSet {rs} outlived it");
    pass(&format!("garbage collection: Deployment -> ReplicaSet {rs} -> pod deleted in {} s", elapsed(t)));
}
