//! NetworkLink objects: what the controller remembers of each besides the index (for status writes and
//! finalizers), and where a deletion hands the link over to its cleanup.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use super::Controller;
use super::finalizer::FINALIZER;
use crate::api::{NetworkLink, NetworkLinkStatus};
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
    pub(super) fn upsert_link(&mut self, key: ObjectKey, link: NetworkLink) {
        let deleting = link.metadata.deletion_timestamp.is_some();
        let has_finalizer = link.finalizers().iter().any(|f| f == FINALIZER);
        self.links.insert(
            key.clone(),
            LinkMeta {
                resource_version: link.resource_version(),
                finalizers: link.finalizers().to_vec(),
                deleting,
                status: link.status.clone(),
                reference: link.object_ref(&()),
            },
        );
        if !deleting {
            self.planner.apply_link(&link);
            self.status.dirty.insert(key);
        } else if self.cleanups.contains_key(&key) || !has_finalizer {
            self.planner.delete_link(&key);
        } else {
            self.begin_cleanup(key, &link);
        }
    }

    pub(super) fn delete_link(&mut self, key: &ObjectKey) {
        self.planner.delete_link(key);
        self.links.remove(key);
        self.cleanups.remove(key);
        self.status.queued.remove(key);
    }
}
