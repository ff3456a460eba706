//! x509 client-certificate authentication, as the kubelet's `x509.CommonNameUserConversion`
//! (k8s.io/apiserver v0.33 `pkg/authentication/request/x509/x509.go`): verify the chain the client
//! sent against the client CA with the clientAuth usage, then map CN → user, O → groups, the UID
//! attribute → uid, and the leaf's SHA-256 → the
//! `authentication.kubernetes.io/credential-id` extra.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rustls::DistinguishedName;
use rustls::pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::FromDer;

use super::User;
use super::subject_string;
use crate::base::reload::Reloadable;

/// DER contents of OID 1.3.6.1.4.1.57683.2, the subject attribute Kubernetes reads the user's UID
/// from (`AllowParsingUserUIDFromCertAuth`, on since 1.33).
const UID_OID_DER: &[u8] = &[0x2B, 0x06, 0x01, 0x04, 0x01, 0x83, 0xC2, 0x53, 0x02];

/// The extra key carrying the certificate's fingerprint; it makes each certificate a distinct
/// SubjectAccessReview subject, as in Kubernetes 1.32+.
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.kubernetes.io/credential-id";

/// Errors loading the client CA bundle.
#[derive(Debug, thiserror::Error)]
pub enum ClientCaError {
    /// The file could not be read or holds no PEM certificate.
    #[error(transparent)]
    Pem(#[from] crate::tls::PemError),
    /// The bundle holds no certificate.
    #[error("no certificate in the bundle")]
    Empty,
    /// A certificate in the bundle cannot serve as a trust anchor.
    #[error("certificate {index} in the bundle is not a usable CA certificate: {reason}")]
    BadCertificate {
        /// Position in the bundle, from 1.
        index: usize,
        /// What was wrong with it.
        reason: String,
    },
}

/// The CA bundle client certificates must chain to (`--client-ca-file`).
#[derive(Debug)]
pub struct ClientCa {
    anchors: Vec<TrustAnchor<'static>>,
    /// Validity of each anchor, by position: webpki does not check trust anchors' dates, Go does.
    anchor_validity: Vec<(i64, i64)>,
    hints: Vec<DistinguishedName>,
}

impl ClientCa {
    /// Reads a PEM bundle; an empty file is an error, as in Kubernetes.
    pub fn from_pem_file(path: &Path) -> Result<ClientCa, ClientCaError> {
        let certs = crate::tls::read_certs(path)?;
        ClientCa::from_certs(&certs)
    }

    /// Builds the bundle from DER certificates.
    pub fn from_certs(certs: &[CertificateDer<'_>]) -> Result<ClientCa, ClientCaError> {
        let mut anchors = Vec::with_capacity(certs.len());
        let mut anchor_validity = Vec::with_capacity(certs.len());
        let mut hints = Vec::with_capacity(certs.len());
        for (i, der) in certs.iter().enumerate() {
            let bad = |reason: String| ClientCaError::BadCertificate {
                index: i + 1,
                reason,
            };
            let anchor = webpki::anchor_from_trusted_cert(der)
                .map_err(|e| bad(format!("{e:?}")))?
                .to_owned();
            let (_, parsed) = X509Certificate::from_der(der).map_err(|e| bad(e.to_string()))?;
            let validity = parsed.validity();
            anchor_validity.push((
                validity.not_before.timestamp(),
                validity.not_after.timestamp(),
            ));
            hints.push(DistinguishedName::in_sequence(&anchor.subject));
            anchors.push(anchor);
        }
        if anchors.is_empty() {
            return Err(ClientCaError::Empty);
        }
        Ok(ClientCa {
            anchors,
            anchor_validity,
            hints,
        })
    }

    /// The subjects to advertise in the TLS CertificateRequest.
    pub fn hint_subjects(&self) -> Vec<DistinguishedName> {
        self.hints.clone()
    }
}

impl std::fmt::Debug for X509Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X509Authenticator").finish_non_exhaustive()
    }
}

/// What a client certificate chain says about the caller.
#[derive(Debug, Clone)]
pub enum X509Outcome {
    /// No certificate, or a valid one with an empty CN: not authenticated, no error; the next
    /// authenticator (or anonymous) may still apply.
    NoCertificate,
    /// A verified certificate.
    Authenticated {
        /// The mapped user, `system:authenticated` included where the kubelet adds it.
        user: Arc<User>,
        /// Unix seconds after which the identity is invalid: the earliest `notAfter` of the
        /// verified path (leaf, intermediates used, anchor).
        valid_until: i64,
    },
    /// A certificate was presented and did not verify: an error, so never anonymous (401).
    Invalid(String),
}

/// Verifies client certificates against a [`ClientCa`] and maps them to users.
#[derive(Clone)]
pub struct X509Authenticator {
    ca: Arc<Reloadable<ClientCa>>,
    /// The signature algorithms chains may use: ring's, as everywhere in the proxy.
    algorithms: &'static [&'static dyn SignatureVerificationAlgorithm],
}

impl X509Authenticator {
    /// An authenticator trusting `ca`, whichever version of it is in force.
    pub fn new(ca: Arc<Reloadable<ClientCa>>) -> Self {
        X509Authenticator {
            ca,
            algorithms: rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .all,
        }
    }

    /// Verifies `chain` (leaf first, then the intermediates the client sent) at time `now` and maps
    /// it to a user. Done once per connection; past `valid_until` the caller treats the identity as
    /// expired.
    pub fn authenticate(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> X509Outcome {
        self.authenticate_with(&self.ca.current(), chain, now)
    }

    /// The CA bundle in force.
    pub fn current_ca(&self) -> Arc<ClientCa> {
        self.ca.current_arc()
    }

    /// Whether `ca` is still the bundle in force (a lock-free pointer comparison).
    pub fn is_current(&self, ca: &Arc<ClientCa>) -> bool {
        Arc::ptr_eq(&self.ca.current(), ca)
    }

    /// [`authenticate`](Self::authenticate) against a given version of the CA bundle.
    pub fn authenticate_with(
        &self,
        ca: &ClientCa,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> X509Outcome {
        let Some((leaf_der, intermediates)) = chain.split_first() else {
            return X509Outcome::NoCertificate;
        };
        let leaf = match webpki::EndEntityCert::try_from(leaf_der) {
            Ok(leaf) => leaf,
            Err(e) => return X509Outcome::Invalid(format!("parsing certificate: {e:?}")),
        };
        let path = match leaf.verify_for_usage(
            self.algorithms,
            &ca.anchors,
            intermediates,
            now,
            ClientAuthOrAny,
            None,
            None,
        ) {
            Ok(path) => path,
            Err(e) => return X509Outcome::Invalid(describe_failure(leaf_der, &e)),
        };
        let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        let anchor_index = ca.anchors.iter().position(|a| {
            a.subject == path.anchor().subject
                && a.subject_public_key_info == path.anchor().subject_public_key_info
        });
        let mut valid_until = i64::MAX;
        if let Some(i) = anchor_index {
            let (not_before, not_after) = ca.anchor_validity[i];
            if now_secs < not_before || now_secs > not_after {
                return X509Outcome::Invalid(describe_failure(
                    leaf_der,
                    &"the client CA certificate has expired or is not yet valid",
                ));
            }
            valid_until = not_after;
        }
        // Only the certificates of the verified path count: once the earliest of them expires,
        // the connection's identity is no longer valid.
        let path_certs = std::iter::once(leaf_der.clone())
            .chain(path.intermediate_certificates().map(|c| c.der()));
        for der in path_certs {
            if let Ok((_, cert)) = X509Certificate::from_der(&der) {
                valid_until = valid_until.min(cert.validity().not_after.timestamp());
            }
        }
        match user_from_leaf(leaf_der) {
            Ok(Some(user)) => X509Outcome::Authenticated {
                user: Arc::new(user),
                valid_until,
            },
            Ok(None) => X509Outcome::NoCertificate,
            Err(e) => X509Outcome::Invalid(e),
        }
    }
}

/// DER contents of `anyExtendedKeyUsage` (OID 2.5.29.37.0, RFC 5280 §4.2.1.12).
const ANY_EKU_OID_DER: &[u8] = &[0x55, 0x1D, 0x25, 0x00];
/// DER contents of `id-kp-clientAuth` (OID 1.3.6.1.5.5.7.3.2).
const CLIENT_AUTH_OID_DER: &[u8] = &[0x2B, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

/// The extended key usage check of Go's `x509.Certificate.Verify` with
/// `KeyUsages: []ExtKeyUsage{ExtKeyUsageClientAuth}`, which the kubelet uses: a certificate of the
/// path passes when it has no EKU extension, lists `clientAuth`, or lists `anyExtendedKeyUsage`.
/// webpki's own `KeyUsage::client_auth()` refuses the last, which Go accepts (the same check
/// applies to intermediates in both).
struct ClientAuthOrAny;

impl webpki::ExtendedKeyUsageValidator for ClientAuthOrAny {
    fn validate(&self, usages: webpki::KeyPurposeIdIter<'_, '_>) -> Result<(), webpki::Error> {
        let mut present = Vec::new();
        for usage in usages {
            let usage = usage?;
            if usage == webpki::KeyPurposeId::new(ANY_EKU_OID_DER)
                || usage == webpki::KeyPurposeId::new(CLIENT_AUTH_OID_DER)
            {
                return Ok(());
            }
            present.push(usage.to_decoded_oid());
        }
        if present.is_empty() {
            return Ok(());
        }
        Err(webpki::Error::RequiredEkuNotFoundContext(
            webpki::RequiredEkuNotFoundContext {
                required: webpki::KeyUsage::client_auth(),
                present,
            },
        ))
    }
}

/// The kubelet's log shape for a failed verification: serial number and reason. Never includes
/// key material.
fn describe_failure(leaf_der: &[u8], reason: &dyn std::fmt::Debug) -> String {
    let serial = X509Certificate::from_der(leaf_der)
        .map(|(_, c)| c.tbs_certificate.serial.to_string())
        .unwrap_or_else(|_| "?".into());
    format!("verifying certificate SN={serial} failed: {reason:?}")
}

/// `CommonNameUserConversion`: `Ok(None)` for an empty CN (not authenticated, no error).
///
/// Only call it on a leaf whose chain verified. Public so the mapping of certificate contents to
/// a user can be exercised on its own, as the fuzzer does: a fuzzer cannot forge signatures.
pub fn user_from_leaf(leaf_der: &[u8]) -> Result<Option<User>, String> {
    let (_, cert) =
        X509Certificate::from_der(leaf_der).map_err(|e| format!("parsing certificate: {e}"))?;
    // As Go's pkix.Name: every value decoded (an undecodable one makes the certificate
    // unparseable, so unusable), the last CN is the name, each O a group.
    let mut name = String::new();
    let mut groups = Vec::new();
    let mut uids = Vec::new();
    for attr in cert.subject().iter_attributes() {
        let value = subject_string::decode(attr.attr_value())
            .map_err(|e| format!("client certificate subject: {e}"))?;
        let oid = attr.attr_type();
        if *oid == OID_X509_COMMON_NAME {
            name = value;
        } else if *oid == OID_X509_ORGANIZATION_NAME {
            groups.push(value);
        } else if oid.as_bytes() == UID_OID_DER {
            uids.push(value);
        }
    }
    if name.is_empty() {
        return Ok(None);
    }
    let uid = match uids.as_slice() {
        [] => String::new(),
        [uid] if !uid.is_empty() => uid.clone(),
        [_] => return Err("UID attribute of the client certificate is empty".into()),
        _ => return Err("client certificate has more than one UID attribute".into()),
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, leaf_der);
    let mut credential_id = String::with_capacity(11 + 64);
    credential_id.push_str("X509SHA256=");
    for byte in digest.as_ref() {
        credential_id.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        credential_id.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    let mut user = User {
        name,
        uid,
        groups,
        extra: BTreeMap::from([(CREDENTIAL_ID_EXTRA.to_owned(), vec![credential_id])]),
    };
    user.add_authenticated_group();
    Ok(Some(user))
}
