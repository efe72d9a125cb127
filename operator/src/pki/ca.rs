//! The isthmus CA as data: one or two authorities (the newest first; the previous one only while a rotation
//! hands over) and the retired ones (replaced when the CA Secret was deleted), how they are written into the CA
//! Secret, which one signs, when to rotate, when to stop trusting a retired one, and the certificates they
//! issue. No I/O: the clock is an argument.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;

/// How long a new CA is published (trusted by agents and the operator) before it signs anything: the CA bundle
/// reaches agents through a ConfigMap volume, which kubelet refreshes within about a minute, and agents re-read
/// it every few seconds.
pub const PROPAGATION: Duration = Duration::from_secs(10 * 60);

/// Clock skew tolerated between the operator and the agents: certificates start this much in the past.
const SKEW: Duration = Duration::from_secs(5 * 60);

/// One CA: its certificate and key.
pub struct Authority {
    /// The CA as an rcgen issuer (re-created from the stored certificate; same name and key).
    issuer: rcgen::Certificate,
    key: KeyPair,
    pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("not_before", &self.not_before).field("not_after", &self.not_after).finish()
    }
}

impl Authority {
    /// A new CA (ECDSA P-256) valid from now for `validity`.
    pub fn generate(now: OffsetDateTime, validity: Duration) -> Result<Self, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(PkiError::Generate)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "isthmus");
        // Distinct names per generation, so that tools showing a chain tell the old CA from the new one.
        name.push(DnType::CommonName, format!("isthmus CA {}", now.unix_timestamp()));
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - SKEW;
        params.not_after = now + validity;
        let cert = params.self_signed(&key).map_err(PkiError::Generate)?;
        Self::parse(&cert.pem(), &key.serialize_pem())
    }

    fn parse(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Stored(format!("CA key: {e}")))?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem)
            .map_err(|e| PkiError::Stored(format!("CA certificate: {e}")))?;
        if !matches!(params.is_ca, IsCa::Ca(_)) {
            return Err(PkiError::Stored("CA certificate: not a CA (basicConstraints)".into()));
        }
        let (not_before, not_after) = (params.not_before, params.not_after);
        // The issuer rcgen signs with: the stored name, key usages and key identifier, and the stored key.
        let issuer = params.self_signed(&key).map_err(|e| PkiError::Stored(format!("CA certificate and key: {e}")))?;
        if issuer.params().distinguished_name.iter().count() == 0 {
            return Err(PkiError::Stored("CA certificate: empty subject".into()));
        }
        let stored_key = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .ok()
            .and_then(|der| {
                let parsed = x509_public_key(&der)?;
                Some(parsed == key.public_key_raw())
            })
            .unwrap_or(false);
        if !stored_key {
            return Err(PkiError::Stored("the CA key does not belong to the CA certificate".into()));
        }
        Ok(Self { issuer, key, pem: cert_pem.trim_end().to_owned() + "\n", not_before, not_after })
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }

    fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    fn copy(&self) -> Result<Self, PkiError> {
        Self::parse(&self.pem, &self.key_pem())
    }

    /// A leaf certificate signed by this CA for `params` (its validity capped at the CA's).
    fn sign(&self, mut params: CertificateParams, public_key: &impl rcgen::PublicKeyData) -> Result<String, PkiError> {
        params.not_after = params.not_after.min(self.not_after);
        params.use_authority_key_identifier_extension = true;
        params.signed_by(public_key, &self.issuer, &self.key).map(|c| c.pem()).map_err(PkiError::Sign)
    }
}

impl Retired {
    fn parse(pem: &str) -> Option<Self> {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        let not_after = OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()?;
        Some(Self { pem: pem.trim_end().to_owned() + "\n", not_after })
    }
}

/// The subject public key bytes of a DER certificate.
fn x509_public_key(der: &CertificateDer<'_>) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    Some(cert.public_key().subject_public_key.data.to_vec())
}

/// The CAs in force, newest first (at most two: the previous one while it hands over), and the retired ones.
#[derive(Debug)]
pub struct CaSet {
    authorities: Vec<Authority>,
    /// CAs replaced without a hand-over (their Secret was deleted, keys and all): still trusted, so that agents
    /// holding certificates from them stay reachable, but never signing, and dropped once every agent holds a
    /// certificate from the CAs in force ([`CaSet::settle`]).
    retired: Vec<Retired>,
}

/// A retired CA: its certificate only (the key went with the Secret).
#[derive(Debug, Clone)]
struct Retired {
    pem: String,
    not_after: OffsetDateTime,
}

/// The CA Secret's keys: every CA certificate and every CA key, PEM, in the same order (newest first), and the
/// retired CAs' certificates (absent while there are none). The bundle ConfigMap publishes the retired ones
/// under the same key, so that an agent holding a certificate from one of them asks for a new one at once.
pub const SECRET_CERTS: &str = "ca.crt";
pub const SECRET_KEYS: &str = "ca.key";
pub const SECRET_RETIRED: &str = "retired.crt";

impl CaSet {
    pub fn new(first: Authority) -> Self {
        Self { authorities: vec![first], retired: Vec::new() }
    }

    /// A new CA replacing those whose certificates `trusted_before` holds (PEM; what the bundle published),
    /// their keys gone: it signs at once, and they stay trusted as retired ones (the expired ones dropped).
    pub fn replacing(trusted_before: &str, now: OffsetDateTime, validity: Duration) -> Result<Self, PkiError> {
        let mut set = Self::new(Authority::generate(now, validity)?);
        for pem in pem_blocks(trusted_before, "CERTIFICATE") {
            // An unreadable block cannot verify anything: leaving it out loses nothing.
            let Some(retired) = Retired::parse(&pem) else { continue };
            if retired.not_after > now && !set.retired.iter().any(|r| r.pem == retired.pem) {
                set.retired.push(retired);
            }
        }
        Ok(set)
    }

    /// From the Secret's PEM strings; certificates and keys pair up in order; `retired` is absent without any.
    pub fn from_pem(certs: &str, keys: &str, retired: Option<&str>) -> Result<Self, PkiError> {
        let cert_blocks = pem_blocks(certs, "CERTIFICATE");
        let key_blocks = pem_blocks(keys, "PRIVATE KEY");
        if cert_blocks.is_empty() || cert_blocks.len() != key_blocks.len() {
            return Err(PkiError::Stored(format!(
                "{SECRET_CERTS} holds {} certificates and {SECRET_KEYS} {} keys; they must pair up (at least one)",
                cert_blocks.len(),
                key_blocks.len()
            )));
        }
        let authorities =
            cert_blocks.iter().zip(&key_blocks).map(|(c, k)| Authority::parse(c, k)).collect::<Result<Vec<_>, _>>()?;
        let retired = pem_blocks(retired.unwrap_or_default(), "CERTIFICATE")
            .iter()
            .map(|pem| Retired::parse(pem).ok_or_else(|| PkiError::Stored(format!("{SECRET_RETIRED}: unreadable"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { authorities, retired })
    }

    /// The Secret's contents: (certificates, keys).
    pub fn to_pem(&self) -> (String, String) {
        let certs = self.authorities.iter().map(Authority::pem).collect();
        let keys = self.authorities.iter().map(Authority::key_pem).collect();
        (certs, keys)
    }

    /// The retired CAs' certificates (the Secret's and the bundle's `retired.crt`), None without any.
    pub fn retired_pem(&self) -> Option<String> {
        (!self.retired.is_empty()).then(|| self.retired.iter().map(|r| r.pem.as_str()).collect())
    }

    /// Every CA certificate trusted, retired ones included: what agents and the operator trust (the
    /// ConfigMap's `ca.crt`).
    pub fn bundle(&self) -> String {
        self.authorities.iter().map(Authority::pem).chain(self.retired.iter().map(|r| r.pem.as_str())).collect()
    }

    pub fn roots(&self) -> Result<rustls::RootCertStore, PkiError> {
        let mut roots = rustls::RootCertStore::empty();
        for der in certificates(&self.bundle())? {
            roots.add(der).map_err(|e| PkiError::Stored(format!("CA certificate: {e}")))?;
        }
        Ok(roots)
    }

    /// Whether `cert_pem` is a serving certificate for `dns_name` from a CA in force (not a retired one).
    pub fn issued_in_force(&self, cert_pem: &str, dns_name: &str) -> bool {
        let in_force: String = self.authorities.iter().map(Authority::pem).collect();
        certificates(cert_pem)
            .ok()
            .and_then(|c| c.into_iter().next())
            .is_some_and(|leaf| isthmus_agent_api::tls::serves_under(&leaf, &in_force, dns_name))
    }

    /// The set without its retired CAs once they are no longer needed, or None while they are (or there are
    /// none): when `every_agent_moved` to the CAs in force, or once no certificate a retired CA issued can
    /// still be valid (it was issued before the newest CA existed, for at most `leaf_validity`), which covers
    /// agents whose requests the API server has already cleaned up.
    pub fn settle(
        &self,
        now: OffsetDateTime,
        leaf_validity: Duration,
        every_agent_moved: bool,
    ) -> Result<Option<Self>, PkiError> {
        if self.retired.is_empty() {
            return Ok(None);
        }
        let outlived = self.authorities[0].not_before + SKEW + leaf_validity <= now;
        if !every_agent_moved && !outlived {
            return Ok(None);
        }
        let authorities = self.authorities.iter().map(Authority::copy).collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Self { authorities, retired: Vec::new() }))
    }

    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// The CA that signs at `now`: the newest one once it has been published for [`PROPAGATION`], before that
    /// the previous one (a single CA, as at installation, signs at once).
    pub fn signing(&self, now: OffsetDateTime) -> &Authority {
        self.authorities
            .iter()
            .find(|a| a.not_before + SKEW + PROPAGATION <= now)
            .unwrap_or_else(|| self.authorities.last().expect("a CaSet is never empty"))
    }

    /// The set after rotation at `now`, or None when nothing changes: a new CA when the newest has less than
    /// `renew_before` left, and the previous one dropped once it has expired.
    pub fn rotate(
        &self,
        now: OffsetDateTime,
        validity: Duration,
        renew_before: Duration,
    ) -> Result<Option<Self>, PkiError> {
        let newest = &self.authorities[0];
        let renew = newest.not_after - renew_before <= now;
        let expired = self
            .authorities
            .iter()
            .map(|a| a.not_after)
            .chain(self.retired.iter().map(|r| r.not_after))
            .any(|t| t <= now);
        if !renew && !expired {
            return Ok(None);
        }
        let mut kept: Vec<Authority> = Vec::new();
        if renew {
            kept.push(Authority::generate(now, validity)?);
        }
        for a in &self.authorities {
            if a.not_after > now && kept.len() < 2 {
                kept.push(a.copy()?);
            }
        }
        let retired = self.retired.iter().filter(|r| r.not_after > now).cloned().collect();
        Ok(Some(Self { authorities: kept, retired }))
    }

    /// A client certificate for `identity` (its DNS SAN) with a fresh key: (certificate PEM, key PEM).
    pub fn issue_client(
        &self,
        identity: &str,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<(String, String), PkiError> {
        self.issue(identity, ExtendedKeyUsagePurpose::ClientAuth, now, validity)
    }

    /// A serving certificate for `dns_name` with a fresh key (the operator's webhook): (certificate PEM, key PEM).
    pub fn issue_serving(
        &self,
        dns_name: &str,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<(String, String), PkiError> {
        self.issue(dns_name, ExtendedKeyUsagePurpose::ServerAuth, now, validity)
    }

    fn issue(
        &self,
        dns_name: &str,
        usage: ExtendedKeyUsagePurpose,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<(String, String), PkiError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(PkiError::Generate)?;
        let cert = self.signing(now).sign(leaf(dns_name, usage, now, validity)?, &key)?;
        Ok((cert, key.serialize_pem()))
    }

    /// An agent's serving certificate for `dns_name` (and `shared_name`, the name every agent carries, when
    /// given) over the public key of its request. Nothing else of the request is copied: the names, usages and
    /// lifetime are the signer's.
    pub fn sign_serving(
        &self,
        public_key: &rcgen::PublicKey,
        dns_name: &str,
        shared_name: Option<&str>,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<String, PkiError> {
        let mut params = leaf(dns_name, ExtendedKeyUsagePurpose::ServerAuth, now, validity)?;
        if let Some(shared) = shared_name {
            params
                .subject_alt_names
                .push(SanType::DnsName(shared.try_into().map_err(|_| PkiError::Name(shared.to_owned()))?));
        }
        self.signing(now).sign(params, public_key)
    }
}

fn leaf(
    dns_name: &str,
    usage: ExtendedKeyUsagePurpose,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, dns_name);
    params.subject_alt_names =
        vec![SanType::DnsName(dns_name.try_into().map_err(|_| PkiError::Name(dns_name.to_owned()))?)];
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.not_before = now - SKEW;
    params.not_after = now + validity;
    Ok(params)
}

/// The PEM blocks of one label in `text`, each re-encoded on its own.
fn pem_blocks(text: &str, label: &str) -> Vec<String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let Some(stop) = rest[start..].find(&end) else { break };
        let stop = start + stop + end.len();
        blocks.push(format!("{}\n", &rest[start..stop]));
        rest = &rest[stop..];
    }
    blocks
}

/// A private key PEM as rustls takes it.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::Stored(format!("private key: {e}")))
}

/// A certificate chain PEM as rustls takes it.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Stored(format!("certificate: {e}")))
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a key or certificate: {0}")]
    Generate(rcgen::Error),
    #[error("signing a certificate: {0}")]
    Sign(rcgen::Error),
    #[error("the stored CA is unusable: {0}")]
    Stored(String),
    #[error("{0:?} is not a DNS name")]
    Name(String),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn at(days: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap() + time::Duration::days(days)
    }

    #[test]
    fn a_ca_survives_the_secret_round_trip_and_signs_what_it_trusts() {
        let set = CaSet::new(Authority::generate(at(0), 365 * DAY).unwrap());
        let (certs, keys) = set.to_pem();
        let back = CaSet::from_pem(&certs, &keys, None).unwrap();
        assert_eq!(back.bundle(), set.bundle());
        let (cert, key) = back.issue_client("op.ns.serviceaccount.isthmus", at(1), DAY).unwrap();
        assert!(certificates(&cert).is_ok() && private_key(&key).is_ok());
        // Chains to the original CA (checked by rustls in the agent's tests; here: parsable and issued by it).
        let der = certificates(&cert).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(parsed.issuer().to_string().contains("isthmus CA"));
        assert!(!parsed.is_ca());
    }

    #[test]
    fn mismatched_or_missing_stored_material_is_refused() {
        let a = Authority::generate(at(0), DAY).unwrap();
        let b = Authority::generate(at(0), DAY).unwrap();
        assert!(
            matches!(CaSet::from_pem(a.pem(), &b.key_pem(), None), Err(PkiError::Stored(m)) if m.contains("does not belong"))
        );
        assert!(matches!(CaSet::from_pem(a.pem(), "", None), Err(PkiError::Stored(m)) if m.contains("pair up")));
        assert!(matches!(CaSet::from_pem("", "", None), Err(PkiError::Stored(_))));
    }

    #[test]
    fn rotation_adds_a_ca_before_expiry_signs_with_it_after_propagation_and_drops_the_expired_one() {
        let set = CaSet::new(Authority::generate(at(0), 100 * DAY).unwrap());
        assert!(set.rotate(at(69), 100 * DAY, 30 * DAY).unwrap().is_none(), "31 days left: nothing to do");
        let rotated = set.rotate(at(71), 100 * DAY, 30 * DAY).unwrap().expect("29 days left: a new CA");
        assert_eq!(rotated.authorities.len(), 2);
        assert_eq!(rotated.authorities[1].pem(), set.authorities[0].pem(), "the old CA stays trusted");
        let young = at(71) + time::Duration::minutes(1);
        assert_eq!(rotated.signing(young).pem(), set.authorities[0].pem(), "the new CA is not yet everywhere");
        let later = at(71) + time::Duration::minutes(20);
        assert_eq!(rotated.signing(later).pem(), rotated.authorities[0].pem(), "published long enough: it signs");
        let pruned = rotated.rotate(at(101), 100 * DAY, 30 * DAY).unwrap().expect("the old CA expired");
        assert_eq!(pruned.authorities.len(), 1);
        assert_eq!(pruned.authorities[0].pem(), rotated.authorities[0].pem());
        // A leaf never outlives its CA.
        let (cert, _) = set.issue_client("x.isthmus", at(99), 30 * DAY).unwrap();
        let der = certificates(&cert).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(parsed.validity().not_after.timestamp() <= set.authorities[0].not_after.unix_timestamp());
    }

    fn serving(set: &CaSet, node: &str) -> String {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::new(vec![node.to_owned()]).unwrap().serialize_request(&key).unwrap();
        let public_key = rcgen::CertificateSigningRequestParams::from_der(csr.der()).unwrap().public_key;
        set.sign_serving(&public_key, node, None, OffsetDateTime::now_utc(), DAY).unwrap()
    }

    /// The CA Secret deleted: a new CA signs at once, the old one stays trusted (retired, never signing) and
    /// survives the Secret's round trip, and is dropped once every agent moved or its certificates expired.
    #[test]
    fn a_replaced_ca_stays_trusted_retired_until_every_agent_moved_or_its_certificates_expired() {
        let now = OffsetDateTime::now_utc();
        let old = CaSet::new(Authority::generate(now - 30 * DAY, 365 * DAY).unwrap());
        let expired = Authority::generate(now - 400 * DAY, 365 * DAY).unwrap();
        let trusted_before = format!("{}{}{}", old.bundle(), expired.pem(), old.bundle());
        let new = CaSet::replacing(&trusted_before, now, 365 * DAY).unwrap();
        assert_eq!(new.authorities.len(), 1);
        assert_eq!(new.retired_pem().as_deref(), Some(old.bundle().as_str()), "once each, the expired one left out");
        assert_eq!(new.bundle(), format!("{}{}", new.authorities[0].pem(), old.bundle()), "both trusted");
        assert_eq!(new.roots().unwrap().len(), 2);
        assert_eq!(new.signing(now).pem(), new.authorities[0].pem(), "a replacement signs at once");
        let (certs, keys) = new.to_pem();
        let back = CaSet::from_pem(&certs, &keys, new.retired_pem().as_deref()).unwrap();
        assert_eq!(back.bundle(), new.bundle());
        assert!(
            CaSet::from_pem(&certs, &keys, Some("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"))
                .is_err()
        );

        let from_old = serving(&old, "node-a.node.isthmus");
        let from_new = serving(&new, "node-a.node.isthmus");
        assert!(!new.issued_in_force(&from_old, "node-a.node.isthmus"), "from a retired CA");
        assert!(new.issued_in_force(&from_new, "node-a.node.isthmus"));
        assert!(!new.issued_in_force(&from_new, "node-b.node.isthmus"), "for another node");
        assert!(!new.issued_in_force("garbage", "node-a.node.isthmus"));

        assert!(new.settle(now, DAY, false).unwrap().is_none(), "an agent may still hold a certificate from it");
        let moved = new.settle(now, DAY, true).unwrap().expect("every agent moved");
        assert_eq!((moved.bundle(), moved.retired_pem()), (new.authorities[0].pem().to_owned(), None));
        let later = now + DAY + SKEW + Duration::from_secs(1);
        assert!(new.settle(later, DAY, false).unwrap().is_some(), "whatever it issued has expired");
        assert!(moved.settle(later, DAY, true).unwrap().is_none(), "nothing retired: nothing to do");
        // A rotation keeps a retired CA until it expires.
        let rotated = new.rotate(now + 300 * DAY, 365 * DAY, 100 * DAY).unwrap().expect("due");
        assert!(rotated.has_retired());
        let pruned = new.rotate(now + 336 * DAY, 365 * DAY, DAY).unwrap().expect("the old CA expired");
        assert!(!pruned.has_retired());
    }

    /// What the signer issues, checked by rustls as the operator's client checks it: node-a's certificate is
    /// valid for node-a's name and refused for node-b's; the operator's certificate is no serving certificate.
    #[test]
    fn a_serving_certificate_is_valid_for_its_node_only() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};
        let set = CaSet::new(Authority::generate(OffsetDateTime::now_utc(), 365 * DAY).unwrap());
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let csr =
            CertificateParams::new(vec!["node-a.node.isthmus".to_owned()]).unwrap().serialize_request(&key).unwrap();
        let public_key = rcgen::CertificateSigningRequestParams::from_der(csr.der()).unwrap().public_key;
        let cert = set.sign_serving(&public_key, "node-a.node.isthmus", None, OffsetDateTime::now_utc(), DAY).unwrap();
        let provider = isthmus_agent_api::tls::crypto_provider();
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(set.roots().unwrap()), provider)
                .build()
                .unwrap();
        let der = certificates(&cert).unwrap().remove(0);
        let check = |name: &str, der: &CertificateDer<'_>| {
            verifier.verify_server_cert(der, &[], &ServerName::try_from(name.to_owned()).unwrap(), &[], UnixTime::now())
        };
        assert!(check("node-a.node.isthmus", &der).is_ok());
        let wrong = check("node-b.node.isthmus", &der).unwrap_err();
        assert!(wrong.to_string().contains("not valid for name"), "{wrong}");
        let (operator, _) = set.issue_client("node-a.node.isthmus", OffsetDateTime::now_utc(), DAY).unwrap();
        let operator = certificates(&operator).unwrap().remove(0);
        assert!(check("node-a.node.isthmus", &operator).is_err(), "a client certificate is no serving certificate");
        assert!(check("isthmus-agent-metrics.isthmus-system.svc", &der).is_err(), "no shared name unless signed");

        // With the agents' shared name: valid for the node's name and the shared one, still not for another node.
        let shared = "isthmus-agent-metrics.isthmus-system.svc";
        let cert = set.sign_serving(&public_key, "node-a.node.isthmus", Some(shared), OffsetDateTime::now_utc(), DAY);
        let der = certificates(&cert.unwrap()).unwrap().remove(0);
        assert!(check("node-a.node.isthmus", &der).is_ok());
        assert!(check(shared, &der).is_ok());
        assert!(check("node-b.node.isthmus", &der).is_err());
    }
}
