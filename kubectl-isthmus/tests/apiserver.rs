//! `kubectl isthmus` against a real kube-apiserver: the binary lists links with their status as the server
//! stores them and explains a pair from the objects it lists. A control plane has no kubelet, so the pods'
//! status (Running, IPs) is written through the status subresource, as a kubelet would.
//!
//! Ignored by default; `make operator-it` runs it:
//! ```sh
//! export ISTHMUS_CLUSTER_NAME=plugin-it
//! e2e/cluster/cluster up --control-plane-only
//! KUBECONFIG=$(e2e/cluster/cluster kubeconfig) cargo test -p kubectl-isthmus --test apiserver -- --ignored
//! e2e/cluster/cluster down
//! ```

use std::process::Command;
use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const MANAGER: &str = "kubectl-isthmus-it";

/// The NetworkLink CRD applied and Established.
async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(MANAGER).force();
    for crd in [isthmus_operator::api::crd()] {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(&name, &params, &Patch::Apply(crd)).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let conditions = crds.get(&name).await.unwrap().status.and_then(|s| s.conditions);
            if conditions.unwrap_or_default().iter().any(|c| c.type_ == "Established" && c.status == "True") {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the CRD {name} is not Established after 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn create<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    match api.create(&PostParams::default(), &object).await {
        Ok(o) => o,
        Err(kube::Error::Api(s)) if s.code == 409 => object,
        Err(e) => panic!("creating {object:?}: {e}"),
    }
}

/// A pod bound to `node` and reported Running with `ip`, as the kubelet would report it.
async fn running_pod(pods: &Api<Pod>, name: &str, app: &str, node: &str, ip: &str) {
    create(
        pods,
        json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "example.invalid/none"}]},
        }),
    )
    .await;
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

fn plugin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-isthmus")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[tokio::test]
#[ignore = "needs a kube-apiserver (KUBECONFIG); run by make operator-it"]
async fn links_and_explain_against_a_real_api_server() {
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG) for a running kube-apiserver");
    install_crds(&client).await;
    let ns = format!("plugin-it-{}", std::process::id());
    create(&Api::<Namespace>::all(client.clone()), json!({"metadata": {"name": ns}})).await;
    // Pods bound to a node that does not exist are garbage-collected by the controller-manager.
    create(&Api::<Node>::all(client.clone()), json!({"metadata": {"name": "plugin-it-node"}})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    running_pod(&pods, "client", "client", "plugin-it-node", "10.244.7.1").await;
    running_pod(&pods, "server", "server", "plugin-it-node", "10.244.7.9").await;

    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);
    let link = |name: &str, priority: i32, latency: &str| {
        json!({
            "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink",
            "metadata": {"name": name},
            "spec": {
                "from": {"podSelector": {"matchLabels": {"app": "client"}}},
                "to": {"podSelector": {"matchLabels": {"app": "server"}}},
                "priority": priority,
                "impairment": {"latency": latency},
            },
        })
    };
    create(&links, link("baseline", 0, "5ms")).await;
    create(&links, link("slow-api", 5, "40ms")).await;
    let status = json!({"status": {
        "pairs": 1, "pairsApplied": 1,
        "measured": {"forward": {"rttP50": "40.4ms", "rttP90": "41.2ms", "loss": "0%", "samples": 300, "pairs": 1}},
        "conditions": [{"type": "Conformant", "status": "True", "reason": "Conformant", "message": "within tolerance",
                        "lastTransitionTime": "2026-11-25T00:00:00Z"}],
    }});
    links.patch_status("slow-api", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();

    let (ok, out, err) = plugin(&["links", "-n", &ns]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].starts_with("NAME") && rows[0].contains("MEASURED-RTT"), "{out}");
    assert!(rows[1].starts_with("baseline ") && rows[1].ends_with("0/0"), "{out}");
    let slow = rows[2];
    for cell in ["slow-api", "40ms", "40.4ms (p90 41.2ms)", "True", "1/1"] {
        assert!(slow.contains(cell), "{cell} missing from {slow}");
    }

    let (ok, out, err) = plugin(&["explain", "client", "server", "-n", &ns, "--no-agent"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("Decided by:  NetworkLink {ns}/slow-api (forward), entry 10.244.7.9/32")), "{out}");
    assert!(out.contains("lost: priority 0 < 5"), "{out}");
    assert!(out.contains("Node:        plugin-it-node"), "{out}");
    assert!(out.contains("forward: RTT p50 40.4ms p90 41.2ms"), "{out}");

    // Asking the agent: there is none on the node, and the answer says so instead of failing.
    let (ok, out, err) = plugin(&["explain", "client", "10.244.7.9", "-n", &ns]);
    assert!(ok, "{err}");
    let expected = "Not asked: no running agent pod (app.kubernetes.io/name=isthmus-agent) on node plugin-it-node";
    assert!(out.contains(expected), "{out}");

    // The errors name what is wrong.
    let (ok, _, err) = plugin(&["explain", "nope", "server", "-n", &ns, "--no-agent"]);
    assert!(!ok && err.contains(&format!("unknown pod {ns}/nope")), "{err}");
    let (ok, _, err) = plugin(&["explain", "client", "192.0.2.1", "-n", &ns, "--no-agent"]);
    assert!(!ok && err.contains("no NetworkLink decides the pair"), "{err}");
    // A pod of another namespace is found by its name there (and this link does not cover it).
    let other = format!("{ns}-other");
    create(&Api::<Namespace>::all(client.clone()), json!({"metadata": {"name": other}})).await;
    running_pod(&Api::namespaced(client.clone(), &other), "db", "server", "plugin-it-node", "10.244.8.5").await;
    let (ok, _, err) = plugin(&["explain", "client", &format!("{other}/db"), "-n", &ns, "--no-agent"]);
    assert!(!ok && err.contains("no NetworkLink decides the pair") && err.contains("10.244.8.5"), "{err}");
    let (ok, _, err) = plugin(&["explain", "server", "client", "-n", &ns, "--no-agent"]);
    assert!(!ok && err.contains("no NetworkLink shapes the egress of pod"), "{err}");
}
