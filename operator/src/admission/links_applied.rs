//! `GET /v1/links-applied?namespace=&name=&uid=` on the webhook listener: a held pod's init container
//! ([`crate::wait_for_links`]) asks whether its `isthmus.dev/links-applied` condition is True. The answer comes
//! from each replica's own watch of the pods that opted in (label [`HOLD_LABEL`]), so a poll costs the API
//! server nothing; a pod is answered only when named with its UID, which only it knows.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::{Deserialize, Serialize};

use super::hold::HOLD_LABEL;
use crate::gate::CONDITION_TYPE;

/// The listener's answer for one pod: its gate condition (`Unknown` while it has none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinksApplied {
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl std::fmt::Display for LinksApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// The pod a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodQuery {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Reads `namespace`, `name` and `uid` from a query string; each must be a plain DNS label, name or UUID (no
/// escapes: nothing of a pod's identity needs one).
pub fn parse_query(query: Option<&str>) -> Result<PodQuery, String> {
    let (mut namespace, mut name, mut uid) = (None, None, None);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
            return Err(format!("{key}: {value:?} is not a name or a UID"));
        }
        let slot = match key {
            "namespace" => &mut namespace,
            "name" => &mut name,
            "uid" => &mut uid,
            other => return Err(format!("{other}: unknown parameter (namespace, name and uid are read)")),
        };
        *slot = Some(value.to_owned());
    }
    let need = |v: Option<String>, key: &str| v.ok_or_else(|| format!("{key}: missing"));
    Ok(PodQuery { namespace: need(namespace, "namespace")?, name: need(name, "name")?, uid: need(uid, "uid")? })
}

impl LinksApplied {
    /// The pod's gate condition, when `pod` is the one of `uid`; `Unknown` while the operator has not written
    /// it. None: another pod (or none) holds that name.
    pub fn of(pod: Option<&Pod>, uid: &str) -> Option<LinksApplied> {
        let pod = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid))?;
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let condition = conditions.into_iter().flatten().find(|c| c.type_ == CONDITION_TYPE);
        Some(match condition {
            Some(c) => LinksApplied {
                status: c.status.clone(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            },
            None => LinksApplied { status: "Unknown".into(), reason: String::new(), message: String::new() },
        })
    }
}

/// The pods that opted into the hold, as this replica last saw them.
#[derive(Clone)]
pub struct HeldPods {
    store: Store<Pod>,
}

impl HeldPods {
    /// Watches the opted-in pods of every namespace until `shutdown`.
    pub fn watch(client: kube::Client, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        let (store, writer) = reflector::store::<Pod>();
        let config = watcher::Config::default().labels(&format!("{HOLD_LABEL}=true"));
        let events = reflector::reflector(writer, watcher(Api::<Pod>::all(client), config)).default_backoff();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut events = std::pin::pin!(events);
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Err(e)) => tracing::warn!(error = %e, "watching the held pods failed; retrying"),
                        Some(Ok(_)) => {}
                        None => return,
                    },
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        });
        HeldPods { store }
    }

    /// The answer for `query`; None: no such pod (yet) in this replica's view.
    pub fn answer(&self, query: &PodQuery) -> Option<LinksApplied> {
        let pod = self.store.get(&ObjectRef::new(&query.name).within(&query.namespace));
        LinksApplied::of(pod.as_deref(), &query.uid)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_query_names_the_pod_and_anything_else_is_refused_naming_the_parameter() {
        assert_eq!(
            parse_query(Some("namespace=shop&name=api-0&uid=0b4e-11")),
            Ok(PodQuery { namespace: "shop".into(), name: "api-0".into(), uid: "0b4e-11".into() })
        );
        assert_eq!(parse_query(Some("namespace=shop&name=api-0")), Err("uid: missing".into()));
        assert_eq!(parse_query(None), Err("namespace: missing".into()));
        assert_eq!(
            parse_query(Some("namespace=sh%6Fp&name=a&uid=u")),
            Err("namespace: \"sh%6Fp\" is not a name or a UID".into())
        );
        assert_eq!(
            parse_query(Some("namespace=shop&name=a&uid=u&watch=1")),
            Err("watch: unknown parameter (namespace, name and uid are read)".into())
        );
    }

    #[test]
    fn the_condition_is_answered_for_the_pod_of_that_uid_only() {
        let pod = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": "api-0", "uid": "u1"},
                "status": {"conditions": conditions},
            }))
            .unwrap()
        };
        let unknown = LinksApplied { status: "Unknown".into(), reason: String::new(), message: String::new() };
        assert_eq!(LinksApplied::of(Some(&pod(json!([{"type": "Ready", "status": "False"}]))), "u1"), Some(unknown));
        let applied = pod(json!([{"type": CONDITION_TYPE, "status": "True", "reason": "Applied", "message": "m"}]));
        assert_eq!(
            LinksApplied::of(Some(&applied), "u1"),
            Some(LinksApplied { status: "True".into(), reason: "Applied".into(), message: "m".into() })
        );
        assert_eq!(LinksApplied::of(Some(&applied), "u2"), None, "another pod of that name");
        assert_eq!(LinksApplied::of(None, "u1"), None);
    }
}
