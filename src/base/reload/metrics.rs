//! What the file watcher reports: each reload and its result, and (through
//! [`CertificateMetrics`]) when each watched file was last loaded and when the certificates in
//! them expire.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::base::certificates::CertificateMetrics;
use crate::base::metrics::register;

/// Labels of reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    /// What was reloaded: `serving_certificate`, `client_ca`, `policy`, `upstream_tls` or
    /// `apiserver_credentials`.
    target: &'static str,
    /// `applied` (the new version is in force) or `failed` (it could not be used; the previous
    /// one stays in force).
    result: &'static str,
}

/// The reload counters and the certificate metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    reloads: Family<ReloadLabels, Counter>,
    certificates: CertificateMetrics,
}

impl ReloadMetrics {
    /// Registers the reload counters and the certificate metrics in `registry`.
    pub fn register(registry: &mut Registry) -> ReloadMetrics {
        let metrics = ReloadMetrics {
            reloads: Family::default(),
            certificates: CertificateMetrics::register(registry),
        };
        register! { registry, metrics;
            reloads => "config_reloads", "Reloads of the serving certificate, client CA and policy files after they changed on disk";
        }
        metrics
    }

    /// Creates the reload counters of `target` at 0 (applied and failed), once the target is
    /// watched, so an alert's `increase()` sees its first failed reload.
    pub fn watch(&self, target: &'static str) {
        for result in ["applied", "failed"] {
            drop(self.reloads.get_or_create(&ReloadLabels { target, result }));
        }
    }

    /// Records a reload after a file change: `applied`, or failed (the old version stays).
    pub fn observe(&self, target: &'static str, applied: bool) {
        let result = if applied { "applied" } else { "failed" };
        self.reloads
            .get_or_create(&ReloadLabels { target, result })
            .inc();
    }

    /// Certificate expiry and the last reload of each watched file.
    pub fn certificates(&self) -> &CertificateMetrics {
        &self.certificates
    }
}
