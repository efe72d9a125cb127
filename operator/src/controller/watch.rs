//! The watches that feed the index: each forwards its events, unchanged, into one channel so that a single task
//! owns the index and sees events in order per kind.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watcher;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::api::NetworkLink;

/// One watch event, tagged with its kind.
#[derive(Debug)]
pub enum Update {
    Link(Event<NetworkLink>),
    Pod(Event<Pod>),
    Namespace(Event<Namespace>),
    Service(Event<Service>),
    Agent(Event<Pod>),
    Node(Event<PartialObjectMeta<Node>>),
}

/// Where the agents run.
#[derive(Debug, Clone)]
pub struct AgentSelector {
    pub namespace: Option<String>,
    pub labels: String,
}

fn forward<K, S>(
    set: &mut JoinSet<()>,
    stream: S,
    wrap: fn(Event<K>) -> Update,
    tx: mpsc::Sender<Update>,
    what: &'static str,
) where
    K: Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    set.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if tx.send(wrap(event)).await.is_err() {
                        return;
                    }
                }
                // The stream retries with backoff on its own; the error is only worth a log line.
                Err(e) => tracing::warn!(watch = what, error = %e, "watch error; retrying"),
            }
        }
    });
}

/// Starts every watch; they run until the returned set is dropped or the receiver closes.
pub fn start(client: &Client, agents: &AgentSelector, tx: mpsc::Sender<Update>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let cfg = watcher::Config::default;
    forward(
        &mut set,
        watcher(Api::<NetworkLink>::all(client.clone()), cfg()).default_backoff(),
        Update::Link,
        tx.clone(),
        "networklinks",
    );
    forward(
        &mut set,
        watcher(Api::<Pod>::all(client.clone()), cfg()).default_backoff(),
        Update::Pod,
        tx.clone(),
        "pods",
    );
    forward(
        &mut set,
        watcher(Api::<Namespace>::all(client.clone()), cfg()).default_backoff(),
        Update::Namespace,
        tx.clone(),
        "namespaces",
    );
    forward(
        &mut set,
        watcher(Api::<Service>::all(client.clone()), cfg()).default_backoff(),
        Update::Service,
        tx.clone(),
        "services",
    );
    let agent_api: Api<Pod> = match &agents.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    forward(
        &mut set,
        watcher(agent_api, cfg().labels(&agents.labels)).default_backoff(),
        Update::Agent,
        tx.clone(),
        "agents",
    );
    forward(
        &mut set,
        watcher(Api::<PartialObjectMeta<Node>>::all(client.clone()), cfg()).default_backoff(),
        Update::Node,
        tx,
        "nodes",
    );
    set
}

/// How many watches [`start`] runs; readiness waits for each to finish its first list.
pub const WATCHES: usize = 6;
