//! The typed description of each watched resource ([`Watched`]): what is watched, how its objects are keyed,
//! and what an apply or a delete does to the controller. Adding a resource means a [`WatchKind`], an [`Update`]
//! variant and a description here; the matches below do not compile until all three exist.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Controller;
use super::watch::{AgentSelector, Update, WatchKind, Watched, spawn};
use crate::api::StoredLink;
use crate::index::ObjectKey;

struct Links;
struct Pods;
struct Namespaces;
struct Services;
struct Agents;
struct Nodes;
struct TraceMaps;

/// Starts every watch; they run until the returned set is dropped or the receiver closes.
pub(super) fn start(client: &Client, agents: &AgentSelector, tx: mpsc::Sender<Update>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for kind in WatchKind::ALL {
        let tx = tx.clone();
        match kind {
            WatchKind::Link => spawn::<Links>(&mut set, client, agents, tx),
            WatchKind::Pod => spawn::<Pods>(&mut set, client, agents, tx),
            WatchKind::Namespace => spawn::<Namespaces>(&mut set, client, agents, tx),
            WatchKind::Service => spawn::<Services>(&mut set, client, agents, tx),
            WatchKind::Agent => spawn::<Agents>(&mut set, client, agents, tx),
            WatchKind::Node => spawn::<Nodes>(&mut set, client, agents, tx),
            WatchKind::TraceMap => spawn::<TraceMaps>(&mut set, client, agents, tx),
        }
    }
    set
}

impl Controller {
    pub(super) fn apply(&mut self, update: Update) {
        match update {
            Update::Link(e) => self.on_event::<Links>(*e),
            Update::Pod(e) => self.on_event::<Pods>(e),
            Update::Namespace(e) => self.on_event::<Namespaces>(e),
            Update::Service(e) => self.on_event::<Services>(e),
            Update::Agent(e) => self.on_event::<Agents>(e),
            Update::Node(e) => self.on_event::<Nodes>(e),
            Update::TraceMap(e) => self.on_event::<TraceMaps>(e),
        }
    }
}

impl Watched for Links {
    const KIND: WatchKind = WatchKind::Link;
    type Object = StoredLink;

    fn update(event: Event<StoredLink>) -> Update {
        Update::Link(Box::new(event))
    }
    fn upsert(c: &mut Controller, object: StoredLink) {
        c.upsert_link(Self::key(&object), object)
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.delete_link(key)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.links.keys().cloned().collect()
    }
}

impl Watched for Pods {
    const KIND: WatchKind = WatchKind::Pod;
    type Object = Pod;

    fn update(event: Event<Pod>) -> Update {
        Update::Pod(event)
    }
    fn upsert(c: &mut Controller, object: Pod) {
        c.planner.apply_pod(&object);
        let key = Self::key(&object);
        if c.planner.index().gates.contains_key(&key) {
            c.gates.pods.insert(key);
        }
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.planner.delete_pod(key);
        c.gates.forget(key);
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.planner.index().pods.keys().cloned().collect()
    }
}

impl Watched for Namespaces {
    const KIND: WatchKind = WatchKind::Namespace;
    type Object = Namespace;

    fn update(event: Event<Namespace>) -> Update {
        Update::Namespace(event)
    }
    fn upsert(c: &mut Controller, object: Namespace) {
        c.planner.apply_namespace(&object)
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.planner.delete_namespace(&key.name)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.planner.index().namespaces.keys().map(|n| ObjectKey::new("", n)).collect()
    }
}

impl Watched for Services {
    const KIND: WatchKind = WatchKind::Service;
    type Object = Service;

    fn update(event: Event<Service>) -> Update {
        Update::Service(event)
    }
    fn upsert(c: &mut Controller, object: Service) {
        c.planner.apply_service(&object)
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.planner.delete_service(key)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.planner.index().services.keys().cloned().collect()
    }
}

impl Watched for Agents {
    const KIND: WatchKind = WatchKind::Agent;
    type Object = Pod;

    fn api(client: &Client, agents: &AgentSelector) -> (Api<Pod>, watcher::Config) {
        let api = match &agents.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        (api, watcher::Config::default().labels(&agents.labels))
    }
    fn update(event: Event<Pod>) -> Update {
        Update::Agent(event)
    }
    fn upsert(c: &mut Controller, object: Pod) {
        c.upsert_agent(Self::key(&object), &object)
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.delete_agent(key)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.agents.keys().cloned().collect()
    }
}

impl Watched for Nodes {
    const KIND: WatchKind = WatchKind::Node;
    type Object = PartialObjectMeta<Node>;

    fn update(event: Event<PartialObjectMeta<Node>>) -> Update {
        Update::Node(event)
    }
    fn upsert(c: &mut Controller, object: PartialObjectMeta<Node>) {
        c.upsert_node(object.name_any())
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.delete_node(&key.name)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.nodes.iter().map(|n| ObjectKey::new("", n)).collect()
    }
}

impl Watched for TraceMaps {
    const KIND: WatchKind = WatchKind::TraceMap;
    type Object = ConfigMap;

    fn api(client: &Client, _agents: &AgentSelector) -> (Api<ConfigMap>, watcher::Config) {
        (Api::all(client.clone()), watcher::Config::default().labels(crate::schedule::TRACE_LABEL))
    }
    fn update(event: Event<ConfigMap>) -> Update {
        Update::TraceMap(event)
    }
    fn upsert(c: &mut Controller, object: ConfigMap) {
        c.planner.apply_trace_map(&object)
    }
    fn delete(c: &mut Controller, key: &ObjectKey) {
        c.planner.delete_trace_map(key)
    }
    fn known(c: &Controller) -> Vec<ObjectKey> {
        c.planner.index().traces.keys().cloned().collect()
    }
}
