//! `--audit-policy-file`: which requests' audit events are written, decided by an
//! `audit.k8s.io/v1` `Policy` read as kube-apiserver reads it, so operators reuse the file format
//! they already know to silence their scrapers.
//!
//! - [`file`]: the file's text → a validated [`AuditPolicy`]; what the proxy cannot honour (the
//!   levels that record bodies) is refused there, naming the rule and the field;
//! - [`rules`]: one compiled rule and how it matches a request, as kube-apiserver's policy
//!   checker does; sets built at load, so matching neither locks nor allocates;
//! - [`lint`]: what `check-config` and start-up warn about (rules that would omit acts).
//!
//! The first matching rule decides the level and the stages to omit; a request no rule matches
//! gets level `None` and is not recorded, as in kube-apiserver. Acts ([`crate::audit::acts`])
//! are the exception: when the policy would leave nothing of one, it is recorded at `Metadata`.

mod file;
pub mod lint;
mod rules;

use prometheus_client::metrics::counter::Counter;

use super::{ObjectRef, Stage};
use crate::authn::User;
use rules::Rule;

pub use file::PolicyFileError;

/// How much of a request an event records. Only the levels without bodies exist here:
/// `Request` and `RequestResponse` are refused at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// No event.
    None,
    /// The event the proxy always wrote: who, what, when, the outcome; never a body.
    Metadata,
}

/// A set of the stages of `audit.k8s.io/v1`, as `omitStages` names them. The proxy writes only
/// `ResponseStarted` (streams) and `ResponseComplete`; `RequestReceived` and `Panic` are accepted
/// in files and never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stages(u8);

impl Stages {
    /// No stage.
    pub const NONE: Stages = Stages(0);
    const REQUEST_RECEIVED: u8 = 1;
    const RESPONSE_STARTED: u8 = 2;
    const RESPONSE_COMPLETE: u8 = 4;
    const PANIC: u8 = 8;
    /// Every stage.
    pub const ALL: Stages = Stages(15);

    /// The stage a name of `omitStages` stands for.
    fn named(name: &str) -> Option<Stages> {
        match name {
            "RequestReceived" => Some(Stages(Stages::REQUEST_RECEIVED)),
            "ResponseStarted" => Some(Stages(Stages::RESPONSE_STARTED)),
            "ResponseComplete" => Some(Stages(Stages::RESPONSE_COMPLETE)),
            "Panic" => Some(Stages(Stages::PANIC)),
            _ => None,
        }
    }

    fn bit(stage: Stage) -> u8 {
        match stage {
            Stage::ResponseStarted => Stages::RESPONSE_STARTED,
            Stage::ResponseComplete => Stages::RESPONSE_COMPLETE,
        }
    }

    /// Whether `stage` is in the set.
    pub fn contains(self, stage: Stage) -> bool {
        self.0 & Stages::bit(stage) != 0
    }

    fn union(self, other: Stages) -> Stages {
        Stages(self.0 | other.0)
    }

    fn without(self, other: Stages) -> Stages {
        Stages(self.0 & !other.0)
    }

    /// The stages a request's events have: `ResponseStarted` too when it is a stream.
    fn of_request(stream: bool) -> Stages {
        if stream {
            Stages(Stages::RESPONSE_STARTED | Stages::RESPONSE_COMPLETE)
        } else {
            Stages(Stages::RESPONSE_COMPLETE)
        }
    }
}

/// What the policy sees of a request: what its audit event carries.
#[derive(Debug, Clone, Copy)]
pub struct PolicyRequest<'a> {
    /// The authenticated caller; `None` before (or without) authentication.
    pub user: Option<&'a User>,
    /// The Kubernetes verb (`get`, `create`, …).
    pub verb: &'a str,
    /// The Node or pod subresource; `None` when the request was refused before its path was
    /// mapped.
    pub object_ref: Option<&'a ObjectRef>,
    /// The request path as received (percent-encoded, without the query): what `nonResourceURLs`
    /// match.
    pub path: &'a str,
}

/// What the policy decided for one request: the level, the stages omitted, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyDecision {
    /// The level of the first matching rule, or `None` when none matched.
    pub level: Level,
    /// The policy's `omitStages` and the rule's together.
    pub omit_stages: Stages,
    /// The index of the matching rule in `rules`, `None` when none matched.
    pub rule: Option<usize>,
}

/// A loaded, validated audit policy: the rules in file order, each compiled for matching.
#[derive(Debug)]
pub struct AuditPolicy {
    rules: Vec<Rule>,
    /// The top-level `omitStages`, for requests no rule matches (already part of every rule's).
    omit_stages: Stages,
}

impl AuditPolicy {
    /// The decision for `request`: the first rule that matches, as kube-apiserver's checker.
    pub fn decide(&self, request: &PolicyRequest<'_>) -> PolicyDecision {
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.matches(request) {
                return PolicyDecision {
                    level: rule.level,
                    omit_stages: rule.omit_stages,
                    rule: Some(index),
                };
            }
        }
        PolicyDecision {
            level: Level::None,
            omit_stages: self.omit_stages,
            rule: None,
        }
    }

    /// The compiled rules, for [`lint`].
    fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// Audit events the policy omitted, by reason: the counters of
/// `kubelet_auth_proxy_audit_events_omitted_total`, created once so counting takes no lock.
#[derive(Debug, Clone, Default)]
pub struct OmittedEvents {
    /// No rule matched: level `None` by default.
    pub no_rule: Counter,
    /// The matching rule's level is `None`.
    pub level_none: Counter,
    /// The matching rule (or the policy) omits the event's stage.
    pub omitted_stage: Counter,
}

/// A policy in service: the policy and the counters of what it omits.
#[derive(Debug)]
pub struct PolicyGate {
    policy: AuditPolicy,
    omitted: OmittedEvents,
}

impl PolicyGate {
    /// Applies `policy`, counting what it omits in `omitted`.
    pub fn new(policy: AuditPolicy, omitted: OmittedEvents) -> PolicyGate {
        PolicyGate { policy, omitted }
    }

    /// The stages of `request`'s events to write (`stream`: it has a `ResponseStarted` event
    /// too), counting each event omitted. An act (`acts`) of which the policy would leave nothing
    /// is written whole, at `Metadata`: its events are the evidence of what was done.
    pub fn stages_kept(&self, request: &PolicyRequest<'_>, acts: bool, stream: bool) -> Stages {
        let events = Stages::of_request(stream);
        let decision = self.policy.decide(request);
        let kept = match decision.level {
            Level::None => Stages::NONE,
            Level::Metadata => events.without(decision.omit_stages),
        };
        if kept == Stages::NONE && acts {
            return events;
        }
        let counter = match (decision.level, decision.rule) {
            (Level::None, None) => &self.omitted.no_rule,
            (Level::None, Some(_)) => &self.omitted.level_none,
            (Level::Metadata, _) => &self.omitted.omitted_stage,
        };
        let omitted = events.without(kept).0.count_ones();
        if omitted > 0 {
            counter.inc_by(u64::from(omitted));
        }
        kept
    }
}

#[cfg(test)]
mod tests;
