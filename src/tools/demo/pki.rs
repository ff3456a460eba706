//! Throwaway certificates for the demo: one CA for everything the demo trusts, and a stranger CA
//! whose certificates the proxy must refuse. Written as PEM files so the printed curl commands work.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A failure to make or write a certificate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The file could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a certificate is for.
pub enum Usage<'a> {
    /// A TLS server for these DNS names / IP addresses.
    Server(&'a [&'a str]),
    /// A TLS client.
    Client,
}

/// The PEM files of one issued certificate.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A certificate authority that writes what it issues into a directory.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

fn write(path: PathBuf, contents: &str) -> Result<PathBuf, PkiError> {
    std::fs::write(&path, contents).map_err(|source| PkiError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

impl Authority {
    /// A new self-signed CA named `name`; its certificate is written to `<dir>/<file_stem>.crt`.
    pub fn new(dir: &Path, file_stem: &str, name: &str) -> Result<Authority, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        write(dir.join(format!("{file_stem}.crt")), &issuer.pem())?;
        Ok(Authority {
            issuer,
            dir: dir.to_owned(),
        })
    }

    /// Issues a certificate with common name `cn` and organizations (Kubernetes groups) `groups`,
    /// written as `<file_stem>.crt` and `<file_stem>.key`.
    pub fn issue(
        &self,
        file_stem: &str,
        cn: &str,
        groups: &[&str],
        usage: Usage<'_>,
    ) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        match usage {
            Usage::Server(names) => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                for name in names {
                    params.subject_alt_names.push(match name.parse() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => SanType::DnsName((*name).try_into()?),
                    });
                }
            }
            Usage::Client => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert: write(self.dir.join(format!("{file_stem}.crt")), &cert.pem())?,
            key: write(
                self.dir.join(format!("{file_stem}.key")),
                &key.serialize_pem(),
            )?,
        })
    }
}
