//! The CAs the agent trusts for its callers (`--tls-source csr`): `ca.crt` of the ConfigMap the operator publishes,
//! read through the API and watched. A mounted ConfigMap would do the same, but the kubelet refreshes a mounted
//! ConfigMap only on its own sync: on a fresh install the operator publishes the bundle after the agents start, and
//! each agent then served nothing for a minute or more (80 s on the end-to-end suite's nodes) with its certificate
//! already issued; a rotation reached the agents as late. Read through the API, both take effect at once.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};

/// The key of the bundle in the ConfigMap (what the operator writes).
pub const KEY: &str = "ca.crt";

/// The latest bundle seen (PEM), held in memory; None until the first one.
#[derive(Debug, Default)]
pub struct TrustedBundle(RwLock<Option<Vec<u8>>>);

impl TrustedBundle {
    /// Stores `pem`; true when it differs from what was held.
    pub fn set(&self, pem: Vec<u8>) -> bool {
        let mut held = self.0.write().unwrap_or_else(|p| p.into_inner());
        let changed = held.as_ref() != Some(&pem);
        *held = Some(pem);
        changed
    }

    pub fn get(&self) -> Option<Vec<u8>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The bundle a ConfigMap carries, or why it carries none.
pub fn bundle_of(config_map: &ConfigMap) -> Result<Vec<u8>, &'static str> {
    let pem = config_map.data.as_ref().and_then(|d| d.get(KEY)).ok_or("it has no ca.crt")?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err("its ca.crt holds no PEM certificate");
    }
    Ok(pem.clone().into_bytes())
}

/// Keeps `into` holding the bundle of ConfigMap `name` in `namespace` for as long as the task runs. A deleted or
/// unusable ConfigMap leaves the last good bundle in force (the operator publishes it again).
pub fn spawn(
    client: kube::Client,
    namespace: String,
    name: String,
    into: Arc<TrustedBundle>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(cm) | Event::InitApply(cm)) => match bundle_of(&cm) {
                    Ok(pem) => {
                        if into.set(pem) {
                            tracing::info!(configmap = %name, namespace = %namespace, "trusting the operator's CA bundle");
                        }
                    }
                    Err(why) => tracing::warn!(configmap = %name, why, "CA bundle unusable; keeping the last one"),
                },
                Ok(Event::Delete(_)) => tracing::warn!(configmap = %name, "CA bundle deleted; keeping the last one"),
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => tracing::warn!(configmap = %name, error = %e, "watching the CA bundle"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(data: Option<&[(&str, &str)]>) -> ConfigMap {
        ConfigMap {
            data: data.map(|d| d.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn the_bundle_is_ca_crt_when_it_holds_a_certificate() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert_eq!(bundle_of(&config_map(Some(&[(KEY, pem)]))), Ok(pem.as_bytes().to_vec()));
        assert_eq!(bundle_of(&config_map(None)), Err("it has no ca.crt"));
        assert_eq!(bundle_of(&config_map(Some(&[("other", pem)]))), Err("it has no ca.crt"));
        assert_eq!(bundle_of(&config_map(Some(&[(KEY, "")]))), Err("its ca.crt holds no PEM certificate"));
    }

    #[test]
    fn set_says_whether_the_bundle_changed() {
        let held = TrustedBundle::default();
        assert_eq!(held.get(), None);
        assert!(held.set(b"a".to_vec()));
        assert!(!held.set(b"a".to_vec()));
        assert!(held.set(b"b".to_vec()));
        assert_eq!(held.get(), Some(b"b".to_vec()));
    }
}
