//! What the file watcher reports: each reload and its result, and (through
//! [`CertificateMetrics`]) when each watched file was last loaded and when the certificates in
//! them expire.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::base::certificates::CertificateMetrics;

/// The outcome of reloading a file-backed setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadResult {
    /// The new version is in force.
    Applied,
    /// The new version could not be used; the previous one stays in force.
    Failed,
}

impl EncodeLabelValue for ReloadResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Failed => "failed",
        };
        EncodeLabelValue::encode(&value, encoder)
    }
}

/// Labels of reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReloadLabels {
    /// What was reloaded: `serving_certificate`, `client_ca`, `policy`, `upstream_tls` or
    /// `apiserver_credentials`.
    pub target: &'static str,
    /// Whether the new version is in force.
    pub result: ReloadResult,
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
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Reloads of the serving certificate, client CA and policy files after they changed on disk",
            reloads.clone(),
        );
        ReloadMetrics {
            reloads,
            certificates: CertificateMetrics::register(registry),
        }
    }

    /// Creates the reload counters of `target` at 0 (applied and failed), once the target is
    /// watched, so an alert's `increase()` sees its first failed reload.
    pub fn watch(&self, target: &'static str) {
        for result in [ReloadResult::Applied, ReloadResult::Failed] {
            drop(self.reloads.get_or_create(&ReloadLabels { target, result }));
        }
    }

    /// Records a reload after a file change.
    pub fn observe(&self, target: &'static str, result: ReloadResult) {
        self.reloads
            .get_or_create(&ReloadLabels { target, result })
            .inc();
    }

    /// Certificate expiry and the last reload of each watched file.
    pub fn certificates(&self) -> &CertificateMetrics {
        &self.certificates
    }
}
