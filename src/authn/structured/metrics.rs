//! The metrics of `--authentication-config`, named after kube-apiserver's so that dashboards and
//! alerts built for the control plane read the node the same way: the configuration's reloads
//! (`apiserver_authentication_config_controller_*`: each reload's status and time, the hash of the
//! configuration in force) and each JWT authenticator's decisions
//! (`apiserver_authentication_jwt_authenticator_latency_seconds`, by result and issuer hash),
//! with the reason of each refusal, which kube-apiserver only logs.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::base::metrics::{latency_histogram, register};

type Timestamp = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Labels of reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    /// `success` or `failure`.
    status: &'static str,
}

/// Labels of the configuration in force.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HashLabels {
    /// `sha256:` and the hex SHA-256 of the file.
    hash: String,
}

/// Labels of decisions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabels {
    /// `success` or `failure`.
    result: &'static str,
    /// `sha256:` and the hex SHA-256 of the issuer URL.
    jwt_issuer_hash: String,
}

/// Every reason a token of a configured issuer is refused for.
pub const REFUSAL_REASONS: [&str; 11] = [
    "malformed",
    "issuer",
    "audience",
    "expired",
    "not_yet_valid",
    "algorithm",
    "unknown_key",
    "signature",
    "not_initialized",
    "mapping",
    "distributed_claims",
];

/// Labels of refusals.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusalLabels {
    /// Why: one of [`REFUSAL_REASONS`].
    reason: &'static str,
    /// `sha256:` and the hex SHA-256 of the issuer URL.
    jwt_issuer_hash: String,
}

/// Builds the decision histograms with the shared latency buckets.
#[derive(Debug, Clone)]
struct LatencyBuckets;

impl MetricConstructor<Histogram> for LatencyBuckets {
    fn new_metric(&self) -> Histogram {
        latency_histogram()
    }
}

/// The families; cheap to clone.
#[derive(Debug, Clone)]
pub struct StructuredMetrics {
    reloads: Family<StatusLabels, Counter>,
    reload_timestamp: Family<StatusLabels, Timestamp>,
    config_info: Family<HashLabels, Gauge>,
    latency: Family<DecisionLabels, Histogram, LatencyBuckets>,
    refusals: Family<RefusalLabels, Counter>,
}

impl StructuredMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> StructuredMetrics {
        let metrics = StructuredMetrics {
            reloads: Family::default(),
            reload_timestamp: Family::default(),
            config_info: Family::default(),
            latency: Family::new_with_constructor(LatencyBuckets),
            refusals: Family::default(),
        };
        register! { registry, metrics;
            reloads => "authentication_config_controller_automatic_reloads", "Reloads of --authentication-config after the file changed, by status (success, failure: the previous configuration stays in force), as kube-apiserver's apiserver_authentication_config_controller_automatic_reloads_total";
            reload_timestamp => "authentication_config_controller_automatic_reload_last_timestamp_seconds", "When --authentication-config was last reloaded, by status, in Unix seconds";
            config_info => "authentication_config_controller_last_config_info", "The --authentication-config in force: 1 for the hash (sha256:hex) of its file";
            latency => "jwt_authenticator_latency_seconds", "Time to decide a token of a configured JWT issuer on the node, by result (success, failure) and jwt_issuer_hash (sha256:hex of the issuer URL)";
            refusals => "jwt_authenticator_refusals", "Tokens of configured JWT issuers refused on the node, by reason and jwt_issuer_hash";
        }
        metrics
    }

    /// Records the configuration loaded at start (or applied by a reload when `reloaded`),
    /// whose file has `hash`.
    pub fn applied(&self, hash: &str, reloaded: bool) {
        self.config_info.clear();
        self.config_info
            .get_or_create(&HashLabels {
                hash: hash.to_owned(),
            })
            .set(1);
        for status in ["success", "failure"] {
            drop(self.reloads.get_or_create(&StatusLabels { status }));
        }
        if reloaded {
            self.reloaded("success");
        }
    }

    /// Records a reload that failed: the previous configuration stays in force.
    pub fn reload_failed(&self) {
        self.reloaded("failure");
    }

    fn reloaded(&self, status: &'static str) {
        self.reloads.get_or_create(&StatusLabels { status }).inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.reload_timestamp
            .get_or_create(&StatusLabels { status })
            .set(now);
    }

    /// The handles one issuer's decisions are recorded with, made once per configuration so
    /// that a request allocates no label.
    pub fn issuer(&self, issuer_hash: &str) -> IssuerMetrics {
        let latency = |result| {
            self.latency
                .get_or_create(&DecisionLabels {
                    result,
                    jwt_issuer_hash: issuer_hash.to_owned(),
                })
                .clone()
        };
        // Every reason's counter exists at 0 from the start, so that an alert's increase() sees
        // the first refusal.
        for reason in REFUSAL_REASONS {
            drop(self.refusals.get_or_create(&RefusalLabels {
                reason,
                jwt_issuer_hash: issuer_hash.to_owned(),
            }));
        }
        IssuerMetrics {
            success: latency("success"),
            failure: latency("failure"),
            refusals: self.refusals.clone(),
            issuer_hash: issuer_hash.to_owned(),
        }
    }
}

/// One issuer's decision metrics.
#[derive(Debug, Clone)]
pub struct IssuerMetrics {
    success: Histogram,
    failure: Histogram,
    refusals: Family<RefusalLabels, Counter>,
    issuer_hash: String,
}

impl IssuerMetrics {
    /// Records a decision that took `seconds`, refused for `refusal` if it was.
    pub fn decided(&self, seconds: f64, refusal: Option<&'static str>) {
        match refusal {
            None => self.success.observe(seconds),
            Some(reason) => {
                self.failure.observe(seconds);
                self.refusals
                    .get_or_create(&RefusalLabels {
                        reason,
                        jwt_issuer_hash: self.issuer_hash.clone(),
                    })
                    .inc();
            }
        }
    }
}

/// `sha256:` and the hex SHA-256 of `bytes`: kube-apiserver's form of the issuer and
/// configuration hashes in its metric labels.
pub fn sha256_label(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut label = String::with_capacity(7 + 64);
    label.push_str("sha256:");
    for byte in digest.as_ref() {
        // Writing into a String cannot fail.
        let _ = write!(label, "{byte:02x}");
    }
    label
}
