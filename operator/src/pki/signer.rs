//! The signer of `isthmus.dev/agent-serving`: watches the CertificateSigningRequests for that signer and, as
//! the leader, approves and signs those [`review`](super::review) accepts and denies the rest, naming the
//! failed check. Kubernetes' own controllers leave requests for a custom signer alone.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use isthmus_agent_api::identity::AGENT_SIGNER_NAME;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::names::ServiceDnsName;
use super::review::{CsrDecision, DenyReason, EXTRA_POD_NAME, PodFacts, Request, review, single};
use super::store::Pki;
use super::waiting::{WaitingRequests, is_waiting};

/// Who may request agent certificates, and for how long they are signed.
#[derive(Debug, Clone)]
pub struct SignerConfig {
    pub agent_namespace: String,
    pub agent_service_account: String,
    /// The agent pods' labels (`key=value,…`).
    pub agent_labels: String,
    /// The longest lifetime signed; a shorter `spec.expirationSeconds` is honoured.
    pub validity: Duration,
    /// The DNS name every agent's certificate may carry besides its node's (the agents' metrics Service,
    /// `<service>.<namespace>.svc`); None: only the node's (super::review).
    pub agent_shared_name: Option<ServiceDnsName>,
}

impl SignerConfig {
    fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.agent_namespace, self.agent_service_account)
    }

    /// Whether `pod` is one of the agent DaemonSet's (its labels and its controller).
    pub fn is_agent(&self, pod: &Pod) -> bool {
        let labels = pod.labels();
        let labelled = self.agent_labels.split(',').filter(|s| !s.is_empty()).all(|pair| {
            pair.split_once('=').is_some_and(|(k, v)| labels.get(k.trim()).map(String::as_str) == Some(v.trim()))
        });
        let by_daemonset = pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "DaemonSet" && o.api_version == "apps/v1" && o.controller == Some(true));
        labelled && by_daemonset
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("CertificateSigningRequest {name}: {what}: {source}")]
    Api { name: String, what: &'static str, source: kube::Error },
    #[error("CertificateSigningRequest {name}: {source}")]
    Sign { name: String, source: super::ca::PkiError },
}

/// Runs until `shutdown`; acts only while `leader` says so (a new leader sees every pending request again when
/// its watch re-lists).
pub async fn run(
    client: Client,
    pki: Arc<Pki>,
    config: SignerConfig,
    leader: tokio::sync::watch::Receiver<bool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, &config.agent_namespace);
    let watch_config = watcher::Config::default().fields(&format!("spec.signerName={AGENT_SIGNER_NAME}"));
    let mut leader_changes = leader.clone();
    loop {
        let mut events = watcher(csrs.clone(), watch_config.clone()).boxed();
        // The requests waiting, by pod, and those of a (re)list in progress: a list is decided only once it is
        // complete, so that a pod's older requests are known to be superseded before any is signed.
        let mut waiting = WaitingRequests::default();
        let mut listing: Vec<CertificateSigningRequest> = Vec::new();
        loop {
            let event = tokio::select! {
                e = events.next() => e,
                _ = shutdown.wait_for(|s| *s) => return,
                // On becoming the leader, start over: the re-list shows every request still pending.
                r = leader_changes.changed() => {
                    if r.is_err() { return }
                    if *leader_changes.borrow() { break } else { continue }
                }
            };
            let batch = match event {
                Some(Ok(watcher::Event::Init)) => {
                    listing.clear();
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(csr))) => {
                    listing.push(csr);
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    waiting.replace_all(&listing);
                    let mut listed = std::mem::take(&mut listing);
                    listed.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
                    listed
                }
                Some(Ok(watcher::Event::Apply(csr))) => {
                    waiting.update(&csr);
                    vec![csr]
                }
                Some(Ok(watcher::Event::Delete(csr))) => {
                    waiting.remove(&csr.name_any());
                    continue;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching CertificateSigningRequests");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    continue;
                }
                None => break,
            };
            if !*leader.borrow() {
                continue;
            }
            for csr in batch {
                if let Err(e) = handle(&csrs, &pods, &pki, &config, &waiting, csr).await {
                    tracing::warn!(error = %e, "agent certificate request");
                }
            }
        }
    }
}

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

async fn handle(
    csrs: &Api<CertificateSigningRequest>,
    pods: &Api<Pod>,
    pki: &Pki,
    config: &SignerConfig,
    waiting: &WaitingRequests,
    mut csr: CertificateSigningRequest,
) -> Result<(), SignerError> {
    let name = csr.name_any();
    if !is_waiting(&csr) || csr.spec.signer_name != AGENT_SIGNER_NAME {
        return Ok(());
    }
    let decision = match waiting.superseded_by(&name) {
        Some(newer) => CsrDecision::Deny {
            reason: DenyReason::Superseded,
            message: format!(
                "the same agent pod asked again in {newer}: only a pod's newest request is signed (an earlier one \
                 was made by a process that is gone, or while the signer was down)"
            ),
        },
        None => review_request(pods, config, &csr, &name).await?,
    };
    match decision {
        // Approved by someone else (an administrator's `kubectl certificate approve`) but not what the signer
        // issues: a signer may not deny an approved request, it marks it Failed and signs nothing.
        CsrDecision::Deny { reason, message } if has_condition(&csr, "Approved") => {
            tracing::warn!(csr = %name, reason = reason.as_str(), %message, "not signing an approved agent certificate request");
            set_condition(&mut csr, "Failed", reason.as_str(), &message);
            csrs.replace_status(&name, &PostParams::default(), &csr).await.map_err(|source| SignerError::Api {
                name,
                what: "marking failed",
                source,
            })?;
        }
        CsrDecision::Deny { reason, message } => {
            tracing::warn!(csr = %name, reason = reason.as_str(), %message, "denied an agent certificate request");
            set_condition(&mut csr, "Denied", reason.as_str(), &message);
            csrs.replace_subresource("approval", &name, &PostParams::default(), &csr)
                .await
                .map_err(|source| SignerError::Api { name, what: "denying", source })?;
        }
        CsrDecision::Approve { node, dns_name, shared_name, public_key } => {
            if !has_condition(&csr, "Approved") {
                set_condition(
                    &mut csr,
                    "Approved",
                    "AgentOnItsNode",
                    &format!("the agent on node {node} for {dns_name}"),
                );
                csr = csrs
                    .replace_subresource("approval", &name, &PostParams::default(), &csr)
                    .await
                    .map_err(|source| SignerError::Api { name: name.clone(), what: "approving", source })?;
            }
            let requested = csr.spec.expiration_seconds.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs);
            let validity = requested.map_or(config.validity, |r| r.min(config.validity));
            let cert = pki
                .ca()
                .sign_serving(&public_key, &dns_name, shared_name.as_deref(), time::OffsetDateTime::now_utc(), validity)
                .map_err(|source| SignerError::Sign { name: name.clone(), source })?;
            csr.status.get_or_insert_with(Default::default).certificate = Some(ByteString(cert.into_bytes()));
            csrs.replace_status(&name, &PostParams::default(), &csr).await.map_err(|source| SignerError::Api {
                name: name.clone(),
                what: "writing the certificate",
                source,
            })?;
            tracing::info!(csr = %name, %node, ?validity, "signed an agent's serving certificate");
            // The agent may have been the last on a retired CA: the upkeep looks at once.
            if pki.ca().has_retired() {
                pki.wake();
            }
        }
    }
    Ok(())
}

/// Looks up the requester's pod and reviews the request.
async fn review_request(
    pods: &Api<Pod>,
    config: &SignerConfig,
    csr: &CertificateSigningRequest,
    name: &str,
) -> Result<CsrDecision, SignerError> {
    let extra = csr.spec.extra.clone().unwrap_or_default();
    let pod = match single(&extra, EXTRA_POD_NAME) {
        Some(pod_name) => pods
            .get_opt(pod_name)
            .await
            .map_err(|source| SignerError::Api { name: name.to_owned(), what: "reading the requester's pod", source })?
            .map(|p| PodFacts {
                uid: p.uid().unwrap_or_default(),
                node: p.spec.as_ref().and_then(|s| s.node_name.to_owned()),
                is_agent: config.is_agent(&p),
            }),
        None => None,
    };
    let usages = csr.spec.usages.clone().unwrap_or_default();
    let decision = review(
        &Request {
            username: csr.spec.username.as_deref().unwrap_or(""),
            extra: &extra,
            usages: &usages,
            pem: &csr.spec.request.0,
            pod: pod.as_ref(),
            shared_name: config.agent_shared_name.as_ref(),
        },
        &config.username(),
    );
    Ok(decision)
}

fn set_condition(csr: &mut CertificateSigningRequest, kind: &str, reason: &str, message: &str) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = csr.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != kind);
    conditions.push(CertificateSigningRequestCondition {
        type_: kind.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
}
