//! The I/O shell around [`expand`](super::expand) and [`status`](super::status): watches topologies and the
//! NetworkLinks they own, and while this replica leads, makes each topology's links what its spec says
//! (creating, putting hand edits back, deleting links of regions that are gone) and writes its status.
//! Deleting a topology deletes its links through their owner references (the garbage collector).
//!
//! An invalid spec leaves the links of the last valid one in force and says why in the status: an edit the
//! code cannot represent never takes the network away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use super::expand::{Child, TOPOLOGY_LABEL, expand};
use super::patch::merge_diff;
use super::spec::NetworkTopology;
use super::status::{ChildState, StatusInput, topology_status};
use crate::api::NetworkLink;
use crate::clock::now_seconds;

/// How often every topology is checked even without an event (repairs what a lost event or write left).
const RESYNC: Duration = Duration::from_secs(30);
/// The field manager of the status the reconciler writes.
pub const FIELD_MANAGER: &str = "isthmus-topology";

/// A topology by namespace and name.
type Key = (String, String);

/// Runs until `shutdown` turns true.
pub async fn run(client: Client, leader: watch::Receiver<bool>, mut shutdown: watch::Receiver<bool>) {
    let (topologies, topology_writer) = reflector::store::<NetworkTopology>();
    let (links, link_writer) = reflector::store::<NetworkLink>();
    let topology_events =
        reflector::reflector(topology_writer, watcher(Api::all(client.clone()), watcher::Config::default()))
            .default_backoff()
            .touched_objects()
            .map(|r| r.ok().map(|t: NetworkTopology| (t.namespace().unwrap_or_default(), t.name_any())));
    let labelled = watcher::Config::default().labels(TOPOLOGY_LABEL);
    let link_events = reflector::reflector(link_writer, watcher(Api::all(client.clone()), labelled))
        .default_backoff()
        .touched_objects()
        .map(|r| {
            r.ok().and_then(|l: NetworkLink| {
                Some((l.namespace().unwrap_or_default(), l.labels().get(TOPOLOGY_LABEL)?.clone()))
            })
        });
    let mut events = std::pin::pin!(futures::stream::select(topology_events, link_events));
    let r = Reconciler { client, topologies: topologies.clone(), links: links.clone() };
    let mut leader = leader;
    let mut dirty: BTreeSet<Key> = BTreeSet::new();
    let mut synced = false;
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            changed = leader.changed() => {
                if changed.is_err() { break }
                dirty.extend(r.all());
            }
            event = events.next() => {
                let Some(event) = event else { break };
                dirty.extend(event);
                // Take what else is already there: one pass for a burst of child status updates.
                while let Some(Some(more)) = events.next().now_or_never() {
                    dirty.extend(more);
                }
            }
            _ = resync.tick() => dirty.extend(r.all()),
        }
        if !synced {
            synced = topologies.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
                && links.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok());
            if synced {
                dirty.extend(r.all());
            }
        }
        if !synced || !*leader.borrow() {
            continue;
        }
        for key in std::mem::take(&mut dirty) {
            if let Err(e) = r.reconcile(&key).await {
                tracing::warn!(namespace = %key.0, topology = %key.1, error = %e, "reconciling a NetworkTopology");
                // The next resync tries again.
            }
        }
    }
    tracing::info!("topology reconciler stopped");
}

struct Reconciler {
    client: Client,
    topologies: Store<NetworkTopology>,
    links: Store<NetworkLink>,
}

impl Reconciler {
    fn all(&self) -> Vec<Key> {
        self.topologies.state().iter().map(|t| (t.namespace().unwrap_or_default(), t.name_any())).collect()
    }

    /// Makes one topology's links what its spec says and writes its status.
    async fn reconcile(&self, (ns, name): &Key) -> Result<(), kube::Error> {
        let Some(topology) = self.topologies.get(&reflector::ObjectRef::new(name).within(ns)) else {
            return Ok(()); // deleted: the garbage collector deletes its links
        };
        if topology.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let expansion = expand(name, &topology.spec);
        let owned: BTreeMap<String, Arc<NetworkLink>> = self
            .links
            .state()
            .into_iter()
            .filter(|l| l.namespace().as_deref() == Some(ns) && l.labels().get(TOPOLOGY_LABEL) == Some(name))
            .map(|l| (l.name_any(), l))
            .collect();
        let api: Api<NetworkLink> = Api::namespaced(self.client.clone(), ns);
        let mut children = BTreeMap::new();
        let mut taken = Vec::new();
        let mut refused = Vec::new();
        if let Ok(exp) = &expansion {
            for child in &exp.children {
                match self.ensure(&api, &topology, child, owned.get(&child.name)).await {
                    Ok(Some(state)) => {
                        children.insert(child.name.clone(), state);
                    }
                    Ok(None) => taken.push(child.name.clone()),
                    Err(e) => {
                        tracing::warn!(link = %child.name, error = %e, "writing a topology's NetworkLink");
                        if let kube::Error::Api(answer) = &e {
                            refused.push((child.name.clone(), answer.message.clone()));
                        }
                        children.insert(child.name.clone(), ChildState::default());
                    }
                }
            }
            let wanted: BTreeSet<&String> = exp.children.iter().map(|c| &c.name).collect();
            for stale in owned.keys().filter(|n| !wanted.contains(n)) {
                match api.delete(stale, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => tracing::warn!(link = %stale, error = %e, "deleting a link the topology no longer has"),
                }
            }
        }
        let status = topology_status(&StatusInput {
            generation: topology.metadata.generation,
            expansion: expansion.as_ref(),
            children: &children,
            taken: &taken,
            refused: &refused,
            previous: topology.status.as_ref(),
            now: &now_seconds(),
        });
        if topology.status.as_ref().is_some_and(|s| same_status(s, &status)) {
            return Ok(());
        }
        let body = json!({
            "apiVersion": NetworkTopology::api_version(&()),
            "kind": NetworkTopology::kind(&()),
            "status": status,
        });
        let topologies: Api<NetworkTopology> = Api::namespaced(self.client.clone(), ns);
        topologies.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
        Ok(())
    }

    /// Creates or repairs one link; `None` when its name belongs to a link that is not this topology's.
    async fn ensure(
        &self,
        api: &Api<NetworkLink>,
        topology: &NetworkTopology,
        child: &Child,
        existing: Option<&Arc<NetworkLink>>,
    ) -> Result<Option<ChildState>, kube::Error> {
        let owner = topology.controller_owner_ref(&()).expect("a stored topology has a uid");
        let labels = child.labels(&topology.name_any());
        let current = match existing {
            Some(l) => (**l).clone(),
            None => {
                let mut link = NetworkLink::new(&child.name, child.spec.clone());
                link.metadata.labels = Some(labels.clone());
                link.metadata.owner_references = Some(vec![owner.clone()]);
                match api.create(&PostParams::default(), &link).await {
                    Ok(created) => return Ok(Some(state(&created, true))),
                    Err(kube::Error::Api(s)) if s.code == 409 => api.get(&child.name).await?,
                    Err(e) => return Err(e),
                }
            }
        };
        let topologies_own =
            current.owner_references().iter().any(|o| o.kind == "NetworkTopology" && o.name == owner.name);
        if !topologies_own && current.labels().get(TOPOLOGY_LABEL) != Some(&owner.name) {
            return Ok(None);
        }
        let have = json!({"metadata": {"labels": current.labels(), "ownerReferences": current.owner_references()}, "spec": current.spec});
        let mut all_labels = current.labels().clone();
        all_labels.extend(labels);
        let want = json!({"metadata": {"labels": all_labels, "ownerReferences": [owner]}, "spec": child.spec});
        let Some(patch) = merge_diff(&have, &want) else { return Ok(Some(state(&current, true))) };
        let patched = api.patch(&child.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(Some(state(&patched, patched.spec == child.spec)))
    }
}

fn state(link: &NetworkLink, in_sync: bool) -> ChildState {
    ChildState { in_sync, status: link.status.clone(), generation: link.metadata.generation }
}

/// Equal but for the conditions' transition times, which a rewrite would only move.
fn same_status(a: &super::NetworkTopologyStatus, b: &super::NetworkTopologyStatus) -> bool {
    let strip = |s: &super::NetworkTopologyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time =
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}
