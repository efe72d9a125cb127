//! Whether every agent has moved off the retired CAs (a CA replaced when its Secret was deleted): each agent pod
//! running on a node must hold a certificate from the CAs in force. What an agent holds is read from its newest
//! signed CertificateSigningRequest, which the API server keeps for an hour after it is issued; the agents ask
//! again within seconds of the bundle naming their CA retired, so an hour is plenty, and a request cleaned up
//! before that only delays the hand-over until whatever the retired CAs issued has expired
//! ([`CaSet::settle`](super::ca::CaSet::settle)). The decision is pure ([`agents_not_moved`]); one function
//! lists what it reads.

use isthmus_agent_api::identity::{AGENT_SIGNER_NAME, node_server_name};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::ca::CaSet;
use super::review::{EXTRA_POD_NAME, EXTRA_POD_UID, single};
use super::signer::SignerConfig;
use super::store::StoreError;

/// The agent pods that still hold a certificate from a retired CA, by name, as the API server has them now.
pub async fn agents_on_retired_cas(
    client: &Client,
    agents: &SignerConfig,
    ca: &CaSet,
) -> Result<Vec<String>, StoreError> {
    let api_error = |what, namespace: &str, name: &str, source| StoreError::Api {
        what,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source: Box::new(source),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &agents.agent_namespace);
    let pods = pods
        .list(&ListParams::default().labels(&agents.agent_labels))
        .await
        .map_err(|e| api_error("listing agent pods", &agents.agent_namespace, &agents.agent_labels, e))?;
    let pods: Vec<_> = pods.items.into_iter().filter(|p| agents.is_agent(p)).collect();
    let requests: Api<CertificateSigningRequest> = Api::all(client.clone());
    let requests = requests
        .list(&ListParams::default().fields(&format!("spec.signerName={AGENT_SIGNER_NAME}")))
        .await
        .map_err(|e| api_error("listing CertificateSigningRequests", "", AGENT_SIGNER_NAME, e))?;
    Ok(agents_not_moved(&pods, &requests.items, ca))
}

/// An agent pod that still depends on a retired CA: its name, for the log.
pub fn agents_not_moved(agent_pods: &[Pod], requests: &[CertificateSigningRequest], ca: &CaSet) -> Vec<String> {
    agent_pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let node = pod.spec.as_ref()?.node_name.as_deref()?;
            let moved = node_server_name(node).is_ok_and(|dns_name| {
                newest_certificate(requests, pod).is_some_and(|cert| ca.issued_in_force(cert, &dns_name))
            });
            (!moved).then(|| pod.name_any())
        })
        .collect()
}

/// The certificate of the newest signed request made by `pod` (the same name and UID).
fn newest_certificate<'a>(requests: &'a [CertificateSigningRequest], pod: &Pod) -> Option<&'a str> {
    requests
        .iter()
        .filter(|r| {
            let extra = r.spec.extra.as_ref();
            let by = |key| extra.and_then(|e| single(e, key));
            by(EXTRA_POD_NAME) == Some(pod.name_any().as_str()) && by(EXTRA_POD_UID) == pod.uid().as_deref()
        })
        .filter_map(|r| {
            let cert = r.status.as_ref()?.certificate.as_ref()?;
            Some((r.metadata.creation_timestamp.as_ref(), std::str::from_utf8(&cert.0).ok()?))
        })
        .max_by_key(|(created, _)| created.map(|t| t.0))
        .map(|(_, cert)| cert)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestSpec, CertificateSigningRequestStatus};
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};
    use time::OffsetDateTime;

    use super::*;
    use crate::pki::ca::Authority;

    const DAY: Duration = Duration::from_secs(86_400);

    fn pod(name: &str, node: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some(name.into()), uid: Some(format!("uid-{name}")), ..Default::default() },
            spec: Some(PodSpec { node_name: node.map(Into::into), ..Default::default() }),
            ..Default::default()
        }
    }

    fn signed(ca: &CaSet, pod: &str, node: &str, age_s: i64) -> CertificateSigningRequest {
        let dns_name = node_server_name(node).unwrap();
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::new(vec![dns_name.clone()]).unwrap().serialize_request(&key).unwrap();
        let public_key = rcgen::CertificateSigningRequestParams::from_der(csr.der()).unwrap().public_key;
        let cert = ca.sign_serving(&public_key, &dns_name, None, OffsetDateTime::now_utc(), DAY).unwrap();
        let extra = BTreeMap::from([
            (EXTRA_POD_NAME.to_owned(), vec![pod.to_owned()]),
            (EXTRA_POD_UID.to_owned(), vec![format!("uid-{pod}")]),
        ]);
        let created = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(age_s);
        CertificateSigningRequest {
            metadata: ObjectMeta { creation_timestamp: Some(Time(created)), ..Default::default() },
            spec: CertificateSigningRequestSpec { extra: Some(extra), ..Default::default() },
            status: Some(CertificateSigningRequestStatus {
                certificate: Some(ByteString(cert.into_bytes())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn an_agent_has_moved_when_its_newest_signed_request_is_from_a_ca_in_force() {
        let now = OffsetDateTime::now_utc();
        let old = CaSet::new(Authority::generate(now, 365 * DAY).unwrap());
        let new = CaSet::replacing(&old.bundle(), now, 365 * DAY).unwrap();
        let pods = [pod("agent-a", Some("a")), pod("agent-b", Some("b")), pod("agent-pending", None)];
        let mut deleting = pod("agent-gone", Some("c"));
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let pods = [pods.as_slice(), &[deleting]].concat();

        let before = [signed(&old, "agent-a", "a", 100), signed(&old, "agent-b", "b", 100)];
        assert_eq!(agents_not_moved(&pods, &before, &new), ["agent-a", "agent-b"]);
        // agent-a asked again; agent-b's new certificate names another node; a request of a pod of the same
        // name but another UID (a pod made again) is not agent-b's.
        let mut other_uid = signed(&new, "agent-b", "b", 5);
        other_uid.spec.extra.as_mut().unwrap().insert(EXTRA_POD_UID.to_owned(), vec!["uid-earlier".into()]);
        let during =
            [before.as_slice(), &[signed(&new, "agent-a", "a", 10), signed(&new, "agent-b", "x", 10), other_uid]]
                .concat();
        assert_eq!(agents_not_moved(&pods, &during, &new), ["agent-b"]);
        let after = [during.as_slice(), &[signed(&new, "agent-b", "b", 1)]].concat();
        assert!(
            agents_not_moved(&pods, &after, &new).is_empty(),
            "a pod without a node or going away waits for nothing"
        );
        // The newest request decides: an older one from the new CA does not hide a newer one from a retired CA.
        let regressed = [after.as_slice(), &[signed(&old, "agent-b", "b", 0)]].concat();
        assert_eq!(agents_not_moved(&pods, &regressed, &new), ["agent-b"]);
    }
}
