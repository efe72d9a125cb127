//! The agent's serving certificate from the Kubernetes CertificateSigningRequest API.
//!
//! The agent makes a key in memory, asks for a certificate for its node's DNS name
//! ([`node_server_name`]) with signer [`AGENT_SIGNER_NAME`], and polls the request until the operator has
//! signed it (or denied it: the denial's reason and message are reported). It keeps one request pending at a
//! time: while the signer is down it reads the same request ever less often ([`poll_interval`]) rather than
//! making new ones, and makes another only once that one is denied or gone (Kubernetes deletes a request left
//! pending for a day). It authenticates with its pod-bound
//! ServiceAccount token, from which the API server records the node and pod it runs on in the request; the
//! operator signs only when those match the name asked for. Renewal: a new key and request after two thirds of
//! the certificate's life.
//!
//! The agent's RBAC allows `create` and `get` on CertificateSigningRequests and nothing else (it polls rather
//! than watches, which would need `list` and `watch` too).

use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::identity::{AGENT_SIGNER_NAME, NodeNameError, node_server_name};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::auth::IssuedCertificate;
use crate::ca_bundle::TrustedBundle;

/// How long a request may wait before the wait is logged as a warning (the request is kept).
const SIGNING_WAIT: Duration = Duration::from_secs(120);
/// The longest pause between two reads of a pending request.
const MAX_POLL: Duration = Duration::from_secs(30);

/// The pause after the `reads`-th read of a pending request: a second at first, doubling up to [`MAX_POLL`].
pub fn poll_interval(reads: u32) -> Duration {
    Duration::from_secs(1u64 << reads.min(6)).min(MAX_POLL)
}

#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error(transparent)]
    NodeName(#[from] NodeNameError),
    #[error("making the key or request: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what}: {source}")]
    Api { what: &'static str, source: kube::Error },
    #[error("CertificateSigningRequest {name} was {condition}: {reason}: {message}")]
    Refused { name: String, condition: String, reason: String, message: String },
    #[error("CertificateSigningRequest {name} was deleted before it was signed")]
    Gone { name: String },
    #[error("CertificateSigningRequest {name}: the issued certificate is unreadable: {reason}")]
    Unreadable { name: String, reason: String },
}

/// A certificate and its key (PEM), and how long it is valid from now.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub remaining: Duration,
}

/// Requests one certificate for `node` (and `shared_name`, the name every agent carries for its metrics
/// Service, when given: the operator signs it only when configured with the same name) and waits until it is
/// signed.
pub async fn request(client: &Client, node: &str, shared_name: Option<&str>) -> Result<Issued, CsrError> {
    let dns_name = node_server_name(node)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let names = std::iter::once(dns_name.clone()).chain(shared_name.map(str::to_owned)).collect::<Vec<_>>();
    let mut params = rcgen::CertificateParams::new(names)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, dns_name);
    let pem = params.serialize_request(&key)?.pem()?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            // Node names may be 253 characters long; the API server completes the name.
            generate_name: Some("isthmus-agent-".into()),
            labels: Some([("isthmus.dev/node".to_owned(), label_value(node))].into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: AGENT_SIGNER_NAME.into(),
            usages: Some(vec!["digital signature".into(), "server auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|source| CsrError::Api { what: "creating a CertificateSigningRequest", source })?;
    let name = created.name_any();
    tracing::info!(csr = %name, node, "requested a serving certificate");
    let started = tokio::time::Instant::now();
    let mut warned = false;
    let mut reads: u32 = 0;
    loop {
        let current = match api.get_opt(&name).await {
            Ok(Some(current)) => current,
            Ok(None) => return Err(CsrError::Gone { name }),
            // The API server is unreachable for a while: the request stands, read it again later.
            Err(e) => {
                tracing::warn!(csr = %name, error = %e, "reading the CertificateSigningRequest");
                tokio::time::sleep(poll_interval(reads)).await;
                reads = reads.saturating_add(1);
                continue;
            }
        };
        let status = current.status.unwrap_or_default();
        if let Some(refusal) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(CsrError::Refused {
                name,
                condition: refusal.type_,
                reason: refusal.reason.unwrap_or_default(),
                message: refusal.message.unwrap_or_default(),
            });
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            let cert_pem = String::from_utf8(cert.0)
                .map_err(|_| CsrError::Unreadable { name: name.clone(), reason: "not PEM text".into() })?;
            let remaining =
                remaining(&cert_pem).map_err(|reason| CsrError::Unreadable { name: name.clone(), reason })?;
            return Ok(Issued { cert_pem, key_pem: key.serialize_pem(), remaining });
        }
        if !warned && started.elapsed() >= SIGNING_WAIT {
            warned = true;
            tracing::warn!(csr = %name, waited = ?SIGNING_WAIT, "not signed yet (is the operator running?); waiting on the same request");
        }
        tokio::time::sleep(poll_interval(reads)).await;
        reads = reads.saturating_add(1);
    }
}

/// How long the first certificate of `pem` is still valid.
fn remaining(pem: &str) -> Result<Duration, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| e.to_string())?;
    let cert = block.parse_x509().map_err(|e| e.to_string())?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let left = cert.validity().not_after.timestamp().saturating_sub(i64::try_from(now).unwrap_or(i64::MAX));
    Ok(Duration::from_secs(u64::try_from(left).unwrap_or(0)))
}

/// A label value for the node (at most 63 characters): for finding an agent's requests with kubectl.
fn label_value(node: &str) -> String {
    let cut: String = node.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_owned()
}

/// Keeps `into` holding a valid certificate: one request now, waited on until it is signed (a denied or deleted
/// one, or one that could not be made, is followed by a new one after a back-off of up to a minute), then a new
/// one after two thirds of each certificate's life, or at once when `bundle` retires the CA that issued it.
pub fn spawn(
    client: Client,
    node: String,
    shared_name: Option<String>,
    into: Arc<IssuedCertificate>,
    bundle: Arc<TrustedBundle>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(2);
        loop {
            match request(&client, &node, shared_name.as_deref()).await {
                Ok(issued) => {
                    let renew_in = issued.remaining.mul_f64(2.0 / 3.0);
                    tracing::info!(node = %node, valid_for = ?issued.remaining, ?renew_in, "serving certificate issued");
                    let cert_pem = issued.cert_pem.clone();
                    into.set(issued.cert_pem.into_bytes(), issued.key_pem.into_bytes());
                    backoff = Duration::from_secs(2);
                    until_renewal(&bundle, &cert_pem, &node, renew_in.max(Duration::from_secs(60))).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "no serving certificate");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    })
}

/// Waits `due`, or until `bundle` retires the CA that issued `cert_pem` (the operator replaced its CA and
/// trusts the old one only until every agent holds a certificate from the new one).
async fn until_renewal(bundle: &TrustedBundle, cert_pem: &str, node: &str, due: Duration) {
    let Ok(dns_name) = node_server_name(node) else { return tokio::time::sleep(due).await };
    let mut changes = bundle.subscribe();
    let due = tokio::time::sleep(due);
    tokio::pin!(due);
    loop {
        if bundle.bundle().is_some_and(|b| b.retires(cert_pem.as_bytes(), &dns_name)) {
            tracing::info!(node, "the operator retired the CA of this agent's certificate; asking for a new one now");
            return;
        }
        tokio::select! {
            _ = &mut due => return,
            changed = changes.changed() => if changed.is_err() {
                return due.await;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_request_is_read_ever_less_often() {
        let pauses: Vec<u64> = (0..8).map(|r| poll_interval(r).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(poll_interval(u32::MAX), MAX_POLL);
        // The first two minutes: 7 reads, where one read a second made 120.
        let mut waited = 0;
        let reads = (0..).take_while(|r| {
            waited += poll_interval(*r).as_secs();
            waited <= 120
        });
        assert_eq!(reads.count(), 7);
    }

    #[test]
    fn label_values_fit_and_end_cleanly() {
        assert_eq!(label_value("node-a"), "node-a");
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
        assert_eq!(label_value(&long), "a".repeat(62));
    }

    #[test]
    fn the_remaining_life_of_a_certificate_is_read_from_it() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["n.node.isthmus".to_owned()]).unwrap();
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::hours(10);
        let cert = params.self_signed(&key).unwrap();
        let left = remaining(&cert.pem()).unwrap();
        assert!(left <= Duration::from_secs(36_000) && left > Duration::from_secs(35_000), "{left:?}");
        assert!(remaining("garbage").is_err());
    }
}
