//! The audit log's metrics: events the writer dropped ([`super::writer`]), events the flood
//! budget kept out ([`super::budget`]) and events the audit policy omitted ([`super::policy`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::policy::OmittedEvents;
use crate::base::metrics::register;

/// Labels of suppressed audit events: why, and whether the caller was authenticated (never who:
/// the summary events name the identities).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SuppressedLabels {
    /// `budget` (the identity's own) or `overall_budget`.
    pub reason: &'static str,
    /// False for requests refused before authentication.
    pub authenticated: bool,
}

/// Labels of audit events an audit policy omitted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AuditOmittedLabels {
    /// `no_rule`, `level_none` or `omitted_stage`.
    reason: &'static str,
}

/// The audit families.
#[derive(Debug, Default)]
pub struct AuditMetrics {
    dropped: Counter,
    suppressed: Family<SuppressedLabels, Counter>,
    acts_refused: Counter,
    omitted: Family<AuditOmittedLabels, Counter>,
}

impl AuditMetrics {
    /// Registers the families in `registry`, whether or not there is an audit log (they stay at
    /// 0 or empty without one).
    pub fn register(registry: &mut Registry) -> AuditMetrics {
        let metrics = AuditMetrics::default();
        register! { registry, metrics;
            dropped => "audit_events_dropped", "Audit events not written: the writer fell behind (queue full) or writing failed";
            suppressed => "audit_events_suppressed", "Audit events not written because their identity's (reason budget) or the overall (overall_budget) flood budget was spent; summary events name the identities";
            acts_refused => "audit_acts_refused", "Requests that act (exec, attach, portForward, run, checkpoint, writes) refused with 429 before reaching the kubelet: the overall audit flood budget was spent and their identity wrote more than its fair share; summary events name the identities";
            omitted => "audit_events_omitted", "Audit events --audit-policy-file left out, by reason: no_rule (no rule matched: level None), level_none (the matching rule's level is None), omitted_stage (the rule's omitStages)";
        }
        metrics
    }

    /// The counter of dropped audit events, handed to the audit log.
    pub fn dropped(&self) -> Counter {
        self.dropped.clone()
    }

    /// The counters of audit events kept out of the log by the flood budget, each created at 0
    /// (the budget is in force).
    pub fn suppressed(&self) -> Family<SuppressedLabels, Counter> {
        for reason in ["budget", "overall_budget"] {
            for authenticated in [false, true] {
                drop(self.suppressed.get_or_create(&SuppressedLabels {
                    reason,
                    authenticated,
                }));
            }
        }
        self.suppressed.clone()
    }

    /// The counter of acts refused by the flood budget, handed to it.
    pub fn acts_refused(&self) -> Counter {
        self.acts_refused.clone()
    }

    /// The counters of audit events `--audit-policy-file` omits, one per reason, created now so
    /// counting takes no lock.
    pub fn omitted(&self) -> OmittedEvents {
        let reason = |reason| {
            self.omitted
                .get_or_create(&AuditOmittedLabels { reason })
                .clone()
        };
        OmittedEvents {
            no_rule: reason("no_rule"),
            level_none: reason("level_none"),
            omitted_stage: reason("omitted_stage"),
        }
    }
}
