//! Authentication's metrics: service-account tokens refused on the node and the issuer's keys
//! behind that check ([`super::service_account_keys`]), and tokens answered 401 without a review
//! because their source's failures were over budget ([`super::failure_budget`]); and, registered
//! with them, those of `--authentication-config` ([`super::structured::metrics`], the issuers'
//! keys: [`super::structured::keys`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::jwt::Rejection;
use super::structured::keys::KeysMetrics;
use super::structured::metrics::StructuredMetrics;
use crate::base::metrics::register;

/// Labels of tokens refused on the node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LocalRejectionLabels {
    /// [`Rejection::as_str`].
    reason: &'static str,
}

/// Labels of tokens answered 401 without a TokenReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SkippedBudgetLabels {
    /// The budget that was spent: `source` or `overall`.
    budget: &'static str,
}

/// Labels of fetches of the service-account issuer's keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FetchResultLabels {
    /// `success` or `failed`.
    result: &'static str,
}

/// The authentication families.
#[derive(Debug)]
pub struct AuthnMetrics {
    refused_locally: Family<LocalRejectionLabels, Counter>,
    key_fetches: Family<FetchResultLabels, Counter>,
    keys: Gauge,
    reviews_skipped: Family<SkippedBudgetLabels, Counter>,
    /// `--authentication-config`'s reloads and decisions.
    pub structured: StructuredMetrics,
    /// The fetches of its issuers' keys.
    pub issuer_keys: KeysMetrics,
}

impl AuthnMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> AuthnMetrics {
        let metrics = AuthnMetrics {
            refused_locally: Family::default(),
            key_fetches: Family::default(),
            keys: Gauge::default(),
            reviews_skipped: Family::default(),
            structured: StructuredMetrics::register(registry),
            issuer_keys: KeysMetrics::register(registry),
        };
        register! { registry, metrics;
            refused_locally => "tokens_refused_locally", "Bearer tokens of the cluster's service-account issuer refused on the node, without a TokenReview, by reason: malformed, unknown_key, signature, expired, not_yet_valid, audience, algorithm";
            key_fetches => "service_account_key_fetches", "Fetches of the service-account issuer's public keys from the API server, by result (success, failed)";
            reviews_skipped => "token_reviews_skipped", "Bearer tokens answered 401 without a TokenReview because their source's failed authentications were over budget, by the budget spent: source (the source's own) or overall (the node's)";
            keys => "service_account_keys", "Public keys of the service-account issuer held for checking tokens on the node (0: none, every token goes to TokenReview)";
        }
        metrics
    }

    /// Creates the counters of tokens refused on the node and of key fetches at 0: service-account
    /// tokens are checked on the node.
    pub fn service_account_keys_watched(&self) {
        for rejection in Rejection::ALL {
            drop(self.refused_locally.get_or_create(&LocalRejectionLabels {
                reason: rejection.as_str(),
            }));
        }
        for result in ["success", "failed"] {
            drop(
                self.key_fetches
                    .get_or_create(&FetchResultLabels { result }),
            );
        }
    }

    /// Counts a token refused on the node.
    pub fn token_refused_locally(&self, rejection: Rejection) {
        self.refused_locally
            .get_or_create(&LocalRejectionLabels {
                reason: rejection.as_str(),
            })
            .inc();
    }

    /// Counts a fetch of the issuer's keys; a success sets how many are held.
    pub fn service_account_keys_fetched(&self, success: bool, keys: usize) {
        let result = if success { "success" } else { "failed" };
        self.key_fetches
            .get_or_create(&FetchResultLabels { result })
            .inc();
        if success {
            self.keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
        }
    }

    /// The counters of tokens answered 401 without a review, by the budget spent (`source` or
    /// `overall`), created at 0: tokens are reviewed, so their failures are budgeted.
    pub fn token_reviews_skipped(&self) -> [Counter; 2] {
        ["source", "overall"].map(|budget| {
            self.reviews_skipped
                .get_or_create(&SkippedBudgetLabels { budget })
                .clone()
        })
    }
}
