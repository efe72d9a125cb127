//! The watches that feed the controller. Each watched resource has one typed description, a [`Watched`]
//! implementation (in `watch_kinds.rs`): how to watch it, how to key its objects and what an apply or a delete does
//! to the controller. Every watch forwards its events, unchanged, into one channel, so that a single task owns the
//! index and sees events in order per kind.

use std::fmt;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Controller;
use crate::api::StoredLink;
use crate::index::ObjectKey;

/// The watched resources. The agents are pods too, but their own watch (selected by label, possibly in one
/// namespace) with their own meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WatchKind {
    Link,
    Pod,
    Namespace,
    Service,
    Agent,
    Node,
    /// ConfigMaps labelled `isthmus.dev/trace` (replayed traces).
    TraceMap,
}

impl WatchKind {
    /// Every kind: the watches started, and the ones readiness waits for.
    pub const ALL: [WatchKind; 7] = [
        WatchKind::Link,
        WatchKind::Pod,
        WatchKind::Namespace,
        WatchKind::Service,
        WatchKind::Agent,
        WatchKind::Node,
        WatchKind::TraceMap,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            WatchKind::Link => "networklinks",
            WatchKind::Pod => "pods",
            WatchKind::Namespace => "namespaces",
            WatchKind::Service => "services",
            WatchKind::Agent => "agents",
            WatchKind::Node => "nodes",
            WatchKind::TraceMap => "trace configmaps",
        }
    }
}

impl fmt::Display for WatchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One watch event, tagged with its kind.
#[derive(Debug)]
pub enum Update {
    /// Boxed: a NetworkLink with its status is several times the size of the other events.
    Link(Box<Event<StoredLink>>),
    Pod(Event<Pod>),
    Namespace(Event<Namespace>),
    Service(Event<Service>),
    Agent(Event<Pod>),
    Node(Event<PartialObjectMeta<Node>>),
    TraceMap(Event<ConfigMap>),
}

impl Update {
    pub fn kind(&self) -> WatchKind {
        match self {
            Update::Link(_) => WatchKind::Link,
            Update::Pod(_) => WatchKind::Pod,
            Update::Namespace(_) => WatchKind::Namespace,
            Update::Service(_) => WatchKind::Service,
            Update::Agent(_) => WatchKind::Agent,
            Update::Node(_) => WatchKind::Node,
            Update::TraceMap(_) => WatchKind::TraceMap,
        }
    }
}

/// Where the agents run.
#[derive(Debug, Clone)]
pub struct AgentSelector {
    pub namespace: Option<String>,
    pub labels: String,
}

/// The typed description of one watched resource.
pub(super) trait Watched {
    const KIND: WatchKind;
    type Object: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + 'static;

    /// What to watch: by default every object of the kind.
    fn api(client: &Client, _agents: &AgentSelector) -> (Api<Self::Object>, watcher::Config) {
        (Api::all(client.clone()), watcher::Config::default())
    }
    /// The event as it travels to the controller.
    fn update(event: Event<Self::Object>) -> Update;
    /// Namespace and name; a cluster-scoped object has the empty namespace.
    fn key(object: &Self::Object) -> ObjectKey {
        ObjectKey::new(object.namespace().unwrap_or_default(), object.name_any())
    }
    /// An object was added or changed.
    fn upsert(c: &mut Controller, object: Self::Object);
    /// An object is gone: deleted, or missing from a re-list.
    fn delete(c: &mut Controller, key: &ObjectKey);
    /// The keys the controller holds of this kind, to find the ones a re-list no longer has.
    fn known(c: &Controller) -> Vec<ObjectKey>;
}

/// Starts the watch of one resource; it runs until the set is dropped or the receiver closes.
pub(super) fn spawn<W: Watched>(
    set: &mut JoinSet<()>,
    client: &Client,
    agents: &AgentSelector,
    tx: mpsc::Sender<Update>,
) {
    let (api, config) = W::api(client, agents);
    let stream = watcher(api, config).default_backoff();
    set.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if tx.send(W::update(event)).await.is_err() {
                        return;
                    }
                }
                // The stream retries with backoff on its own; the error is only worth a log line, and only its
                // start: a decode error's text can carry a whole list of every tenant's objects.
                Err(e) => {
                    let error: String = e.to_string().chars().take(300).collect();
                    tracing::warn!(watch = %W::KIND, %error, "watch error; retrying")
                }
            }
        }
    });
}
