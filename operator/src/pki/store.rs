//! The CA kept in the cluster: the Secret that holds it (created by the operator through the API, so it never
//! enters Helm's release records), the ConfigMap that publishes its certificates to the agents, the operator's own
//! client certificate (in memory only) and the metrics scraper's (a Secret the operator owns).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use isthmus_agent_api::client::MemoryCredentials;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;

use super::ca::{Authority, CaSet, PkiError, SECRET_CERTS, SECRET_KEYS, SECRET_RETIRED, certificates, private_key};
use super::handover::agents_on_retired_cas;
use super::signer::SignerConfig;

/// Where the CA lives and what it issues.
#[derive(Debug, Clone)]
pub struct PkiConfig {
    pub namespace: String,
    /// The Secret holding the CA certificates and keys.
    pub ca_secret: String,
    /// The ConfigMap publishing the CA certificates (`ca.crt`) to the agents.
    pub bundle_configmap: String,
    /// The operator's identity (the DNS SAN agents require).
    pub operator_identity: String,
    /// The metrics scraper's Secret and identity, when one is issued.
    pub scraper: Option<(String, String)>,
    pub ca_validity: Duration,
    pub renew_before: Duration,
    /// Lifetime of the operator's, the scraper's and the agents' certificates.
    pub leaf_validity: Duration,
}

/// How often the leader looks whether every agent has moved off the retired CAs, while some are.
const HANDOVER_CHECK: Duration = Duration::from_secs(10);

/// The bundle ConfigMap's key, which agents read: every CA they trust.
pub const BUNDLE_KEY: &str = "ca.crt";
/// The bundle ConfigMap's key for the retired CAs (also in [`BUNDLE_KEY`]), absent while there are none: an agent
/// whose certificate comes from one of them asks for a new one at once.
pub const BUNDLE_RETIRED_KEY: &str = "retired.crt";

/// The CA as this replica last read it, and the operator's credentials issued from it.
pub struct Pki {
    config: PkiConfig,
    ca: RwLock<Arc<CaSet>>,
    pub credentials: Arc<MemoryCredentials>,
    /// When the operator's own certificate is to be re-issued.
    own_renew_at: RwLock<OffsetDateTime>,
    /// Asks for a round of upkeep now (the signer, after signing while a retired CA waits for the agents).
    wake: tokio::sync::Notify,
    /// The agent pods last reported as holding a certificate from a retired CA (logged when it changes).
    waiting_agents: Mutex<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("{what} {namespace}/{name}: {source}")]
    Api { what: &'static str, namespace: String, name: String, source: Box<kube::Error> },
    #[error("Secret {namespace}/{name} has no {key}")]
    Missing { namespace: String, name: String, key: &'static str },
    #[error("operator certificate: {0}")]
    Tls(#[from] isthmus_agent_api::tls::TlsError),
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

impl Pki {
    /// Reads the CA Secret, creating it with a new CA when absent (replicas starting together may race: the
    /// loser reads the winner's), and issues this replica's client certificate.
    pub async fn start(client: &Client, config: PkiConfig) -> Result<Arc<Self>, StoreError> {
        let ca = ensure_ca(client, &config).await?;
        let now = now();
        let ((roots, chain, key), renew_at) = own_certificate(&ca, &config, now)?;
        Ok(Arc::new(Self {
            credentials: Arc::new(MemoryCredentials::new(roots, chain, key)?),
            config,
            ca: RwLock::new(Arc::new(ca)),
            own_renew_at: RwLock::new(renew_at),
            wake: tokio::sync::Notify::new(),
            waiting_agents: Mutex::new(Vec::new()),
        }))
    }

    /// Asks for a round of upkeep now rather than at the next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn ca(&self) -> Arc<CaSet> {
        self.ca.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn config(&self) -> &PkiConfig {
        &self.config
    }

    /// One round of upkeep: re-read the CA (another replica may have rotated it; a deleted Secret is replaced
    /// by a new CA, the ones trusted until then retired); as the leader, rotate it when due, stop trusting
    /// retired CAs once no agent needs them (`agents` says which pods are agents) and publish the bundle and the
    /// scraper's Secret; re-issue this replica's certificate when due or when the trusted CAs changed.
    pub async fn refresh(&self, client: &Client, leader: bool, agents: &SignerConfig) -> Result<(), StoreError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.config.namespace);
        let name = &self.config.ca_secret;
        let mut stored = match secrets.get(name).await {
            Ok(s) => s,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let trusted = self.ca().bundle();
                tracing::warn!(
                    secret = %name,
                    retired_cas = trusted.matches("BEGIN CERTIFICATE").count(),
                    "the CA Secret is gone; a new CA signs from now on, and the CAs trusted until now stay trusted \
                     until every agent holds a certificate from the new one"
                );
                create_ca(&secrets, &self.config, Some(&trusted)).await?
            }
            Err(source) => return Err(self.api_error("reading Secret", name, source)),
        };
        let mut ca = ca_of(&stored, &self.config)?;
        let now = now();
        if leader
            && let Some(rotated) = ca.rotate(now, self.config.ca_validity, self.config.renew_before)?
            && self.store(&secrets, &mut stored, &rotated).await?
        {
            tracing::info!(secret = %name, "rotated the CA (the bundle holds the old and the new one)");
            ca = rotated;
        }
        if leader && ca.has_retired() {
            let waiting = agents_on_retired_cas(client, agents, &ca).await?;
            if let Some(settled) = ca.settle(now, self.config.leaf_validity, waiting.is_empty())? {
                if self.store(&secrets, &mut stored, &settled).await? {
                    tracing::info!(secret = %name, "every agent holds a certificate from the CA in force; the retired CAs are no longer trusted");
                    ca = settled;
                }
            } else {
                let mut logged = self.waiting_agents.lock().unwrap_or_else(|p| p.into_inner());
                if *logged != waiting {
                    tracing::warn!(secret = %name, agents = ?waiting, "the retired CAs stay trusted until these agent pods hold a certificate from the new one (or are deleted)");
                    *logged = waiting;
                }
            }
        }
        let changed = ca.bundle() != self.ca().bundle();
        if changed || now >= *self.own_renew_at.read().unwrap_or_else(|p| p.into_inner()) {
            let ((roots, chain, key), renew_at) = own_certificate(&ca, &self.config, now)?;
            self.credentials.replace(roots, chain, key)?;
            *self.own_renew_at.write().unwrap_or_else(|p| p.into_inner()) = renew_at;
            tracing::info!(
                trusted_cas = ca.bundle().matches("BEGIN CERTIFICATE").count(),
                "re-issued the operator's client certificate"
            );
        }
        *self.ca.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ca);
        if leader {
            self.publish(client).await?;
        }
        Ok(())
    }

    /// Writes `ca` into the CA Secret `stored`; false when someone else changed it meanwhile (the next round
    /// reads theirs).
    async fn store(&self, secrets: &Api<Secret>, stored: &mut Secret, ca: &CaSet) -> Result<bool, StoreError> {
        let name = &self.config.ca_secret;
        stored.data = Some(secret_data(ca));
        match secrets.replace(name, &PostParams::default(), stored).await {
            Ok(replaced) => {
                *stored = replaced;
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(source) => Err(self.api_error("updating Secret", name, source)),
        }
    }

    /// The bundle ConfigMap and the scraper's Secret, created or updated to match the CA.
    async fn publish(&self, client: &Client) -> Result<(), StoreError> {
        let ca = self.ca();
        let bundle = ca.bundle();
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &self.config.namespace);
        let name = &self.config.bundle_configmap;
        let mut data = BTreeMap::from([(BUNDLE_KEY.to_owned(), bundle.clone())]);
        if let Some(retired) = ca.retired_pem() {
            data.insert(BUNDLE_RETIRED_KEY.to_owned(), retired);
        }
        match maps.get_opt(name).await.map_err(|e| self.api_error("reading ConfigMap", name, e))? {
            Some(map) if map.data.as_ref() == Some(&data) => {}
            Some(mut map) => {
                map.data = Some(data);
                maps.replace(name, &PostParams::default(), &map)
                    .await
                    .map_err(|e| self.api_error("updating ConfigMap", name, e))?;
                tracing::info!(configmap = %name, "published the CA bundle");
            }
            None => {
                let map = ConfigMap { metadata: self.meta(name), data: Some(data), ..Default::default() };
                create_or_conflict(maps.create(&PostParams::default(), &map).await)
                    .map_err(|e| self.api_error("creating ConfigMap", name, e))?;
                tracing::info!(configmap = %name, "published the CA bundle");
            }
        }
        let Some((secret_name, identity)) = &self.config.scraper else { return Ok(()) };
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.config.namespace);
        let existing =
            secrets.get_opt(secret_name).await.map_err(|e| self.api_error("reading Secret", secret_name, e))?;
        let current = existing.as_ref().and_then(|s| s.data.as_ref());
        let due = current.is_none_or(|d| {
            d.get("ca.crt").map(|b| b.0.as_slice()) != Some(bundle.as_bytes())
                || d.get("tls.crt").is_none_or(|c| renewal_due(&c.0, self.config.leaf_validity, now()))
        });
        if !due {
            return Ok(());
        }
        let (cert, key) = ca.issue_client(identity, now(), self.config.leaf_validity)?;
        let data = BTreeMap::from([
            ("ca.crt".to_owned(), ByteString(bundle.into_bytes())),
            ("tls.crt".to_owned(), ByteString(cert.into_bytes())),
            ("tls.key".to_owned(), ByteString(key.into_bytes())),
        ]);
        match existing {
            Some(mut s) => {
                s.data = Some(data);
                secrets
                    .replace(secret_name, &PostParams::default(), &s)
                    .await
                    .map_err(|e| self.api_error("updating Secret", secret_name, e))?;
            }
            None => {
                let s = Secret {
                    metadata: self.meta(secret_name),
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data),
                    ..Default::default()
                };
                create_or_conflict(secrets.create(&PostParams::default(), &s).await)
                    .map_err(|e| self.api_error("creating Secret", secret_name, e))?;
            }
        }
        tracing::info!(secret = %secret_name, "issued the metrics scraper's certificate");
        Ok(())
    }

    fn meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.config.namespace.clone()),
            labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "isthmus-operator".to_owned())])),
            ..Default::default()
        }
    }

    fn api_error(&self, what: &'static str, name: &str, source: kube::Error) -> StoreError {
        StoreError::Api {
            what,
            namespace: self.config.namespace.clone(),
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    /// Upkeep every `interval` until `shutdown`, and at once when the CA Secret is deleted or [`Pki::wake`] is
    /// called.
    pub fn spawn_refresh(
        self: Arc<Self>,
        client: Client,
        leader: tokio::sync::watch::Receiver<bool>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        interval: Duration,
        agents: SignerConfig,
    ) -> tokio::task::JoinHandle<()> {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        tokio::spawn(async move {
            // The first round at once (a new install publishes its bundle without waiting).
            let mut pause = Duration::ZERO;
            let mut leader = leader;
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.config.namespace);
            let only_ca = watcher::Config::default().fields(&format!("metadata.name={}", self.config.ca_secret));
            let mut deletions = watcher(secrets, only_ca)
                .default_backoff()
                .filter(|e| std::future::ready(matches!(e, Ok(watcher::Event::Delete(_)))))
                .boxed();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    // A new leader publishes at once.
                    r = leader.changed() => if r.is_err() { return },
                    Some(_) = deletions.next() => {}
                    _ = self.wake.notified() => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                let leads = *leader.borrow();
                if let Err(e) = self.refresh(&client, leads, &agents).await {
                    tracing::warn!(error = %e, "CA upkeep failed; retrying");
                }
                // While retired CAs wait for the agents, an agent pod that goes away can end the wait.
                pause = if self.ca().has_retired() { interval.min(HANDOVER_CHECK) } else { interval };
            }
        })
    }
}

/// True when a certificate (PEM) has less than a third of `validity` left, or cannot be read.
pub(crate) fn renewal_due(pem: &[u8], validity: Duration, now: OffsetDateTime) -> bool {
    use x509_parser::prelude::FromDer;
    let Ok(text) = std::str::from_utf8(pem) else { return true };
    let Ok(mut ders) = certificates(text) else { return true };
    if ders.is_empty() {
        return true;
    }
    let der = ders.remove(0);
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(&der) else { return true };
    cert.validity().not_after.timestamp() - now.unix_timestamp() < (validity.as_secs() / 3) as i64
}

/// What the operator's client presents and trusts.
type ClientParts =
    (rustls::RootCertStore, Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>);

/// A fresh client certificate for the operator (its key only in memory), and when to re-issue it: after two
/// thirds of its life.
fn own_certificate(
    ca: &CaSet,
    config: &PkiConfig,
    now: OffsetDateTime,
) -> Result<(ClientParts, OffsetDateTime), StoreError> {
    let (cert, key) = ca.issue_client(&config.operator_identity, now, config.leaf_validity)?;
    let renew_at = now + config.leaf_validity.mul_f64(2.0 / 3.0);
    Ok(((ca.roots()?, certificates(&cert)?, private_key(&key)?), renew_at))
}

/// The CA Secret, created when absent: at installation with a new CA; when it was deleted, with a new CA that
/// retires those the published bundle holds (the agents' certificates come from them).
async fn ensure_ca(client: &Client, config: &PkiConfig) -> Result<CaSet, StoreError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let api_error = |what, name: &str, source| StoreError::Api {
        what,
        namespace: config.namespace.clone(),
        name: name.to_owned(),
        source: Box::new(source),
    };
    let stored = match secrets
        .get_opt(&config.ca_secret)
        .await
        .map_err(|e| api_error("reading Secret", &config.ca_secret, e))?
    {
        Some(s) => s,
        None => {
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &config.namespace);
            let published = maps
                .get_opt(&config.bundle_configmap)
                .await
                .map_err(|e| api_error("reading ConfigMap", &config.bundle_configmap, e))?
                .and_then(|m| m.data?.remove(BUNDLE_KEY));
            if published.is_some() {
                tracing::warn!(secret = %config.ca_secret, "the CA Secret is gone; a new CA signs from now on, and the published bundle's CAs stay trusted until every agent holds a certificate from the new one");
            }
            create_ca(&secrets, config, published.as_deref()).await?
        }
    };
    ca_of(&stored, config)
}

/// Creates the CA Secret with a new CA, retiring the CAs `trusted_before` holds (PEM); when another replica
/// created it first, reads theirs.
async fn create_ca(
    secrets: &Api<Secret>,
    config: &PkiConfig,
    trusted_before: Option<&str>,
) -> Result<Secret, StoreError> {
    let api_error = |what, source| StoreError::Api {
        what,
        namespace: config.namespace.clone(),
        name: config.ca_secret.clone(),
        source: Box::new(source),
    };
    let ca = match trusted_before {
        Some(trusted) => CaSet::replacing(trusted, now(), config.ca_validity)?,
        None => CaSet::new(Authority::generate(now(), config.ca_validity)?),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(config.ca_secret.clone()),
            namespace: Some(config.namespace.clone()),
            labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "isthmus-operator".to_owned())])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(secret_data(&ca)),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => {
            tracing::info!(secret = %config.ca_secret, "created the isthmus CA");
            Ok(created)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            secrets.get(&config.ca_secret).await.map_err(|e| api_error("reading Secret", e))
        }
        Err(e) => Err(api_error("creating Secret", e)),
    }
}

fn create_or_conflict<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn secret_data(ca: &CaSet) -> BTreeMap<String, ByteString> {
    let (certs, keys) = ca.to_pem();
    let mut data = BTreeMap::from([
        (SECRET_CERTS.to_owned(), ByteString(certs.into_bytes())),
        (SECRET_KEYS.to_owned(), ByteString(keys.into_bytes())),
    ]);
    if let Some(retired) = ca.retired_pem() {
        data.insert(SECRET_RETIRED.to_owned(), ByteString(retired.into_bytes()));
    }
    data
}

fn ca_of(secret: &Secret, config: &PkiConfig) -> Result<CaSet, StoreError> {
    let field = |key: &'static str| {
        secret.data.as_ref().and_then(|d| d.get(key)).map(|b| String::from_utf8_lossy(&b.0).into_owned()).ok_or_else(
            || StoreError::Missing { namespace: config.namespace.clone(), name: config.ca_secret.clone(), key },
        )
    };
    let retired = field(SECRET_RETIRED).ok();
    Ok(CaSet::from_pem(&field(SECRET_CERTS)?, &field(SECRET_KEYS)?, retired.as_deref())?)
}
