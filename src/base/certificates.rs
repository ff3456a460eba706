//! When the certificates the proxy depends on expire, and when its watched files were last
//! reloaded. An expiring serving certificate, client CA, kubelet CA or client certificate is
//! silent until the day connections start failing; as timestamps, an alert can warn a week before
//! (docs/OPERATIONS.md). They are read from the files as they are on disk after each reload pass,
//! so a rotation shows at once, even to a certificate the proxy refuses (a key that does not
//! match: the previous version keeps serving, and `config_reloads_total{result="failed"}` says
//! so). A file that cannot be parsed at all keeps the figures last read.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tracing::debug;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::base::metrics::register;

/// A gauge of seconds since the Unix epoch.
type Timestamp = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Reads the certificates of a file; the error says why not, for the debug log.
pub type ReadCertificates = fn(&Path) -> Result<Vec<CertificateDer<'static>>, String>;

/// Where certificates the proxy uses are read from, and what for.
#[derive(Debug)]
pub struct CertificateSource {
    /// What the certificates are for: `serving`, `client_ca`, `upstream_ca`, `upstream_client`,
    /// `apiserver_ca` or `apiserver_client`.
    pub role: &'static str,
    /// The PEM file, or the kubeconfig holding them inline.
    pub file: PathBuf,
    /// How to find them in the file.
    pub read: ReadCertificates,
}

impl CertificateSource {
    /// Every certificate of the PEM file `file`, for `role`.
    pub fn pem(role: &'static str, file: PathBuf) -> CertificateSource {
        CertificateSource {
            role,
            file,
            read: read_pem,
        }
    }
}

/// Every certificate of a PEM file (one without any keeps the figures last read).
fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| e.to_string())?;
    if certificates.is_empty() {
        return Err("no certificate in the file".to_owned());
    }
    Ok(certificates)
}

/// Labels of a certificate's expiry.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    role: &'static str,
    file: String,
    /// Its place in the file, from 0 (a chain's leaf comes first).
    index: String,
    subject: String,
}

/// The expiry series set for each source, by role and file.
type SeriesBySource = HashMap<(&'static str, String), Vec<CertificateLabels>>;

/// Labels of a file's last reload.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadedLabels {
    target: &'static str,
    file: String,
}

/// The certificate and reload metrics, registered with the proxy's others.
#[derive(Debug, Clone, Default)]
pub struct CertificateMetrics {
    expiry: Family<CertificateLabels, Timestamp>,
    reloaded: Family<ReloadedLabels, Timestamp>,
    /// The expiry series set for each source (role and file), so that a certificate gone from a
    /// file loses its series.
    set: Arc<Mutex<SeriesBySource>>,
}

impl CertificateMetrics {
    /// Registers both families (empty until the first [`observe`](Self::observe)).
    pub fn register(registry: &mut Registry) -> CertificateMetrics {
        let metrics = CertificateMetrics::default();
        register! { registry, metrics;
            expiry => "certificate_expiration_timestamp_seconds", "notAfter of each certificate the proxy loads, as Unix time, by role (serving, client_ca, upstream_ca, upstream_client, apiserver_ca, apiserver_client), file and place in the file; read again after every reload pass";
            reloaded => "config_last_reload_success_timestamp_seconds", "When each watched file was last loaded into force (at start, then by a reload), as Unix time, by reload target and file";
        }
        metrics
    }

    /// Reads every source again and sets its certificates' expiry. A source that cannot be read
    /// or parsed now (a file caught mid-rotation) keeps its previous figures; certificates no
    /// longer in a file that was read are removed.
    pub fn observe(&self, sources: &[CertificateSource]) {
        for source in sources {
            let file = source.file.display().to_string();
            let certificates = match (source.read)(&source.file) {
                Ok(certificates) => certificates,
                Err(reason) => {
                    debug!(file, role = source.role, %reason, "certificates not read; their expiry stays as last read");
                    continue;
                }
            };
            let mut seen = Vec::with_capacity(certificates.len());
            for (index, der) in certificates.iter().enumerate() {
                let Ok((_, certificate)) = X509Certificate::from_der(der) else {
                    continue;
                };
                let labels = CertificateLabels {
                    role: source.role,
                    file: file.clone(),
                    index: index.to_string(),
                    subject: certificate.subject().to_string(),
                };
                self.expiry
                    .get_or_create(&labels)
                    .set(certificate.validity().not_after.timestamp() as f64);
                seen.push(labels);
            }
            // Only the watcher observes, once per pass: the lock is never contended.
            let Ok(mut set) = self.set.lock() else {
                continue;
            };
            let key = (source.role, file);
            for gone in set.get(&key).into_iter().flatten() {
                if !seen.contains(gone) {
                    self.expiry.remove(gone);
                }
            }
            set.insert(key, seen);
        }
    }

    /// Records that `paths` of `target` were just loaded into force.
    pub fn reloaded(&self, target: &'static str, paths: &[PathBuf]) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        for path in paths {
            self.reloaded
                .get_or_create(&ReloadedLabels {
                    target,
                    file: path.display().to_string(),
                })
                .set(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name` valid until the start of `year`, in PEM.
    fn certificate(name: &str, year: i32) -> String {
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    /// The text exposition of `metrics` alone.
    fn exposition(
        metrics: impl FnOnce(&mut Registry) -> CertificateMetrics,
    ) -> (CertificateMetrics, Registry) {
        let mut registry = Registry::default();
        (metrics(&mut registry), registry)
    }

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    /// The series of the expiry family, `labels value` each, sorted.
    fn expiry_lines(registry: &Registry) -> Vec<String> {
        let mut lines: Vec<String> = text(registry)
            .lines()
            .filter(|l| l.starts_with("certificate_expiration_timestamp_seconds{"))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn each_certificate_of_a_bundle_is_a_series_and_follows_the_file() {
        let dir = std::env::temp_dir().join(format!("kap-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ca.crt");
        std::fs::write(
            &file,
            certificate("old-ca", 2027) + &certificate("new-ca", 2036),
        )
        .unwrap();
        let (metrics, registry) = exposition(CertificateMetrics::register);
        let sources = [CertificateSource::pem("client_ca", file.clone())];

        metrics.observe(&sources);
        let f = file.display();
        // 2027-01-01 and 2036-01-01 as Unix time.
        assert_eq!(
            expiry_lines(&registry),
            [
                format!(
                    "certificate_expiration_timestamp_seconds{{role=\"client_ca\",file=\"{f}\",index=\"0\",subject=\"CN=old-ca\"}} 1798761600.0"
                ),
                format!(
                    "certificate_expiration_timestamp_seconds{{role=\"client_ca\",file=\"{f}\",index=\"1\",subject=\"CN=new-ca\"}} 2082758400.0"
                ),
            ]
        );

        // Mid-rotation garbage keeps what was last read.
        std::fs::write(
            &file,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        metrics.observe(&sources);
        assert_eq!(expiry_lines(&registry).len(), 2);

        // The old CA dropped from the bundle: its series goes.
        std::fs::write(&file, certificate("new-ca", 2036)).unwrap();
        metrics.observe(&sources);
        assert_eq!(
            expiry_lines(&registry),
            [format!(
                "certificate_expiration_timestamp_seconds{{role=\"client_ca\",file=\"{f}\",index=\"0\",subject=\"CN=new-ca\"}} 2082758400.0"
            )]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_reload_sets_the_time_of_each_of_its_files() {
        let (metrics, registry) = exposition(CertificateMetrics::register);
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        metrics.reloaded(
            "serving_certificate",
            &[
                PathBuf::from("/etc/kap/tls.crt"),
                PathBuf::from("/etc/kap/tls.key"),
            ],
        );
        let text = text(&registry);
        for file in ["/etc/kap/tls.crt", "/etc/kap/tls.key"] {
            let prefix = format!(
                "config_last_reload_success_timestamp_seconds{{target=\"serving_certificate\",file=\"{file}\"}} "
            );
            let line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("{prefix} in\n{text}"));
            let at: f64 = line[prefix.len()..].parse().unwrap();
            assert!(at >= before.floor(), "{line}");
        }
    }
}
