//! A NetworkLink as the API server stores it, decoded one object at a time. The API server accepts objects that
//! the operator's types cannot hold (an integer beyond its Rust type's range, kept from before the schema
//! bounded it, or written to the status by someone else); decoding a whole list as `NetworkLink`s would then
//! fail for every namespace's links at once. A [`StoredLink`] always decodes when its metadata does, and says
//! which field of the rest could not be read.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};

use super::{NetworkLink, NetworkLinkStatus};

/// One stored NetworkLink: its metadata, and the object if it could be read.
#[derive(Clone, Debug)]
pub struct StoredLink {
    pub metadata: ObjectMeta,
    pub decoded: Result<NetworkLink, Undecodable>,
    /// The status, when it can be read on its own (also when the spec cannot).
    pub status: Option<NetworkLinkStatus>,
}

/// Why a stored object could not be read: the field's path and the decoder's reason (never the object itself,
/// which may be large and belongs to a tenant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecodable {
    pub path: String,
    pub reason: String,
}

impl From<NetworkLink> for StoredLink {
    fn from(link: NetworkLink) -> Self {
        StoredLink { metadata: link.metadata.clone(), status: link.status.clone(), decoded: Ok(link) }
    }
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

impl StoredLink {
    /// Decodes one object's JSON.
    pub fn from_value(value: serde_json::Value) -> Result<Self, serde_json::Error> {
        let metadata = ObjectMeta::deserialize(value.get("metadata").unwrap_or(&serde_json::Value::Null))?;
        let status = value.get("status").and_then(|s| NetworkLinkStatus::deserialize(s).ok());
        let decoded = serde_path_to_error::deserialize::<_, NetworkLink>(value)
            .map_err(|e| Undecodable { path: e.path().to_string(), reason: without_position(&e.inner().to_string()) });
        Ok(StoredLink { metadata, decoded, status })
    }
}

/// serde_json's "at line 1 column 123" points into a document nobody sees.
fn without_position(reason: &str) -> String {
    match reason.rfind(" at line ") {
        Some(at) => reason[..at].to_owned(),
        None => reason.to_owned(),
    }
}

impl<'de> Deserialize<'de> for StoredLink {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        StoredLink::from_value(value).map_err(serde::de::Error::custom)
    }
}

impl Resource for StoredLink {
    type DynamicType = ();
    type Scope = <NetworkLink as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        NetworkLink::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        NetworkLink::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        NetworkLink::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        NetworkLink::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(spec: serde_json::Value, status: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink",
            "metadata": {"name": "l", "namespace": "t", "resourceVersion": "7", "finalizers": ["isthmus.dev/cleanup"]},
            "spec": spec, "status": status,
        })
    }

    fn valid_spec() -> serde_json::Value {
        json!({"from": {"podSelector": {}}, "to": {"podSelector": {}}, "impairment": {"latency": "10ms"}})
    }

    #[test]
    fn a_valid_object_decodes_whole() {
        let stored = StoredLink::from_value(object(valid_spec(), json!({}))).unwrap();
        assert_eq!(stored.metadata.name.as_deref(), Some("l"));
        assert!(stored.decoded.is_ok(), "{:?}", stored.decoded);
    }

    #[test]
    fn an_integer_beyond_its_type_names_its_field_and_keeps_the_metadata() {
        let mut spec = valid_spec();
        spec["priority"] = json!(1u64 << 40);
        let stored = StoredLink::from_value(object(spec, json!({}))).unwrap();
        let e = stored.decoded.unwrap_err();
        assert_eq!(e.path, "spec.priority");
        assert!(e.reason.contains("1099511627776"), "{e}");
        assert!(!e.reason.contains("line"), "{e}");
        assert_eq!(stored.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(stored.metadata.finalizers, Some(vec!["isthmus.dev/cleanup".to_owned()]));

        let stored = StoredLink::from_value(object(valid_spec(), json!({"pairs": -1}))).unwrap();
        assert_eq!(stored.decoded.unwrap_err().path, "status.pairs");
    }

    #[test]
    fn a_list_with_one_bad_object_decodes_every_object() {
        let mut bad = valid_spec();
        bad["impairment"]["queueLimit"] = json!(1u64 << 33);
        let list = json!([object(valid_spec(), json!({})), object(bad, json!({}))]);
        let stored: Vec<StoredLink> = serde_json::from_value(list).unwrap();
        assert!(stored[0].decoded.is_ok());
        assert_eq!(stored[1].decoded.as_ref().unwrap_err().path, "spec.impairment.queueLimit");
    }
}
