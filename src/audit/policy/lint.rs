//! What `check-config` and start-up say about a policy: rules that would leave nothing of an act
//! ([`crate::audit::acts`]), which is recorded at `Metadata` anyway, so the operator learns that
//! the file does not do what it says for those requests.

use super::{AuditPolicy, Level, PolicyRequest};
use crate::audit::Stage;

/// An act to try the policy on: how messages name it, and what its audit event carries.
#[derive(Debug, Clone, Copy)]
pub struct ActSample<'a> {
    /// E.g. `create nodes/proxy (POST /exec/…)`.
    pub label: &'a str,
    /// What the act's event carries; the user is ignored (rules naming users or groups are
    /// assumed to match some caller).
    pub request: PolicyRequest<'a>,
}

/// One warning per rule that would leave nothing of some act in `samples` (level `None`, or
/// `ResponseComplete` omitted), naming the first such act; and one if some act can match no rule
/// for some caller, falling to the default level `None`.
pub fn act_warnings(policy: &AuditPolicy, samples: &[ActSample<'_>]) -> Vec<String> {
    let rules = policy.rules();
    let mut flagged = vec![false; rules.len()];
    let mut warnings = Vec::new();
    let mut unmatched = None;
    for sample in samples {
        let mut settled = false;
        for (index, rule) in rules.iter().enumerate() {
            if !rule.matches_request(&sample.request) {
                continue;
            }
            if !flagged[index] {
                let leaves_nothing = match rule.level {
                    Level::None => Some("level None".to_owned()),
                    Level::Metadata if rule.omit_stages.contains(Stage::ResponseComplete) => {
                        Some("omitStages with ResponseComplete".to_owned())
                    }
                    Level::Metadata => None,
                };
                if let Some(what) = leaves_nothing {
                    flagged[index] = true;
                    warnings.push(format!(
                        "rules[{index}] ({what}) matches acts such as {}: acts (exec, attach, \
                         portForward, run, checkpoint, any write) are recorded at Metadata \
                         whatever the policy says; narrow the rule (verbs: [get], or \
                         resources) to say what it does",
                        sample.label
                    ));
                }
            }
            if !rule.constrains_user() {
                settled = true;
                break;
            }
        }
        if !settled && unmatched.is_none() {
            unmatched = Some(sample.label);
        }
    }
    if let Some(label) = unmatched {
        warnings.push(format!(
            "acts such as {label} match no rule for some callers, so the policy gives them level \
             None (as kube-apiserver does for requests no rule matches); acts are recorded at \
             Metadata anyway; end the policy with `- level: Metadata` to say so"
        ));
    }
    warnings
}
