//! Certificates made for each test with rcgen (ring): a root CA, intermediates, serving
//! certificates for loopback, and client certificates with a chosen subject, extended key usage and
//! validity.
//!
//! rcgen keeps at most one attribute of each type in a subject, but the scenarios need several `O`
//! values and, for case X9 of `docs/COMPATIBILITY.md`, the UID attribute twice. So every leaf is
//! issued by rcgen (keys, validity, extensions, issuer) and then its subject is replaced by one
//! encoded here, and the certificate signed again with the issuer's key.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SigningKey, date_time_ymd,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::prelude::{FromDer, X509Certificate};

/// The subject attribute Kubernetes reads a user's UID from (`AllowParsingUserUIDFromCertAuth`).
pub const UID_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 57683, 2];
/// `CN`.
pub const COMMON_NAME_OID: &[u64] = &[2, 5, 4, 3];
/// `O`.
pub const ORGANIZATION_OID: &[u64] = &[2, 5, 4, 10];
/// ASN.1 universal tags of the string types a subject attribute may use.
pub const UTF8_STRING: u8 = 0x0c;
/// T61String (TeletexString): one byte a character.
pub const T61_STRING: u8 = 0x14;
/// BMPString: UTF-16, big-endian.
pub const BMP_STRING: u8 = 0x1e;
/// OCTET STRING: not a string type; Go refuses it in a subject.
pub const OCTET_STRING: u8 = 0x04;

/// The extended key usage a leaf carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// `id-kp-clientAuth`.
    ClientAuth,
    /// `id-kp-serverAuth` only.
    ServerAuth,
    /// No extended key usage extension at all (acceptable for any use, as in Go).
    Unrestricted,
    /// `anyExtendedKeyUsage` only (acceptable for any use, as in Go).
    Any,
}

/// When a leaf is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From 2020 to 2999.
    Current,
    /// Only during 2000.
    Expired,
    /// Only from 2999 on.
    NotYetValid,
}

/// What to put in a leaf certificate.
#[derive(Debug, Clone)]
pub struct CertSpec {
    common_name: Option<String>,
    organizations: Vec<String>,
    uids: Vec<String>,
    /// Attributes after the others: OID, ASN.1 tag, raw value bytes.
    raw: Vec<(&'static [u64], u8, Vec<u8>)>,
    usage: Usage,
    validity: Validity,
    names: Vec<String>,
    /// Marked `CA:TRUE` although used as a leaf.
    ca: bool,
}

impl CertSpec {
    /// A client certificate for `common_name` (may be empty), clientAuth, currently valid.
    pub fn client(common_name: &str) -> CertSpec {
        CertSpec {
            common_name: Some(common_name.to_owned()),
            organizations: Vec::new(),
            uids: Vec::new(),
            raw: Vec::new(),
            usage: Usage::ClientAuth,
            validity: Validity::Current,
            names: Vec::new(),
            ca: false,
        }
    }

    /// A serving certificate for `127.0.0.1` and `localhost`.
    pub fn server() -> CertSpec {
        CertSpec {
            usage: Usage::ServerAuth,
            names: vec!["127.0.0.1".into(), "localhost".into()],
            ..CertSpec::client("kubelet-auth-proxy-e2e")
        }
    }

    /// Replaces the subject alternative names (DNS names or IP addresses).
    pub fn names(mut self, names: &[&str]) -> CertSpec {
        self.names = names.iter().map(|n| (*n).to_owned()).collect();
        self
    }

    /// Sets the common name (e.g. to tell two serving certificates apart).
    pub fn common_name(mut self, common_name: &str) -> CertSpec {
        self.common_name = Some(common_name.to_owned());
        self
    }

    /// Leaves the common name out of the subject entirely.
    pub fn without_common_name(mut self) -> CertSpec {
        self.common_name = None;
        self
    }

    /// Adds an `O` attribute (a Kubernetes group), after the ones already added.
    pub fn org(mut self, organization: &str) -> CertSpec {
        self.organizations.push(organization.to_owned());
        self
    }

    /// Adds a UID attribute (OID 1.3.6.1.4.1.57683.2); call twice for two of them.
    pub fn uid(mut self, uid: &str) -> CertSpec {
        self.uids.push(uid.to_owned());
        self
    }

    /// Adds an attribute encoded as given (`tag`: the ASN.1 string type), after all the others.
    pub fn attribute(mut self, oid: &'static [u64], tag: u8, value: &[u8]) -> CertSpec {
        self.raw.push((oid, tag, value.to_vec()));
        self
    }

    /// Sets the extended key usage.
    pub fn usage(mut self, usage: Usage) -> CertSpec {
        self.usage = usage;
        self
    }

    /// Marks the leaf `CA:TRUE` (basic constraints), as `openssl req -x509` does by default.
    pub fn ca(mut self) -> CertSpec {
        self.ca = true;
        self
    }

    /// Sets the validity period.
    pub fn validity(mut self, validity: Validity) -> CertSpec {
        self.validity = validity;
        self
    }

    /// The subject, DER-encoded, attributes in the order CN, O…, UID… (UTF8String), then the raw
    /// ones, one per RDN.
    fn subject_der(&self) -> Vec<u8> {
        let mut attributes: Vec<(&[u64], u8, &[u8])> = Vec::new();
        if let Some(cn) = &self.common_name {
            attributes.push((COMMON_NAME_OID, UTF8_STRING, cn.as_bytes()));
        }
        attributes.extend(
            self.organizations
                .iter()
                .map(|o| (ORGANIZATION_OID, UTF8_STRING, o.as_bytes())),
        );
        attributes.extend(
            self.uids
                .iter()
                .map(|u| (UID_OID, UTF8_STRING, u.as_bytes())),
        );
        attributes.extend(
            self.raw
                .iter()
                .map(|(oid, tag, v)| (*oid, *tag, v.as_slice())),
        );
        let mut rdns = Vec::new();
        for (oid, tag, value) in attributes {
            let mut atv = der_oid(oid);
            atv.extend(tlv(tag, value));
            rdns.extend(tlv(0x31, &tlv(0x30, &atv)));
        }
        tlv(0x30, &rdns)
    }
}

/// A certificate authority: a root, or an intermediate with the chain above it.
pub struct Authority {
    params: CertificateParams,
    key: KeyPair,
    cert: CertificateDer<'static>,
    /// Certificates a client sends after its leaf: this authority's own, then those above it,
    /// without the root.
    intermediates: Vec<CertificateDer<'static>>,
}

impl Authority {
    /// A self-signed root CA.
    pub fn root(common_name: &str) -> Authority {
        let params = ca_params(common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap().der().clone();
        Authority {
            params,
            key,
            cert,
            intermediates: Vec::new(),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, common_name: &str) -> Authority {
        let mut params = ca_params(common_name);
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap().der().clone();
        let mut intermediates = vec![cert.clone()];
        intermediates.extend(self.intermediates.iter().cloned());
        Authority {
            params,
            key,
            cert,
            intermediates,
        }
    }

    /// This authority's certificate.
    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// This authority's certificate in PEM, for a `--*-ca-file`.
    pub fn pem(&self) -> String {
        pem("CERTIFICATE", &self.cert)
    }

    /// Issues a leaf as `spec` says.
    pub fn issue(&self, spec: &CertSpec) -> Issued {
        let mut params = CertificateParams::new(spec.names.clone()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match spec.usage {
            Usage::ClientAuth => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAuth => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Unrestricted => Vec::new(),
            Usage::Any => vec![ExtendedKeyUsagePurpose::Any],
        };
        if spec.ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        (params.not_before, params.not_after) = match spec.validity {
            Validity::Current => (date_time_ymd(2020, 1, 1), date_time_ymd(2999, 1, 1)),
            Validity::Expired => (date_time_ymd(2000, 1, 1), date_time_ymd(2001, 1, 1)),
            Validity::NotYetValid => (date_time_ymd(2999, 1, 1), date_time_ymd(3000, 1, 1)),
        };
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let drafted = params.signed_by(&key, &issuer).unwrap();
        let cert = CertificateDer::from(replace_subject(
            drafted.der(),
            &spec.subject_der(),
            &self.key,
        ));
        let mut chain = vec![cert.clone()];
        chain.extend(self.intermediates.iter().cloned());
        Issued {
            chain,
            key: key.serialize_der(),
        }
    }
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A leaf certificate, the intermediates above it, and its private key.
#[derive(Clone)]
pub struct Issued {
    /// The leaf, then the intermediates of its issuer (no root).
    pub chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

impl Issued {
    /// The leaf alone.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    /// The private key (PKCS#8).
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }

    /// The whole chain in PEM, for a `--*-cert-file`.
    pub fn chain_pem(&self) -> String {
        self.chain.iter().map(|c| pem("CERTIFICATE", c)).collect()
    }

    /// The key in PEM, for a `--*-key-file`.
    pub fn key_pem(&self) -> String {
        pem("PRIVATE KEY", &self.key)
    }
}

/// A fresh private key that belongs to no certificate.
pub fn unrelated_key() -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        KeyPair::generate().unwrap().serialize_der(),
    ))
}

/// Lowercase hex SHA-256 of a certificate, as in the `credential-id` extra (`X509SHA256=<hex>`).
pub fn sha256_hex(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The common name of a certificate's subject ("" when it has none).
pub fn common_name_of(der: &[u8]) -> String {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    cert.subject()
        .iter_common_name()
        .next()
        .map(|cn| cn.as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// A certificate's serial number, in hex.
pub fn serial_of(der: &[u8]) -> String {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    cert.raw_serial_as_string()
}

/// Swaps the subject (the sixth field of TBSCertificate, after version, serial, signature
/// algorithm, issuer and validity) and signs the result again with `issuer_key`.
fn replace_subject(cert: &[u8], subject: &[u8], issuer_key: &KeyPair) -> Vec<u8> {
    let parts = elements(content(cert));
    assert_eq!(parts.len(), 3, "Certificate has tbs, algorithm, signature");
    let fields = elements(content(parts[0]));
    assert_eq!(
        fields[0][0], 0xa0,
        "TBSCertificate starts with an explicit version"
    );
    let mut tbs_content = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        tbs_content.extend_from_slice(if i == 5 { subject } else { field });
    }
    let tbs = tlv(0x30, &tbs_content);
    let mut signature = vec![0u8];
    signature.extend(issuer_key.sign(&tbs).unwrap());
    let mut body = tbs;
    body.extend_from_slice(parts[1]);
    body.extend(tlv(0x03, &signature));
    tlv(0x30, &body)
}

/// One DER element: tag, definite length, content.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    if content.len() < 0x80 {
        out.push(content.len() as u8);
    } else {
        let len = content.len().to_be_bytes();
        let skip = len.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (len.len() - skip) as u8);
        out.extend_from_slice(&len[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// (header length, content length) of the DER element at the start of `der`.
fn header(der: &[u8]) -> (usize, usize) {
    let first = usize::from(der[1]);
    if first < 0x80 {
        return (2, first);
    }
    let n = first & 0x7f;
    let len = der[2..2 + n]
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
    (2 + n, len)
}

fn content(der: &[u8]) -> &[u8] {
    let (head, len) = header(der);
    &der[head..head + len]
}

/// The consecutive elements of a DER content, each with its header.
fn elements(mut der: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !der.is_empty() {
        let (head, len) = header(der);
        out.push(&der[..head + len]);
        der = &der[head + len..];
    }
    out
}

fn der_oid(components: &[u64]) -> Vec<u8> {
    let mut body = vec![(components[0] * 40 + components[1]) as u8];
    for &c in &components[2..] {
        let mut groups = vec![(c & 0x7f) as u8];
        let mut rest = c >> 7;
        while rest > 0 {
            groups.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        body.extend(groups.iter().rev());
    }
    tlv(0x06, &body)
}

fn pem(label: &str, der: &[u8]) -> String {
    let encoded = base64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in encoded.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 0x3f]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
