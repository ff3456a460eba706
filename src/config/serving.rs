//! The serving side's TLS: the certificate and key (`--tls-cert-file`, `--tls-private-key-file`),
//! the TLS versions and suites, and the client CA bundle (`--client-ca-file`), each reloadable.

use std::path::Path;
use std::sync::Arc;

use super::ConfigError;
use super::error::{file_cause, flag_error, reload_cause};
use super::flags::ProxyFlags;
use super::warnings::Warning;
use crate::authn::x509::ClientCa;
use crate::base::certificates::CertificateSource;
use crate::base::reload::{ReloadError, ReloadRegistry, ReloadTarget, Reloadable};
use crate::tls::{self, ServerTls, ciphers};

/// The client CA bundle (`--client-ca-file`), registered for reloading.
pub(super) fn client_ca_settings(
    flags: &ProxyFlags,
    reloads: &mut ReloadRegistry,
) -> Result<Option<Arc<Reloadable<ClientCa>>>, ConfigError> {
    let Some(path) = &flags.client_ca_file else {
        return Ok(None);
    };
    reloads.certificates(CertificateSource::pem("client_ca", path.clone()));
    reloads
        .load("client_ca", vec![path.clone()], |paths| {
            ClientCa::from_pem_file(&paths[0])
        })
        .map(Some)
        .map_err(|e| reload_cause("--client-ca-file", path, e))
}

/// The serving pair, TLS versions and suites: the serving configuration, advertising
/// `client_ca`'s names, registered for reloading.
pub(super) fn serving_settings(
    flags: &ProxyFlags,
    reloads: &mut ReloadRegistry,
    warnings: &mut Vec<Warning>,
    client_ca: Option<Arc<Reloadable<ClientCa>>>,
) -> Result<Arc<Reloadable<rustls::ServerConfig>>, ConfigError> {
    let cert_path = flags
        .tls_cert_file
        .as_deref()
        .ok_or_else(|| flag_error("--tls-cert-file", "required"))?;
    let key_path = flags
        .tls_private_key_file
        .as_deref()
        .ok_or_else(|| flag_error("--tls-private-key-file", "required"))?;
    // Read once here for precise errors; the reloadable rebuilds from the same files.
    let certs =
        tls::read_certs(cert_path).map_err(|e| file_cause("--tls-cert-file", cert_path, e))?;
    let key =
        tls::read_key(key_path).map_err(|e| file_cause("--tls-private-key-file", key_path, e))?;
    check_pair(
        &certs,
        &key,
        ("--tls-cert-file", cert_path),
        ("--tls-private-key-file", key_path),
    )?;
    let min_version = ciphers::parse_min_version(&flags.tls_min_version)
        .map_err(|e| flag_error("--tls-min-version", e))?;
    let ciphers::Selection {
        suites: cipher_suites,
        skipped,
    } = ciphers::select_suites(&flags.tls_cipher_suites)
        .map_err(|e| flag_error("--tls-cipher-suites", e))?;
    if !skipped.is_empty() {
        warnings.push(Warning::new(
            "--tls-cipher-suites",
            format!(
                "skipping {}: rustls does not offer them (CBC, RSA key exchange); only AEAD \
                 suites with forward secrecy are served",
                skipped.join(",")
            ),
        ));
    }
    if min_version == ciphers::MinVersion::Tls13 && !flags.tls_cipher_suites.is_empty() {
        warnings.push(Warning::new(
            "--tls-cipher-suites",
            "has no effect with --tls-min-version=VersionTLS13",
        ));
    }
    serving_tls(
        reloads,
        cert_path,
        key_path,
        min_version,
        cipher_suites,
        client_ca,
    )
    .map_err(|e| reload_cause("--tls-cert-file", cert_path, e))
}

/// The serving configuration, rebuilt from the certificate, key and (for the advertised CA
/// names) client CA files.
fn serving_tls(
    reloads: &mut ReloadRegistry,
    cert_path: &Path,
    key_path: &Path,
    min_version: ciphers::MinVersion,
    cipher_suites: Vec<rustls::SupportedCipherSuite>,
    client_ca: Option<Arc<Reloadable<ClientCa>>>,
) -> Result<Arc<Reloadable<rustls::ServerConfig>>, ReloadError> {
    reloads.certificates(CertificateSource::pem("serving", cert_path.to_owned()));
    let mut paths = vec![cert_path.to_owned(), key_path.to_owned()];
    if let Some(ca) = &client_ca {
        paths.extend(ca.paths().iter().cloned());
    }
    reloads.load("serving_certificate", paths, move |paths| {
        let cert_chain =
            tls::read_certs(&paths[0]).map_err(|e| format!("{}: {e}", paths[0].display()))?;
        let key = tls::read_key(&paths[1]).map_err(|e| format!("{}: {e}", paths[1].display()))?;
        let hints = client_ca.as_ref().map(|ca| ca.current().hint_subjects());
        tls::server_config(ServerTls {
            cert_chain,
            key,
            min_version,
            cipher_suites: cipher_suites.clone(),
            client_ca_hints: hints.as_deref(),
        })
    })
}

/// A certificate and key pair given by two flags: the key must be the certificate's. The error
/// names the key's flag and file, and the certificate's.
pub(super) fn check_pair(
    chain: &[rustls::pki_types::CertificateDer<'static>],
    key: &rustls::pki_types::PrivateKeyDer<'static>,
    (cert_flag, cert_path): (&'static str, &Path),
    (key_flag, key_path): (&'static str, &Path),
) -> Result<(), ConfigError> {
    tls::check_pair(chain, key).map_err(|e| {
        let reason = match e {
            tls::PairError::Mismatch => format!(
                "does not belong to the certificate of {cert_flag} {} (their public keys \
                 differ); give the key that certificate was issued for",
                cert_path.display()
            ),
            tls::PairError::UnsupportedKey(_) => e.to_string(),
        };
        ConfigError::File {
            flag: key_flag,
            path: key_path.to_owned(),
            reason,
            source: Some(Box::new(e)),
        }
    })
}
