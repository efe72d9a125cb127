//! The CAs the agent trusts for its callers (`--tls-source csr`): `ca.crt` of the ConfigMap the operator publishes,
//! read through the API and watched. A mounted ConfigMap would do the same, but the kubelet refreshes a mounted
//! ConfigMap only on its own sync: on a fresh install the operator publishes the bundle after the agents start, and
//! each agent then served nothing for a minute or more (80 s on the end-to-end suite's nodes) with its certificate
//! already issued; a rotation reached the agents as late. Read through the API, both take effect at once.
//!
//! `retired.crt` names the CAs among them that no longer sign (the operator replaced its CA after the CA Secret
//! was deleted): an agent whose certificate comes from one of them asks for a new one at once (`crate::csr`),
//! and the operator stops trusting them once every agent has.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The key of the bundle in the ConfigMap (what the operator writes).
pub const KEY: &str = "ca.crt";
/// The key of the retired CAs (each also in [`KEY`]); absent while there are none.
pub const RETIRED_KEY: &str = "retired.crt";

/// What a bundle ConfigMap says: the CAs trusted (PEM) and, of those, the retired ones (PEM, maybe empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub trusted: String,
    pub retired: String,
}

impl Bundle {
    /// The trusted CAs that are not retired: those that sign (PEM).
    pub fn in_force(&self) -> String {
        let retired: Vec<_> = CertificateDer::pem_slice_iter(self.retired.as_bytes()).flatten().collect();
        pem_blocks(&self.trusted)
            .filter(|block| CertificateDer::from_pem_slice(block.as_bytes()).is_ok_and(|c| !retired.contains(&c)))
            .map(|block| format!("{block}\n"))
            .collect()
    }

    /// Whether `cert_pem`, a serving certificate for `dns_name`, comes from a retired CA and not from one in
    /// force: its holder must ask for a new one. False while nothing is retired.
    pub fn retires(&self, cert_pem: &[u8], dns_name: &str) -> bool {
        if !self.retired.contains("-----BEGIN CERTIFICATE-----") {
            return false;
        }
        let Some(Ok(leaf)) = CertificateDer::pem_slice_iter(cert_pem).next() else { return false };
        !isthmus_agent_api::tls::serves_under(&leaf, &self.in_force(), dns_name)
    }
}

/// Each `CERTIFICATE` block of `text`, from its BEGIN line to its END line.
fn pem_blocks(text: &str) -> impl Iterator<Item = &str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find(BEGIN)?;
        let stop = start + rest[start..].find(END)? + END.len();
        let block = &rest[start..stop];
        rest = &rest[stop..];
        Some(block)
    })
}

/// The latest bundle seen, held in memory (None until the first one), and a generation that moves with it.
#[derive(Debug)]
pub struct TrustedBundle {
    held: RwLock<Option<Bundle>>,
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for TrustedBundle {
    fn default() -> Self {
        Self { held: RwLock::new(None), changes: tokio::sync::watch::Sender::new(0) }
    }
}

impl TrustedBundle {
    /// Stores `bundle`; true when it differs from what was held.
    pub fn set(&self, bundle: Bundle) -> bool {
        let mut held = self.held.write().unwrap_or_else(|p| p.into_inner());
        let changed = held.as_ref() != Some(&bundle);
        *held = Some(bundle);
        if changed {
            self.changes.send_modify(|g| *g += 1);
        }
        changed
    }

    /// Every CA trusted (PEM), retired ones included.
    pub fn get(&self) -> Option<Vec<u8>> {
        self.bundle().map(|b| b.trusted.into_bytes())
    }

    pub fn bundle(&self) -> Option<Bundle> {
        self.held.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wakes on every change of the bundle.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The bundle a ConfigMap carries, or why it carries none.
pub fn bundle_of(config_map: &ConfigMap) -> Result<Bundle, &'static str> {
    let data = config_map.data.as_ref();
    let pem = data.and_then(|d| d.get(KEY)).ok_or("it has no ca.crt")?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err("its ca.crt holds no PEM certificate");
    }
    let retired = data.and_then(|d| d.get(RETIRED_KEY)).cloned().unwrap_or_default();
    Ok(Bundle { trusted: pem.clone(), retired })
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
                    Ok(bundle) => {
                        if into.set(bundle) {
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
        let bundle = |retired: &str| Bundle { trusted: pem.to_owned(), retired: retired.to_owned() };
        assert_eq!(bundle_of(&config_map(Some(&[(KEY, pem)]))), Ok(bundle("")));
        assert_eq!(bundle_of(&config_map(Some(&[(KEY, pem), (RETIRED_KEY, pem)]))), Ok(bundle(pem)));
        assert_eq!(bundle_of(&config_map(None)), Err("it has no ca.crt"));
        assert_eq!(bundle_of(&config_map(Some(&[("other", pem)]))), Err("it has no ca.crt"));
        assert_eq!(bundle_of(&config_map(Some(&[(KEY, "")]))), Err("its ca.crt holds no PEM certificate"));
    }

    #[test]
    fn set_says_whether_the_bundle_changed() {
        let held = TrustedBundle::default();
        let changes = held.subscribe();
        let bundle = |trusted: &str, retired: &str| Bundle { trusted: trusted.into(), retired: retired.into() };
        assert_eq!(held.get(), None);
        assert!(held.set(bundle("a", "")));
        assert!(!held.set(bundle("a", "")));
        assert!(held.set(bundle("b", "")));
        assert!(held.set(bundle("b", "a")), "a CA retired is a change");
        assert_eq!(held.get(), Some(b"b".to_vec()));
        assert_eq!(*changes.borrow(), 3);
    }

    fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        (params.self_signed(&key).unwrap(), key)
    }

    fn serving(issuer: &(rcgen::Certificate, rcgen::KeyPair), dns_name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![dns_name.to_owned()]).unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.signed_by(&key, &issuer.0, &issuer.1).unwrap().pem()
    }

    /// An agent asks for a new certificate when the bundle retires the CA that issued its own, and only then.
    #[test]
    fn a_certificate_from_a_retired_ca_is_to_be_replaced() {
        let (old, new) = (ca("old"), ca("new"));
        let name = "node-a.node.isthmus";
        let replacing = Bundle { trusted: format!("{}{}", new.0.pem(), old.0.pem()), retired: old.0.pem() };
        assert_eq!(replacing.in_force().trim(), new.0.pem().trim());
        let (from_old, from_new) = (serving(&old, name), serving(&new, name));
        assert!(replacing.retires(from_old.as_bytes(), name));
        assert!(!replacing.retires(from_new.as_bytes(), name));
        // A normal rotation retires nothing: both CAs are in force while they hand over.
        let rotating = Bundle { trusted: replacing.trusted.clone(), retired: String::new() };
        assert!(!rotating.retires(from_old.as_bytes(), name));
    }
}
