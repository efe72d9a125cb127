//! NetworkLink objects: what the controller remembers of each besides the index (for status writes and
//! finalizers), and where a deletion hands the link over to its cleanup.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use super::Controller;
use super::finalizer::FINALIZER;
use crate::api::{NetworkLinkStatus, StoredLink};
use crate::index::ObjectKey;

/// What the controller remembers of a NetworkLink object besides the index.
#[derive(Debug, Clone)]
pub(super) struct LinkMeta {
    pub(super) resource_version: Option<String>,
    pub(super) finalizers: Vec<String>,
    pub(super) deleting: bool,
    /// The status on the server, as last seen.
    pub(super) status: Option<NetworkLinkStatus>,
    pub(super) reference: ObjectReference,
}

impl Controller {
    /// A link added or changed. One that cannot be read (see [`StoredLink`]) gets nothing planned, since what it
    /// asked before is no longer what it says; its status names the field; a deletion still waits for the
    /// cleanup of what its earlier version had installed.
    pub(super) fn upsert_link(&mut self, key: ObjectKey, stored: StoredLink) {
        let deleting = stored.metadata.deletion_timestamp.is_some();
        let has_finalizer = stored.finalizers().iter().any(|f| f == FINALIZER);
        self.links.insert(
            key.clone(),
            LinkMeta {
                resource_version: stored.resource_version(),
                finalizers: stored.finalizers().to_vec(),
                deleting,
                status: stored.status.clone(),
                reference: stored.object_ref(&()),
            },
        );
        let link = match stored.decoded {
            Ok(link) => {
                self.unreadable.remove(&key);
                Some(link)
            }
            Err(why) => {
                tracing::warn!(link = %key, field = %why.path, reason = %why.reason, "NetworkLink cannot be read; nothing is applied for it");
                self.unreadable.insert(key.clone(), (stored.metadata.generation, why));
                None
            }
        };
        if !deleting {
            match &link {
                Some(link) => self.planner.apply_link(link),
                None => self.planner.delete_link(&key),
            }
            self.status.dirty.insert(key);
        } else if self.cleanups.contains_key(&key) || !has_finalizer {
            self.planner.delete_link(&key);
        } else {
            self.begin_cleanup(key, link.as_ref());
        }
    }

    pub(super) fn delete_link(&mut self, key: &ObjectKey) {
        self.planner.delete_link(key);
        self.links.remove(key);
        self.unreadable.remove(key);
        self.cleanups.remove(key);
        self.status.forget(key);
    }
}
