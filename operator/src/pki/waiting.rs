//! The agents' requests still waiting for the signer, by the pod that made them: only a pod's newest is signed.
//!
//! An agent keeps one request pending at a time (agent/src/csr.rs). More than one from the same pod means the
//! earlier ones were made by a process that is gone (a restarted container makes a new key, the pod keeps its UID)
//! or by an agent of an earlier version, which made a new request every two minutes while the signer was down.
//! Signing them all when the signer comes back would issue certificates for keys nobody holds, so the earlier ones
//! are denied as `Superseded`.

use std::collections::BTreeMap;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use super::review::{EXTRA_POD_UID, single};

/// One request that is neither signed, denied nor failed, and names the pod that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiting {
    pod_uid: String,
    created: Option<Timestamp>,
}

/// Every waiting request the signer's watch has shown, by name.
#[derive(Debug, Default)]
pub struct WaitingRequests {
    by_name: BTreeMap<String, Waiting>,
}

/// Whether the request still waits for a decision: no certificate, not denied, not failed.
pub fn is_waiting(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    let signed = status.is_some_and(|s| s.certificate.as_ref().is_some_and(|c| !c.0.is_empty()));
    let decided = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True"));
    !signed && !decided
}

impl WaitingRequests {
    /// Takes in the request as the watch shows it now.
    pub fn update(&mut self, csr: &CertificateSigningRequest) {
        let name = csr.name_any();
        let extra = csr.spec.extra.clone().unwrap_or_default();
        match single(&extra, EXTRA_POD_UID) {
            Some(uid) if is_waiting(csr) => {
                let created = csr.metadata.creation_timestamp.as_ref().map(|t| t.0);
                self.by_name.insert(name, Waiting { pod_uid: uid.to_owned(), created });
            }
            _ => {
                self.by_name.remove(&name);
            }
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// Replaces everything with a fresh list.
    pub fn replace_all<'a>(&mut self, csrs: impl IntoIterator<Item = &'a CertificateSigningRequest>) {
        self.by_name.clear();
        for csr in csrs {
            self.update(csr);
        }
    }

    /// The newest waiting request of the same pod, when it is not `name` itself: the one that supersedes it.
    /// Newest by creation time, then by name (generated names differ only in their random suffix).
    pub fn superseded_by(&self, name: &str) -> Option<&str> {
        let this = self.by_name.get(name)?;
        let (newest, _) = self
            .by_name
            .iter()
            .filter(|(_, w)| w.pod_uid == this.pod_uid)
            .max_by(|(a, wa), (b, wb)| (wa.created, a).cmp(&(wb.created, b)))?;
        (newest != name).then_some(newest.as_str())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn csr(name: &str, uid: Option<&str>, created: &str, status: serde_json::Value) -> CertificateSigningRequest {
        let extra = uid.map(|u| json!({EXTRA_POD_UID: [u]})).unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"request": "", "signerName": "isthmus.dev/agent-serving", "extra": extra},
            "status": status,
        }))
        .unwrap()
    }

    const T1: &str = "2026-12-04T10:00:00Z";
    const T2: &str = "2026-12-04T10:03:00Z";
    const T3: &str = "2026-12-04T10:06:00Z";

    #[test]
    fn only_the_newest_request_of_a_pod_is_not_superseded() {
        let mut waiting = WaitingRequests::default();
        let all = [
            csr("a-1", Some("pod-a"), T1, json!({})),
            csr("a-3", Some("pod-a"), T3, json!({})),
            csr("a-2", Some("pod-a"), T2, json!({})),
            csr("b-1", Some("pod-b"), T1, json!({})),
        ];
        waiting.replace_all(&all);
        assert_eq!(waiting.superseded_by("a-1"), Some("a-3"));
        assert_eq!(waiting.superseded_by("a-2"), Some("a-3"));
        assert_eq!(waiting.superseded_by("a-3"), None);
        assert_eq!(waiting.superseded_by("b-1"), None, "another pod's request stands alone");
        assert_eq!(waiting.superseded_by("unknown"), None);
    }

    #[test]
    fn a_decided_request_supersedes_nothing_and_the_same_second_is_ordered_by_name() {
        let mut waiting = WaitingRequests::default();
        waiting.replace_all(&[csr("x-old", Some("p"), T1, json!({})), csr("x-new", Some("p"), T2, json!({}))]);
        assert_eq!(waiting.superseded_by("x-old"), Some("x-new"));
        // The newer one is signed (or denied): the older is the pod's only waiting request again.
        waiting.update(&csr("x-new", Some("p"), T2, json!({"certificate": "Y2VydA=="})));
        assert_eq!(waiting.superseded_by("x-old"), None);
        waiting.update(&csr("x-new2", Some("p"), T2, json!({"conditions": [{"type": "Denied", "status": "True"}]})));
        assert_eq!(waiting.superseded_by("x-old"), None);
        waiting.remove("x-old");
        waiting.update(&csr("s-b", Some("q"), T3, json!({})));
        waiting.update(&csr("s-a", Some("q"), T3, json!({})));
        assert_eq!(waiting.superseded_by("s-a"), Some("s-b"));
        // A request that names no pod is left to the review, which denies it.
        waiting.update(&csr("anon", None, T3, json!({})));
        assert_eq!(waiting.superseded_by("anon"), None);
    }
}
