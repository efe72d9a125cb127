//! The world's API objects: Nodes, the agents' pods (as the DaemonSet would make them), the benchmark's pods
//! and its links. No kubelet runs: each pod is bound to its node by name, and its status (running, ready, its
//! address) is written here, as a kubelet would write it.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use isthmus_operator::api::{ImpairmentSpec, NetworkLink, NetworkLinkSpec};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec, PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::shape::Shape;

/// API calls in flight at once while the world is made.
const CONCURRENT_CALLS: usize = 16;
/// The label the agent pods carry (the operator's default agent selector).
const AGENT_LABEL: (&str, &str) = ("app.kubernetes.io/name", "isthmus-agent");
/// Never pulled: no kubelet runs.
const AGENT_IMAGE: &str = "isthmus-agent:harness";
/// The label that puts a pod in its group.
const GROUP_LABEL: &str = "group";

/// Where the world's objects go.
#[derive(Debug, Clone)]
pub struct Places {
    /// The benchmark's pods and links.
    pub namespace: String,
    pub agent_namespace: String,
    pub agent_service_account: String,
}

/// An agent pod as made: its node's index and its UID (its pod-bound token names both).
#[derive(Debug, Clone)]
pub struct AgentPod {
    pub node: u32,
    pub name: String,
    pub uid: String,
}

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        ..Default::default()
    }
}

/// Writes a running, ready pod's status, as its kubelet would.
async fn run_pod(api: &Api<Pod>, name: &str, ip: std::net::Ipv4Addr) -> kube::Result<Pod> {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip.to_string(),
        "podIPs": [{"ip": ip.to_string()}],
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await
}

/// A pod bound to `node` (none: a DaemonSet's template).
fn pod(meta: ObjectMeta, node: Option<String>, service_account: Option<String>, image: &str) -> Pod {
    Pod {
        metadata: meta,
        spec: Some(PodSpec {
            node_name: node,
            service_account_name: service_account,
            containers: vec![Container { name: "main".into(), image: Some(image.into()), ..Default::default() }],
            // The node lifecycle controller taints nodes whose kubelet never reports (none does here) and would
            // evict their pods some minutes later.
            tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The namespaces, the Nodes and the agents' pods (running and ready at their loopback addresses), under the
/// agents' ServiceAccount (which the chart's RBAC made).
pub async fn nodes_and_agents(client: &Client, places: &Places, shape: &Shape) -> kube::Result<Vec<AgentPod>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&places.namespace, &places.agent_namespace] {
        match namespaces
            .create(&PostParams::default(), &Namespace { metadata: meta(ns, &[]), ..Default::default() })
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let daemonset = agent_daemonset(client, places).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &places.agent_namespace);
    futures::stream::iter(0..shape.nodes())
        .map(|n| {
            let (nodes, pods, owner) = (nodes.clone(), pods.clone(), daemonset.clone());
            let account = places.agent_service_account.clone();
            async move {
                let node = Node { metadata: meta(&Shape::node_name(n), &[]), ..Default::default() };
                nodes.create(&PostParams::default(), &node).await?;
                let name = Shape::agent_pod_name(n);
                let mut metadata = meta(&name, &[AGENT_LABEL]);
                metadata.owner_references = Some(vec![owner]);
                let made = pods
                    .create(
                        &PostParams::default(),
                        &pod(metadata, Some(Shape::node_name(n)), Some(account), AGENT_IMAGE),
                    )
                    .await?;
                run_pod(&pods, &name, Shape::agent_ip(n)).await?;
                Ok(AgentPod { node: n, name, uid: made.uid().unwrap_or_default() })
            }
        })
        .buffer_unordered(CONCURRENT_CALLS)
        .try_collect()
        .await
}

/// The agents' DaemonSet, which the agent pods name as their controller (the operator signs certificates for
/// its pods only); the control plane runs no DaemonSet controller, so it makes no pods of its own.
async fn agent_daemonset(client: &Client, places: &Places) -> kube::Result<OwnerReference> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &places.agent_namespace);
    let labels = BTreeMap::from([(AGENT_LABEL.0.to_owned(), AGENT_LABEL.1.to_owned())]);
    let template = pod(meta("", &[AGENT_LABEL]), None, Some(places.agent_service_account.clone()), AGENT_IMAGE);
    let daemonset = DaemonSet {
        metadata: meta("isthmus-agent", &[AGENT_LABEL]),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector { match_labels: Some(labels), match_expressions: None },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: template.metadata.labels, ..Default::default() }),
                spec: template.spec,
            },
            ..Default::default()
        }),
        status: None,
    };
    let made = api.create(&PostParams::default(), &daemonset).await?;
    Ok(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: made.name_any(),
        uid: made.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// The benchmark's pods, running and ready at their addresses.
pub async fn pods(client: &Client, places: &Places, shape: &Shape) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &places.namespace);
    futures::stream::iter(0..shape.pods())
        .map(|i| {
            let api = api.clone();
            async move {
                let name = Shape::pod_name(i);
                let group = shape.group_of_pod(i);
                let made = pod(
                    meta(&name, &[(GROUP_LABEL, &group)]),
                    Some(Shape::node_name(shape.node_of_pod(i))),
                    None,
                    "app:harness",
                );
                api.create(&PostParams::default(), &made).await?;
                run_pod(&api, &name, Shape::pod_ip(i)).await.map(drop)
            }
        })
        .buffer_unordered(CONCURRENT_CALLS)
        .try_collect()
        .await
}

/// Link `k` of the shape: its sources' group to its destinations' group, 10 ms one way.
pub fn link(shape: &Shape, namespace: &str, k: u32) -> NetworkLink {
    let (from, to) = shape.link_groups(k);
    let group = |g: String| LabelSelector {
        match_labels: Some(BTreeMap::from([(GROUP_LABEL.to_owned(), g)])),
        match_expressions: None,
    };
    let latency = ImpairmentSpec { latency: Some("10ms".into()), ..Default::default() };
    let mut link = NetworkLink::new(&Shape::link_name(k), NetworkLinkSpec::between(group(from), group(to), latency));
    link.metadata.namespace = Some(namespace.to_owned());
    link
}

pub async fn create_link(client: &Client, link: &NetworkLink) -> kube::Result<NetworkLink> {
    let api: Api<NetworkLink> = Api::namespaced(client.clone(), link.metadata.namespace.as_deref().unwrap_or_default());
    api.create(&PostParams::default(), link).await
}
