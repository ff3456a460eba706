//! Authorization's metrics: the webhooks' match conditions (reviews skipped by a false one,
//! conditions that could not be evaluated) and the `RBAC` authorizer's watches
//! ([`super::live_rbac::metrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::live_rbac::metrics::RbacMetrics;
use crate::base::metrics::register;

/// Labels of a webhook authorizer's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AuthorizerLabels {
    /// The authorizer's name in `--authorization-config` (`webhook` for
    /// `--authorization-mode=Webhook`): a fixed set, from the configuration.
    name: String,
}

/// The authorization families (a default one is registered nowhere: `explain`, tests).
#[derive(Debug, Default)]
pub struct AuthzMetrics {
    condition_exclusions: Family<AuthorizerLabels, Counter>,
    condition_errors: Family<AuthorizerLabels, Counter>,
    rbac: RbacMetrics,
}

impl AuthzMetrics {
    /// Registers the families in `registry`, the `RBAC` authorizer's whether or not the mode is
    /// configured (they stay empty without it).
    pub fn register(registry: &mut Registry) -> AuthzMetrics {
        let metrics = AuthzMetrics {
            rbac: RbacMetrics::register(registry),
            ..AuthzMetrics::default()
        };
        register! { registry, metrics;
            condition_exclusions => "authorization_match_condition_exclusions", "Webhook authorizations skipped because a matchCondition was false (no opinion, no SubjectAccessReview), by authorizer";
            condition_errors => "authorization_match_condition_evaluation_errors", "Webhook authorizations whose matchConditions could not be evaluated (the failurePolicy answered), by authorizer";
        }
        metrics
    }

    /// The counter of `name`'s webhook authorizations skipped by a false match condition, handed
    /// to that authorizer once so counting costs no label lookup.
    pub fn match_condition_exclusions(&self, name: &str) -> Counter {
        self.condition_exclusions
            .get_or_create(&AuthorizerLabels {
                name: name.to_owned(),
            })
            .clone()
    }

    /// The counter of `name`'s webhook authorizations whose match conditions failed.
    pub fn match_condition_errors(&self, name: &str) -> Counter {
        self.condition_errors
            .get_or_create(&AuthorizerLabels {
                name: name.to_owned(),
            })
            .clone()
    }

    /// The `RBAC` authorizer's metrics.
    pub fn rbac(&self) -> &RbacMetrics {
        &self.rbac
    }
}
