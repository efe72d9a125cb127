//! The serving certificates of the operator's HTTPS listeners (the webhook, `/metrics` by token), and the
//! trust the API server puts in the webhook's. Every replica issues its own serving
//! certificate from the operator's CA (the key never leaves memory) and renews it after two thirds of its
//! life, or at once when its CA is retired; the leader writes the CA bundle (every CA trusted, retired ones
//! included, so a certificate from any of them is accepted while they are) into the `caBundle` of the webhook
//! configurations that call the listener (the NetworkTopology validation, the hold's pod mutation), and writes it
//! again whenever someone else changed it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::Api;
use kube::api::{Patch, PatchParams};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

use super::server::ServingCertificate;
use crate::pki::ca::{CaSet, PkiError, certificates, private_key};
use crate::pki::store::{Pki, renewal_due};

/// How often the certificate and the configuration's bundle are checked: a changed bundle (a new CA, or an
/// edit that dropped it) is written again within this.
const CHECK: Duration = Duration::from_secs(10);
/// The field manager of the bundle's writes.
const MANAGER: &str = "isthmus-operator";

/// Where one of the operator's HTTPS listeners (the webhook, `/metrics` by token) is reached.
#[derive(Debug, Clone)]
pub struct ServingConfig {
    /// The DNS name its callers use (`<service>.<namespace>.svc`): the serving certificate's name.
    pub dns_name: String,
    /// The webhook configurations whose `caBundle` the leader keeps; none: the callers are not the API server
    /// (the metrics listener's read the chart's CA bundle ConfigMap).
    pub configurations: Vec<WebhookConfiguration>,
    /// Lifetime of the serving certificate.
    pub validity: Duration,
}

/// A webhook configuration the API server calls a listener by, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookConfiguration {
    Validating(String),
    Mutating(String),
}

/// The webhooks of either kind of configuration, as far as their trust goes.
trait Webhooks: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned {
    fn client_configs(&self) -> Vec<(&str, &WebhookClientConfig)>;
}

impl Webhooks for ValidatingWebhookConfiguration {
    fn client_configs(&self) -> Vec<(&str, &WebhookClientConfig)> {
        self.webhooks.iter().flatten().map(|w| (w.name.as_str(), &w.client_config)).collect()
    }
}

impl Webhooks for MutatingWebhookConfiguration {
    fn client_configs(&self) -> Vec<(&str, &WebhookClientConfig)> {
        self.webhooks.iter().flatten().map(|w| (w.name.as_str(), &w.client_config)).collect()
    }
}

/// A serving certificate for `dns_name` from `ca`: its PEM, and the certificate and key as rustls presents them.
pub fn issue(ca: &CaSet, dns_name: &str, validity: Duration) -> Result<(String, Arc<CertifiedKey>), PkiError> {
    let (pem, key_pem) = ca.issue_serving(dns_name, OffsetDateTime::now_utc(), validity)?;
    let chain = certificates(&pem)?;
    let key = rustls::crypto::ring::sign::any_supported_type(&private_key(&key_pem)?)
        .map_err(|e| PkiError::Stored(format!("the serving key: {e}")))?;
    Ok((pem, Arc::new(CertifiedKey::new(chain, key))))
}

/// Issues the first certificate into `certificate` (the listener has one before it serves), then keeps it and
/// the configuration's bundle until `shutdown`.
pub fn start(
    client: kube::Client,
    pki: Arc<Pki>,
    config: ServingConfig,
    certificate: Arc<ServingCertificate>,
    leader: tokio::sync::watch::Receiver<bool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, PkiError> {
    let (mut issued, key) = issue(&pki.ca(), &config.dns_name, config.validity)?;
    certificate.set(key);
    Ok(tokio::spawn(async move {
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(client);
        loop {
            let ca = pki.ca();
            let due = renewal_due(issued.as_bytes(), config.validity, OffsetDateTime::now_utc());
            if due || !ca.issued_in_force(&issued, &config.dns_name) {
                match issue(&ca, &config.dns_name, config.validity) {
                    Ok((fresh, key)) => {
                        certificate.set(key);
                        issued = fresh;
                        tracing::info!(dns_name = %config.dns_name, "serving certificate issued");
                    }
                    Err(e) => {
                        tracing::warn!(dns_name = %config.dns_name, error = %e, "issuing a serving certificate failed; retrying")
                    }
                }
            }
            let leading = *leader.borrow();
            let bundle = ca.bundle();
            for configuration in config.configurations.iter().filter(|_| leading) {
                let (name, written) = match configuration {
                    WebhookConfiguration::Validating(name) => (name, publish_bundle(&validating, name, &bundle).await),
                    WebhookConfiguration::Mutating(name) => (name, publish_bundle(&mutating, name, &bundle).await),
                };
                if let Err(e) = written {
                    tracing::warn!(configuration = %name, error = %e, "writing the webhook's CA bundle failed; retrying");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(CHECK) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }))
}

/// Sets `caBundle` of every webhook of the configuration `name` to `bundle` where it differs.
async fn publish_bundle<K: Webhooks>(api: &Api<K>, name: &str, bundle: &str) -> Result<(), kube::Error> {
    let Some(current) = api.get_opt(name).await? else {
        tracing::warn!(configuration = %name, "the webhook's configuration does not exist: its webhooks go uncalled");
        return Ok(());
    };
    let patch = bundle_patch(&current, bundle);
    if let Some(patch) = patch {
        api.patch(
            name,
            &PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() },
            &Patch::Strategic(patch),
        )
        .await?;
        tracing::info!(configuration = %name, "webhook CA bundle written");
    }
    Ok(())
}

/// The strategic merge patch that sets every webhook's `caBundle` to `bundle` (webhooks merge on their name),
/// None when each already has it.
fn bundle_patch(current: &impl Webhooks, bundle: &str) -> Option<serde_json::Value> {
    let want = ByteString(bundle.as_bytes().to_vec());
    let stale: Vec<serde_json::Value> = current
        .client_configs()
        .into_iter()
        .filter(|(_, c)| c.ca_bundle.as_ref() != Some(&want))
        .map(|(name, _)| serde_json::json!({"name": name, "clientConfig": {"caBundle": want}}))
        .collect();
    (!stale.is_empty()).then(|| serde_json::json!({"webhooks": stale}))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, ValidatingWebhook};

    use super::*;

    fn configuration(bundles: &[Option<&str>]) -> ValidatingWebhookConfiguration {
        let webhooks = bundles
            .iter()
            .enumerate()
            .map(|(i, b)| ValidatingWebhook {
                name: format!("w{i}.isthmus.dev"),
                client_config: WebhookClientConfig {
                    ca_bundle: b.map(|b| ByteString(b.as_bytes().to_vec())),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        ValidatingWebhookConfiguration { webhooks: Some(webhooks), ..Default::default() }
    }

    #[test]
    fn only_webhooks_without_the_bundle_are_patched_and_in_base64() {
        assert_eq!(bundle_patch(&configuration(&[Some("ca")]), "ca"), None);
        let patch = bundle_patch(&configuration(&[Some("ca"), None, Some("old")]), "ca").unwrap();
        assert_eq!(
            patch,
            serde_json::json!({"webhooks": [
                {"name": "w1.isthmus.dev", "clientConfig": {"caBundle": "Y2E="}},
                {"name": "w2.isthmus.dev", "clientConfig": {"caBundle": "Y2E="}},
            ]})
        );
        let mutating = MutatingWebhookConfiguration {
            webhooks: Some(vec![MutatingWebhook { name: "hold.isthmus.dev".into(), ..Default::default() }]),
            ..Default::default()
        };
        assert_eq!(
            bundle_patch(&mutating, "ca"),
            Some(serde_json::json!({"webhooks": [{"name": "hold.isthmus.dev", "clientConfig": {"caBundle": "Y2E="}}]}))
        );
    }
}
