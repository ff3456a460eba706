//! rustls configurations: the serving side (ALPN h2 + http/1.1, kubelet-named versions and cipher
//! suites, client certificates requested but never required) and the client side towards the
//! kubelet. Only the ring provider is used; nothing here installs a process-wide default.

pub mod ciphers;
pub mod client_auth;
mod upstream_name;

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use ciphers::MinVersion;
use client_auth::RequestClientCert;

/// Why a PEM file gave no certificate or key. The caller names the flag and the file; the
/// variants keep the I/O or PEM error as their source.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file could not be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// The file is not valid PEM.
    #[error("bad PEM: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    /// The file holds no certificate.
    #[error("no PEM certificate found")]
    NoCertificate,
    /// The file holds no private key.
    #[error("no PEM private key found")]
    NoKey,
}

/// Reads every certificate of a PEM file. An unreadable file, a PEM error or a file without any
/// certificate is an error (the caller names the flag and file).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    parse_certs(&std::fs::read(path).map_err(PemError::Read)?)
}

/// Every certificate of PEM text; as [`read_certs`], none at all is an error.
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(PemError::Pem)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let bytes = std::fs::read(path).map_err(PemError::Read)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => PemError::NoKey,
        e => PemError::Pem(e),
    })
}

/// Why a certificate and a private key cannot be used together.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The key is of a type the ring provider cannot sign with.
    #[error("unsupported private key type (RSA, ECDSA P-256/P-384 and Ed25519 are): {0}")]
    UnsupportedKey(#[source] rustls::Error),
    /// The key's public half is not the certificate's public key.
    #[error("does not belong to the certificate (their public keys differ)")]
    Mismatch,
}

/// Checks that `key` is the private key of the first certificate of `chain`, so a mismatch is
/// reported naming the key rather than as a failure to build the TLS configuration. When the
/// public key cannot be compared (an unusual key encoding), rustls' own check still applies
/// when the configuration is built.
pub fn check_pair(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
) -> Result<(), PairError> {
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(key).map_err(PairError::UnsupportedKey)?;
    match rustls::sign::CertifiedKey::new(chain.to_vec(), signing_key).keys_match() {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(PairError::Mismatch)
        }
        _ => Ok(()),
    }
}

fn provider_with(suites: Vec<rustls::SupportedCipherSuite>) -> rustls::crypto::CryptoProvider {
    rustls::crypto::CryptoProvider {
        cipher_suites: suites,
        ..rustls::crypto::ring::default_provider()
    }
}

static TLS12_AND_13: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];
static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn versions(min: MinVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    match min {
        MinVersion::Tls12 => TLS12_AND_13,
        MinVersion::Tls13 => TLS13_ONLY,
    }
}

/// Settings of the serving TLS endpoint.
pub struct ServerTls<'a> {
    /// The serving chain and key.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// Private key of the leaf of `cert_chain`.
    pub key: PrivateKeyDer<'static>,
    /// Minimum protocol version.
    pub min_version: MinVersion,
    /// Enabled suites (see [`ciphers::select_suites`]).
    pub cipher_suites: Vec<rustls::SupportedCipherSuite>,
    /// Subjects to advertise when client certificates are requested; `None` requests none.
    pub client_ca_hints: Option<&'a [rustls::DistinguishedName]>,
}

/// Builds the serving configuration. With `client_ca_hints`, a client certificate is requested but
/// never required, and only the handshake signature is checked (see [`RequestClientCert`]).
pub fn server_config(settings: ServerTls<'_>) -> Result<ServerConfig, String> {
    let builder =
        ServerConfig::builder_with_provider(Arc::new(provider_with(settings.cipher_suites)))
            .with_protocol_versions(versions(settings.min_version))
            .map_err(|e| format!("TLS settings: {e}"))?;
    let builder = match settings.client_ca_hints {
        Some(hints) => {
            builder.with_client_cert_verifier(Arc::new(RequestClientCert::new(hints.to_vec())))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(settings.cert_chain, settings.key)
        .map_err(|e| format!("certificate and key do not form a usable pair: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Settings of the TLS client that talks to the kubelet.
pub struct UpstreamTls {
    /// CAs that sign the kubelet's serving certificate.
    pub roots: Vec<CertificateDer<'static>>,
    /// Client certificate chain and key presented to the kubelet, if any.
    pub client_identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// Also accept a serving certificate valid for this name when it is not valid for the
    /// upstream host (the node's name, for a loopback upstream; see `upstream_name`).
    pub or_name: Option<rustls::pki_types::ServerName<'static>>,
}

/// Builds the client configuration towards the kubelet. ALPN is left unset on purpose: the
/// forwarder speaks HTTP/1.1 to the kubelet (upgrades need it).
pub fn upstream_client_config(settings: UpstreamTls) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in settings.roots.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|e| format!("CA certificate {} is not usable: {e}", i + 1))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions(MinVersion::Tls12))
        .map_err(|e| format!("TLS settings: {e}"))?;
    let builder = match settings.or_name {
        Some(node) => {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("CA certificates are not usable: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(upstream_name::OrNodeName {
                    inner,
                    node,
                }))
        }
        None => builder.with_root_certificates(roots),
    };
    let config = match settings.client_identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("client certificate and key do not form a usable pair: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}
