//! Whether an agent's CertificateSigningRequest is approved: a pure decision over the request and the facts the
//! signer looked up, with the reason of a denial as an enum.
//!
//! Approve only when every check holds:
//! - the requester is exactly the agents' ServiceAccount;
//! - the API server bound its token to exactly one node and one pod (`authentication.kubernetes.io/node-name`,
//!   `pod-name`, `pod-uid`, set from a pod-bound token; a token that is not pod-bound carries none);
//! - that pod exists, is the agent DaemonSet's (labels and owner), runs on that node and has that UID;
//! - the usages are exactly `digital signature` and `server auth`;
//! - the PKCS#10 request is well-formed and self-signed, asks for no extension but names and usages, and its
//!   names are exactly the node's DNS name ([`node_server_name`]), or that name and the agents' shared metrics name
//!   when one is configured ([`Request::shared_name`]): no IP, URI, e-mail or wildcard.
//!
//! What is signed is the signer's, not the request's: only the public key is taken from it.

use std::collections::BTreeMap;

use isthmus_agent_api::identity::node_server_name;
use rcgen::{CertificateSigningRequestParams, ExtendedKeyUsagePurpose, SanType};

use super::names::ServiceDnsName;

pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// The usages an agent's request must list, exactly.
pub const USAGES: [&str; 2] = ["digital signature", "server auth"];

/// Why a request was denied: the `reason` of its `Denied` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// Not requested by the agents' ServiceAccount.
    NotAgentServiceAccount,
    /// The requester's token names no node, or several (not a pod-bound token).
    NoNodeBinding,
    /// The node's name has no agent DNS name (too long, not DNS-1123).
    InvalidNodeName,
    /// The token names no pod of the agent DaemonSet on that node with that UID.
    NotAgentPod,
    /// Usages other than exactly `digital signature` and `server auth`.
    WrongUsages,
    /// The PKCS#10 request does not parse, its signature does not verify, or it asks for other extensions.
    UnreadableRequest,
    /// The request names anything but exactly the node's DNS name.
    WrongNames,
    /// A newer request of the same pod waits too: only a pod's newest is signed (super::waiting).
    Superseded,
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::NotAgentServiceAccount => "NotAgentServiceAccount",
            DenyReason::NoNodeBinding => "NoNodeBinding",
            DenyReason::InvalidNodeName => "InvalidNodeName",
            DenyReason::NotAgentPod => "NotAgentPod",
            DenyReason::WrongUsages => "WrongUsages",
            DenyReason::UnreadableRequest => "UnreadableRequest",
            DenyReason::WrongNames => "WrongNames",
            DenyReason::Superseded => "Superseded",
        }
    }
}

/// The requester's pod as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub node: Option<String>,
    /// Carries the agent selector's labels and is controlled by a DaemonSet.
    pub is_agent: bool,
}

/// One CertificateSigningRequest and what the signer looked up for it.
pub struct Request<'a> {
    pub username: &'a str,
    pub extra: &'a BTreeMap<String, Vec<String>>,
    pub usages: &'a [String],
    /// `spec.request`: a PEM PKCS#10 request.
    pub pem: &'a [u8],
    /// The pod named by [`EXTRA_POD_NAME`] in the agents' namespace, when it exists.
    pub pod: Option<&'a PodFacts>,
    /// The DNS name every agent's certificate may carry besides its node's, the same for all of them (the
    /// headless Service of the agents' metrics port, `<service>.<namespace>.svc`): the one name a scraper that
    /// reaches every agent can verify. None: only the node's name.
    pub shared_name: Option<&'a ServiceDnsName>,
}

#[derive(Debug)]
pub enum CsrDecision {
    Approve {
        node: String,
        /// The DNS name to sign: the node's.
        dns_name: String,
        /// The agents' shared name, when the request asked for it (and it is configured).
        shared_name: Option<String>,
        public_key: rcgen::PublicKey,
    },
    Deny {
        reason: DenyReason,
        message: String,
    },
}

fn deny(reason: DenyReason, message: impl Into<String>) -> CsrDecision {
    CsrDecision::Deny { reason, message: message.into() }
}

/// The one value of an extra key, if there is exactly one.
pub fn single<'a>(extra: &'a BTreeMap<String, Vec<String>>, key: &str) -> Option<&'a str> {
    match extra.get(key).map(Vec::as_slice) {
        Some([one]) => Some(one.as_str()),
        _ => None,
    }
}

/// Decides on `request`; `agent_username` is `system:serviceaccount:<namespace>:<agent ServiceAccount>`.
pub fn review(request: &Request<'_>, agent_username: &str) -> CsrDecision {
    if request.username != agent_username {
        return deny(
            DenyReason::NotAgentServiceAccount,
            format!("requested by {:?}, not by the agents' ServiceAccount {agent_username:?}", request.username),
        );
    }
    let Some(node) = single(request.extra, EXTRA_NODE_NAME) else {
        return deny(
            DenyReason::NoNodeBinding,
            format!("the requester's token must name exactly one node ({EXTRA_NODE_NAME}): use a pod-bound token"),
        );
    };
    let dns_name = match node_server_name(node) {
        Ok(name) => name,
        Err(e) => return deny(DenyReason::InvalidNodeName, e.to_string()),
    };
    let (pod_name, pod_uid) = (single(request.extra, EXTRA_POD_NAME), single(request.extra, EXTRA_POD_UID));
    let pod_ok = matches!((pod_name, pod_uid, request.pod),
        (Some(_), Some(uid), Some(pod)) if pod.is_agent && pod.uid == uid && pod.node.as_deref() == Some(node));
    if !pod_ok {
        return deny(
            DenyReason::NotAgentPod,
            format!(
                "the requester's pod {:?} (uid {:?}) is not an agent pod on node {node:?}: {}",
                pod_name.unwrap_or(""),
                pod_uid.unwrap_or(""),
                match request.pod {
                    None => "no such pod".to_owned(),
                    Some(p) if !p.is_agent => "not of the agent DaemonSet".to_owned(),
                    Some(p) if Some(p.uid.as_str()) != pod_uid => format!("its uid is {:?}", p.uid),
                    Some(p) => format!("it runs on {:?}", p.node.as_deref().unwrap_or("no node")),
                }
            ),
        );
    }
    let mut usages: Vec<&str> = request.usages.iter().map(String::as_str).collect();
    usages.sort_unstable();
    if usages != USAGES {
        return deny(DenyReason::WrongUsages, format!("usages {:?}; expected exactly {USAGES:?}", request.usages));
    }
    let Ok(pem) = std::str::from_utf8(request.pem) else {
        return deny(DenyReason::UnreadableRequest, "spec.request is not PEM text");
    };
    let parsed = match CertificateSigningRequestParams::from_pem(pem) {
        Ok(p) => p,
        Err(e) => return deny(DenyReason::UnreadableRequest, format!("spec.request: {e}")),
    };
    let names = &parsed.params.subject_alt_names;
    let shared = request.shared_name.map(ServiceDnsName::as_str);
    let is = |san: &SanType, name: &str| matches!(san, SanType::DnsName(n) if n.as_str() == name);
    let shared_name = match (names.as_slice(), shared) {
        ([own], _) if is(own, &dns_name) => None,
        ([own, also], Some(shared)) if is(own, &dns_name) && is(also, shared) => Some(shared.to_owned()),
        _ => {
            return deny(
                DenyReason::WrongNames,
                match shared {
                    None => format!("the request names {names:?}; expected exactly the DNS name {dns_name:?}"),
                    Some(shared) => format!(
                        "the request names {names:?}; expected exactly the DNS name {dns_name:?}, or it and then \
                         {shared:?}"
                    ),
                },
            );
        }
    };
    let ekus = &parsed.params.extended_key_usages;
    if ekus.iter().any(|u| *u != ExtendedKeyUsagePurpose::ServerAuth) {
        return deny(DenyReason::WrongUsages, format!("the request asks for extended key usages {ekus:?}"));
    }
    CsrDecision::Approve { node: node.to_owned(), dns_name, shared_name, public_key: parsed.public_key }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "system:serviceaccount:isthmus-system:isthmus-agent";

    fn csr(sans: Vec<SanType>, tweak: impl FnOnce(&mut rcgen::CertificateParams)) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans;
        tweak(&mut params);
        params.serialize_request(&key).unwrap().pem().unwrap().into_bytes()
    }

    fn dns(name: &str) -> SanType {
        SanType::DnsName(name.try_into().unwrap())
    }

    struct Case {
        username: String,
        extra: BTreeMap<String, Vec<String>>,
        usages: Vec<String>,
        pem: Vec<u8>,
        pod: Option<PodFacts>,
        shared_name: Option<ServiceDnsName>,
    }

    impl Case {
        fn good() -> Self {
            let extra = [(EXTRA_NODE_NAME, "node-a"), (EXTRA_POD_NAME, "isthmus-agent-x1"), (EXTRA_POD_UID, "u1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), vec![v.to_owned()]))
                .collect();
            Case {
                username: AGENT.to_owned(),
                extra,
                usages: vec!["server auth".into(), "digital signature".into()],
                pem: csr(vec![dns("node-a.node.isthmus")], |_| {}),
                pod: Some(PodFacts { uid: "u1".into(), node: Some("node-a".into()), is_agent: true }),
                shared_name: None,
            }
        }

        fn decision(&self) -> CsrDecision {
            review(
                &Request {
                    username: &self.username,
                    extra: &self.extra,
                    usages: &self.usages,
                    pem: &self.pem,
                    pod: self.pod.as_ref(),
                    shared_name: self.shared_name.as_ref(),
                },
                AGENT,
            )
        }

        fn denied(self) -> DenyReason {
            match self.decision() {
                CsrDecision::Deny { reason, message } => {
                    assert!(!message.is_empty());
                    reason
                }
                v => panic!("approved: {v:?}"),
            }
        }
    }

    #[test]
    fn the_agent_on_its_own_node_is_approved_for_its_nodes_name() {
        match Case::good().decision() {
            CsrDecision::Approve { node, dns_name, .. } => {
                assert_eq!((node.as_str(), dns_name.as_str()), ("node-a", "node-a.node.isthmus"))
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn another_requester_is_denied() {
        for user in ["system:serviceaccount:isthmus-system:default", "system:node:node-a", "admin", ""] {
            let case = Case { username: user.into(), ..Case::good() };
            assert_eq!(case.denied(), DenyReason::NotAgentServiceAccount, "{user}");
        }
    }

    #[test]
    fn a_token_not_bound_to_one_node_is_denied() {
        let mut none = Case::good();
        none.extra.remove(EXTRA_NODE_NAME);
        assert_eq!(none.denied(), DenyReason::NoNodeBinding);
        let mut two = Case::good();
        two.extra.insert(EXTRA_NODE_NAME.into(), vec!["node-a".into(), "node-b".into()]);
        assert_eq!(two.denied(), DenyReason::NoNodeBinding);
        let mut bad = Case::good();
        bad.extra.insert(EXTRA_NODE_NAME.into(), vec!["Node_A".into()]);
        assert_eq!(bad.denied(), DenyReason::InvalidNodeName);
    }

    #[test]
    fn a_pod_that_is_not_the_agent_on_that_node_is_denied() {
        type Tweak = Box<dyn Fn(&mut Case)>;
        let tweaks: Vec<Tweak> = vec![
            Box::new(|c| c.pod = None),
            Box::new(|c| c.pod.as_mut().unwrap().is_agent = false),
            Box::new(|c| c.pod.as_mut().unwrap().node = Some("node-b".into())),
            Box::new(|c| c.pod.as_mut().unwrap().node = None),
            Box::new(|c| c.pod.as_mut().unwrap().uid = "u2".into()),
            Box::new(|c| {
                c.extra.remove(EXTRA_POD_UID);
            }),
            Box::new(|c| {
                c.extra.remove(EXTRA_POD_NAME);
            }),
        ];
        for (i, tweak) in tweaks.iter().enumerate() {
            let mut case = Case::good();
            tweak(&mut case);
            assert_eq!(case.denied(), DenyReason::NotAgentPod, "case {i}");
        }
    }

    #[test]
    fn other_usages_are_denied() {
        for usages in [
            vec!["server auth"],
            vec!["digital signature", "server auth", "client auth"],
            vec!["digital signature", "client auth"],
        ] {
            let case = Case { usages: usages.iter().map(|u| (*u).to_owned()).collect(), ..Case::good() };
            assert_eq!(case.denied(), DenyReason::WrongUsages, "{usages:?}");
        }
        let eku = Case {
            pem: csr(vec![dns("node-a.node.isthmus")], |p| {
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth]
            }),
            ..Case::good()
        };
        assert_eq!(eku.denied(), DenyReason::WrongUsages);
    }

    #[test]
    fn a_request_naming_anything_but_the_nodes_name_is_denied() {
        let cases = vec![
            vec![dns("node-b.node.isthmus")],
            vec![dns("node-a")],
            vec![dns("*.node.isthmus")],
            vec![dns("node-a.node.isthmus"), dns("node-b.node.isthmus")],
            vec![dns("node-a.node.isthmus"), SanType::IpAddress("10.0.0.1".parse().unwrap())],
            vec![dns("node-a.node.isthmus"), SanType::URI("spiffe://x".try_into().unwrap())],
            vec![dns("isthmus-operator.isthmus-system.serviceaccount.isthmus")],
            vec![],
        ];
        for sans in cases {
            let case = Case { pem: csr(sans.clone(), |_| {}), ..Case::good() };
            assert_eq!(case.denied(), DenyReason::WrongNames, "{sans:?}");
        }
    }

    const SHARED: &str = "isthmus-agent-metrics.isthmus-system.svc";

    fn shared() -> ServiceDnsName {
        ServiceDnsName::new(SHARED).unwrap()
    }

    #[test]
    fn the_shared_name_is_signed_only_when_configured_and_only_after_the_nodes_name() {
        let both = || csr(vec![dns("node-a.node.isthmus"), dns(SHARED)], |_| {});
        match (Case { pem: both(), shared_name: Some(shared()), ..Case::good() }).decision() {
            CsrDecision::Approve { dns_name, shared_name, .. } => {
                assert_eq!((dns_name.as_str(), shared_name.as_deref()), ("node-a.node.isthmus", Some(SHARED)));
            }
            v => panic!("{v:?}"),
        }
        // Configured but not asked for: the node's name alone, as before.
        match (Case { shared_name: Some(shared()), ..Case::good() }).decision() {
            CsrDecision::Approve { shared_name: None, .. } => {}
            v => panic!("{v:?}"),
        }
        // Not configured: a request for it is forged.
        assert_eq!(Case { pem: both(), ..Case::good() }.denied(), DenyReason::WrongNames);
        let denied = [
            vec![dns(SHARED)],
            vec![dns(SHARED), dns("node-a.node.isthmus")],
            vec![dns("node-a.node.isthmus"), dns("other.isthmus-system.svc")],
            vec![dns("node-a.node.isthmus"), dns(SHARED), dns(SHARED)],
            vec![dns("node-b.node.isthmus"), dns(SHARED)],
            vec![dns("node-a.node.isthmus"), dns(SHARED), SanType::IpAddress("10.0.0.1".parse().unwrap())],
        ];
        for sans in denied {
            let case = Case { pem: csr(sans.clone(), |_| {}), shared_name: Some(shared()), ..Case::good() };
            assert_eq!(case.denied(), DenyReason::WrongNames, "{sans:?}");
        }
    }

    #[test]
    fn a_ca_request_or_garbage_is_denied() {
        let ca = Case {
            // basicConstraints CA:TRUE (rcgen writes no CA bit into requests, so spelled out).
            pem: csr(vec![dns("node-a.node.isthmus")], |p| {
                p.custom_extensions =
                    vec![rcgen::CustomExtension::from_oid_content(&[2, 5, 29, 19], vec![0x30, 0x03, 0x01, 0x01, 0xff])]
            }),
            ..Case::good()
        };
        assert_eq!(ca.denied(), DenyReason::UnreadableRequest);
        let garbage = Case {
            pem: b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_vec(),
            ..Case::good()
        };
        assert_eq!(garbage.denied(), DenyReason::UnreadableRequest);
        let binary = Case { pem: vec![0xff, 0xfe], ..Case::good() };
        assert_eq!(binary.denied(), DenyReason::UnreadableRequest);
        // A valid request whose signature was tampered with (another key's public key spliced in) does not verify.
        let mut text = String::from_utf8(Case::good().pem).unwrap();
        let mid = text.len() / 2;
        let c = if &text[mid..=mid] == "A" { "B" } else { "A" };
        text.replace_range(mid..=mid, c);
        let tampered = Case { pem: text.into_bytes(), ..Case::good() };
        assert_eq!(tampered.denied(), DenyReason::UnreadableRequest);
    }
}
