//! `isthmus-operator uninstall`: the chart's pre-delete hook. Deletes every NetworkLink in every namespace and
//! waits until all are gone, i.e. until the running operator's `isthmus.dev/cleanup` finalizer has removed their
//! impairments from every node. Runs in the operator's own image, so the hook needs no other image.
//!
//! The wait watches rather than polls, and a link created meanwhile is deleted as well: when this returns `Ok`,
//! no NetworkLink exists anywhere. NetworkTopologies are deleted first, or the operator would make their links
//! again. Before anything, the pods that declare the readiness gate are looked at ([`gated`]): by default their
//! presence refuses the uninstall.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt as _};

use crate::api::StoredLink;
use crate::controller::finalizer::INCOMPLETE_ANNOTATION;
use crate::gate::CONDITION_TYPE;
use crate::topology::NetworkTopology;

pub mod gated;

pub use gated::GatedPodsPolicy;
use gated::{GatedPod, Named, gated_pods, release_body};

/// The field manager of the condition the hook writes on released pods.
const FIELD_MANAGER: &str = "isthmus-uninstall";

/// Why the uninstall did not finish.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(
        "{} NetworkLink(s) still present after {}s: {}{}; is the isthmus operator running? \
         (without it, nothing removes the finalizers)",
        remaining.len(),
        timeout.as_secs(),
        Remaining(remaining),
        last_error.as_ref().map(|e| format!("; last API error: {e}")).unwrap_or_default()
    )]
    Timeout { timeout: Duration, remaining: BTreeMap<String, Vec<String>>, last_error: Option<String> },
    #[error(
        "could not list NetworkLinks within {}s: {}",
        timeout.as_secs(),
        last_error.as_deref().unwrap_or("no answer from the API server")
    )]
    NeverListed { timeout: Duration, last_error: Option<String> },
    #[error(
        "every NetworkLink is gone, but the operator gave up waiting for nodes to remove the impairments of {}: {}; \
         those pods may still be impaired: check those nodes' agents (`kubectl isthmus explain`), or delete the pods",
        incomplete.len(),
        Incomplete(incomplete)
    )]
    CleanupIncomplete { incomplete: BTreeMap<String, String> },
    #[error("the NetworkLink watch ended unexpectedly")]
    WatchEnded,
    #[error(
        "nothing was uninstalled: {} pod(s) declare the readiness gate {CONDITION_TYPE}: {}. Without isthmus nothing \
         sets that condition, so every pod made later from the same templates would never become Ready. Remove \
         the readiness gate from those workloads' pod templates (or delete them) and uninstall again, or set \
         uninstall.gatedPods=Release (`isthmus-operator uninstall --gated-pods release`) to mark these pods' \
         condition True on the way out",
        pods.len(),
        Named(pods)
    )]
    GatedPods { pods: Vec<GatedPod> },
    #[error(
        "every NetworkLink is gone, but {} gated pod(s) could not be released: {}; last error: {last_error}",
        pods.len(),
        Named(pods)
    )]
    ReleaseFailed { pods: Vec<GatedPod>, last_error: String },
    #[error("could not list pods within {}s: {last_error}", timeout.as_secs())]
    PodsNotListed { timeout: Duration, last_error: String },
}

/// What a successful uninstall did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uninstalled {
    /// NetworkLinks this run deleted.
    pub deleted: usize,
    /// Gated pods whose condition it set `True` (with [`GatedPodsPolicy::Release`]).
    pub released: usize,
}

/// Looks at the gated pods (refusing under [`GatedPodsPolicy::Refuse`] while any exists), deletes every
/// NetworkTopology and NetworkLink and waits, up to `timeout` in all, until none remains; under
/// [`GatedPodsPolicy::Release`] then marks the gated pods' condition `True`. Needs `list` on pods, and `patch` on
/// `pods/status` to release, besides what [`delete_all_and_wait`] needs.
pub async fn uninstall(
    client: Client,
    timeout: Duration,
    policy: GatedPodsPolicy,
) -> Result<Uninstalled, UninstallError> {
    let deadline = tokio::time::Instant::now() + timeout;
    if policy == GatedPodsPolicy::Refuse {
        let pods = list_gated(&client, deadline, timeout).await?;
        if !pods.is_empty() {
            return Err(UninstallError::GatedPods { pods });
        }
    }
    let deleted = delete_until(client.clone(), deadline, timeout).await?;
    let released = match policy {
        GatedPodsPolicy::Refuse => 0,
        GatedPodsPolicy::Release => release(&client, deadline, timeout).await?,
    };
    Ok(Uninstalled { deleted, released })
}

/// The gated pods of every namespace, listed again on API errors until the deadline.
async fn list_gated(
    client: &Client,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<Vec<GatedPod>, UninstallError> {
    let pods: Api<Pod> = Api::all(client.clone());
    loop {
        match pods.list(&Default::default()).await {
            Ok(list) => return Ok(gated_pods(&list.items)),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(UninstallError::PodsNotListed { timeout, last_error: e.to_string() });
            }
            Err(e) => tracing::warn!(error = %e, "listing pods; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sets the condition `True` on every gated pod whose condition is not; how many it set.
async fn release(client: &Client, deadline: tokio::time::Instant, timeout: Duration) -> Result<usize, UninstallError> {
    let pending: Vec<GatedPod> =
        list_gated(client, deadline, timeout).await?.into_iter().filter(|p| !p.released).collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut failed = Vec::new();
    let mut last_error = String::new();
    let mut released = 0;
    for pod in &pending {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
        match api.patch_status(&pod.name, &params, &Patch::Apply(release_body(pod, &now))).await {
            Ok(_) => {
                released += 1;
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), "released a gated pod");
            }
            // Gone, or replaced by a pod of the same name (refused by UID): nothing of this one is left to release.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                last_error = format!("{}/{}: {e}", pod.namespace, pod.name);
                failed.push(pod.clone());
            }
        }
    }
    if !failed.is_empty() {
        return Err(UninstallError::ReleaseFailed { pods: failed, last_error });
    }
    Ok(released)
}

/// `namespace/name (what its cleanup left)`, semicolon-separated.
struct Incomplete<'a>(&'a BTreeMap<String, String>);

impl fmt::Display for Incomplete<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, note)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{key} ({note})")?;
        }
        Ok(())
    }
}

/// `namespace/name (finalizers: a, b)`, comma-separated.
struct Remaining<'a>(&'a BTreeMap<String, Vec<String>>);

impl fmt::Display for Remaining<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, finalizers)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{key}")?;
            if !finalizers.is_empty() {
                write!(f, " (finalizers: {})", finalizers.join(", "))?;
            }
        }
        Ok(())
    }
}

/// Deletes every NetworkLink in every namespace and waits, up to `timeout`, until none remains. Needs only
/// `list`, `watch` and `delete` on `networklinks.isthmus.dev`. Transient API errors are retried until the
/// deadline; the timeout error names every link still present and the last API error. A link whose finalizer
/// the operator dropped after its cleanup wait ran out (its last state carries [`INCOMPLETE_ANNOTATION`]) makes
/// it fail too, naming the nodes and pods that may still be impaired.
pub async fn delete_all_and_wait(client: Client, timeout: Duration) -> Result<usize, UninstallError> {
    delete_until(client, tokio::time::Instant::now() + timeout, timeout).await
}

/// [`delete_all_and_wait`] up to `deadline`; `timeout` is what the errors name.
async fn delete_until(
    client: Client,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<usize, UninstallError> {
    // A topology would make its links again while the operator runs: topologies go first.
    delete_topologies(&client, deadline, timeout).await?;
    let links: Api<StoredLink> = Api::all(client.clone());
    let mut stream = std::pin::pin!(watcher(links, watcher::Config::default()).default_backoff());
    // Links present now, by `namespace/name`, with their finalizers.
    let mut present: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Links of a (re)list in progress; they replace `present` when it completes.
    let mut initial: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut synced = false;
    let mut deleted = 0usize;
    let mut last_error: Option<String> = None;
    let mut incomplete: BTreeMap<String, String> = BTreeMap::new();
    loop {
        if synced && present.is_empty() {
            if !incomplete.is_empty() {
                return Err(UninstallError::CleanupIncomplete { incomplete });
            }
            return Ok(deleted);
        }
        let event = tokio::select! {
            event = stream.next() => event.ok_or(UninstallError::WatchEnded)?,
            () = tokio::time::sleep_until(deadline) => {
                if !synced {
                    return Err(UninstallError::NeverListed { timeout, last_error });
                }
                return Err(UninstallError::Timeout { timeout, remaining: present, last_error });
            }
        };
        let link = match event {
            Ok(Event::Init) => {
                initial.clear();
                continue;
            }
            Ok(Event::InitDone) => {
                present = std::mem::take(&mut initial);
                synced = true;
                continue;
            }
            Ok(Event::InitApply(link)) => {
                initial.insert(key(&link), link.finalizers().to_vec());
                link
            }
            Ok(Event::Apply(link)) => {
                present.insert(key(&link), link.finalizers().to_vec());
                link
            }
            Ok(Event::Delete(link)) => {
                present.remove(&key(&link));
                match link.annotations().get(INCOMPLETE_ANNOTATION) {
                    Some(note) => {
                        tracing::error!(link = %key(&link), "NetworkLink gone, its cleanup incomplete: {note}");
                        incomplete.insert(key(&link), note.clone());
                    }
                    None => tracing::info!(link = %key(&link), "NetworkLink gone"),
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching NetworkLinks; retrying");
                last_error = Some(e.to_string());
                continue;
            }
        };
        if link.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let namespace = link.namespace().unwrap_or_default();
        let api: Api<StoredLink> = Api::namespaced(client.clone(), &namespace);
        match api.delete(&link.name_any(), &DeleteParams::background()).await {
            Ok(_) => {
                deleted += 1;
                tracing::info!(link = %key(&link), "NetworkLink deleted; waiting for its finalizer");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // The watch shows the link again (as an update or on a relist), so the delete is retried then.
            Err(e) => {
                tracing::warn!(link = %key(&link), error = %e, "deleting NetworkLink");
                last_error = Some(format!("deleting {}: {e}", key(&link)));
            }
        }
    }
}

/// Deletes every NetworkTopology (their links follow through the garbage collector, and the wait below). A
/// cluster without the NetworkTopology CRD has none.
async fn delete_topologies(
    client: &Client,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(), UninstallError> {
    let all: Api<NetworkTopology> = Api::all(client.clone());
    loop {
        let last_error = match all.list(&Default::default()).await {
            Ok(list) if list.items.is_empty() => return Ok(()),
            Ok(list) => {
                for t in list.items {
                    let api: Api<NetworkTopology> = Api::namespaced(client.clone(), &t.namespace().unwrap_or_default());
                    match api.delete(&t.name_any(), &DeleteParams::background()).await {
                        Ok(_) => tracing::info!(topology = %t.name_any(), "NetworkTopology deleted"),
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => tracing::warn!(topology = %t.name_any(), error = %e, "deleting NetworkTopology"),
                    }
                }
                "NetworkTopologies still present after deleting them".to_owned()
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(UninstallError::Timeout {
                timeout,
                remaining: BTreeMap::new(),
                last_error: Some(format!("deleting NetworkTopologies: {last_error}")),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn key(link: &StoredLink) -> String {
    format!("{}/{}", link.namespace().unwrap_or_default(), link.name_any())
}
