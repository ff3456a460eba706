//! Explaining one request: deciding it with the server's own [`Decider`] and an observer that
//! records every authorizer's answer, then the response the server would send.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{Method, Response};
use http_body_util::BodyExt;

use super::{
    API_VERSION, Answer, AttributeTrial, AuthorizerAnswer, Conclusion, ConditionAnswer,
    ConditionOutcome, Explanation, KIND, PathVerdict, PodSet, RbacView, RequestInfo, UserInfo,
    WebhookStep,
};
use crate::authn::{Authentication, User};
use crate::authz::match_conditions::{ConditionResult, ConditionTrace};
use crate::authz::policy::lint::lint_policies;
use crate::authz::{AuthorizationError, Authorizer, AuthorizerChain, Decision};
use crate::request::decision::{Decider, Observer, Verdict};
use crate::request::outcome::Outcome;
use crate::request::responses::ResponseBody;

/// Explains `method target` for `user`, taken as authenticated, by deciding it exactly as the
/// server does ([`Decider::decide`]) with an observer that records each authorizer's answer, and
/// showing the response the server would send ([`crate::request::decision::Refusal::answer`]).
/// Webhook authorizers make real SubjectAccessReview calls.
pub async fn explain(decider: &Decider, method: &Method, target: &str, user: &User) -> Explanation {
    let (raw_path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let chain = &decider.authorizers;
    let mut recorder = Recorder {
        chain,
        decoded: String::new(),
        trials: Vec::new(),
        conditions: Vec::new(),
    };
    let caller = Arc::new(user.clone());
    let verdict = decider
        .decide(
            method,
            raw_path,
            query,
            async |_| Authentication::User(caller),
            &mut recorder,
        )
        .await;
    let path = match &verdict {
        Verdict::Redirect { location } => PathVerdict::Redirect {
            location: location.clone(),
        },
        Verdict::BadPath(reason) => PathVerdict::Rejected {
            reason: reason.to_string(),
        },
        Verdict::Unauthenticated { .. } | Verdict::Authorized(_) => PathVerdict::Canonical {
            decoded: recorder.decoded,
        },
    };
    let (verb, subresources, pod_attributes) = match &verdict {
        Verdict::Authorized(judgement) => (
            Some(judgement.attributes.verb),
            judgement.attributes.subresources.iter().collect(),
            judgement.pod.as_ref().map(|pod| PodSet {
                resource: pod.label,
                verb: pod.verb,
                namespace: pod.namespace.to_string(),
                name: pod.name.to_string(),
            }),
        ),
        _ => (None, Vec::new(), None),
    };
    let result = match verdict.refusal() {
        None => forwarded(),
        Some(refusal) => {
            let (response, outcome) = refusal.answer(method);
            refused(outcome, response).await
        }
    };
    let lint = lint_policies(
        chain.policies().iter().map(|p| &**p),
        &decider.mapping,
        &decider.node_name,
    );
    Explanation {
        api_version: API_VERSION,
        kind: KIND,
        request: RequestInfo {
            method: method.to_string(),
            path: target.to_owned(),
            user: UserInfo {
                username: user.name.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
            },
        },
        node_name: decider.node_name.to_string(),
        authorizers: chain.authorizers().iter().map(Authorizer::name).collect(),
        rbac: chain.rbac().map(|rbac| RbacView::of(&rbac.status())),
        path,
        verb,
        subresources,
        pod_attributes,
        attributes: recorder.trials,
        result,
        warnings: lint.warnings,
        unlisted_rules: lint.unlisted,
    }
}

/// Records the decoded path and, per attribute set, every authorizer's answer with the match
/// conditions it evaluated first; authorizers the chain did not ask (after the deciding one) are
/// listed as not asked.
struct Recorder<'a> {
    chain: &'a AuthorizerChain,
    decoded: String,
    trials: Vec<AttributeTrial>,
    /// The match conditions of the authorizer being asked, until its answer.
    conditions: Vec<ConditionAnswer>,
}

impl Recorder<'_> {
    /// The trial of `subresource`'s set, begun at its first answer. The chain's local
    /// authorizers answer on every set before a Webhook answers on any, so a set's answers do
    /// not all arrive together.
    fn trial(&mut self, subresource: &'static str) -> &mut AttributeTrial {
        let index = match self
            .trials
            .iter()
            .position(|t| t.subresource == subresource)
        {
            Some(index) => index,
            None => {
                self.trials.push(AttributeTrial {
                    subresource,
                    answers: Vec::with_capacity(self.chain.authorizers().len()),
                    decision: Answer::NotAsked,
                    decided_by: None,
                });
                self.trials.len() - 1
            }
        };
        &mut self.trials[index]
    }
}

impl Observer for Recorder<'_> {
    fn canonical(&mut self, decoded: &str) {
        decoded.clone_into(&mut self.decoded);
    }

    fn condition(
        &mut self,
        _subresource: &'static str,
        _authorizer: &Authorizer,
        condition: ConditionTrace<'_>,
    ) {
        let (result, error) = match condition.result {
            ConditionResult::True => (ConditionOutcome::True, None),
            ConditionResult::False => (ConditionOutcome::False, None),
            ConditionResult::Error(error) => (ConditionOutcome::Error, Some(error.cause())),
            ConditionResult::NotEvaluated => (ConditionOutcome::NotEvaluated, None),
        };
        self.conditions.push(ConditionAnswer {
            expression: condition.expression.to_owned(),
            result,
            error,
        });
    }

    fn answered(
        &mut self,
        subresource: &'static str,
        authorizer: &Authorizer,
        answer: &Result<Decision, AuthorizationError>,
    ) {
        let (answer, reason) = match answer {
            Ok(Decision::Allow(reason)) => (Answer::Allow, reason.to_string()),
            Ok(Decision::Deny(reason)) => (Answer::Deny, reason.to_string()),
            Ok(Decision::NoOpinion(reason)) => (Answer::NoOpinion, reason.to_string()),
            Err(error) => (Answer::Error, error.to_string()),
        };
        let match_conditions = std::mem::take(&mut self.conditions);
        let webhook = webhook_step(&match_conditions);
        self.trial(subresource).answers.push(AuthorizerAnswer {
            authorizer: authorizer.name(),
            answer,
            reason,
            match_conditions,
            webhook,
        });
    }

    fn decided(
        &mut self,
        subresource: &'static str,
        result: &Result<(Decision, Option<&'static str>), AuthorizationError>,
    ) {
        let chain = self.chain;
        let trial = self.trial(subresource);
        for authorizer in chain.authorizers().iter().skip(trial.answers.len()) {
            trial.answers.push(AuthorizerAnswer {
                authorizer: authorizer.name(),
                answer: Answer::NotAsked,
                reason: String::new(),
                match_conditions: Vec::new(),
                webhook: None,
            });
        }
        (trial.decision, trial.decided_by) = match result {
            Ok((Decision::Allow(_), by)) => (Answer::Allow, *by),
            Ok((Decision::Deny(_), by)) => (Answer::Deny, *by),
            Ok((Decision::NoOpinion(_), _)) => (Answer::NoOpinion, None),
            Err(_) => (Answer::Error, None),
        };
    }
}

/// What the match conditions made of the webhook: skipped on a false one, not called on an
/// error, called when all are true; `None` without conditions.
fn webhook_step(conditions: &[ConditionAnswer]) -> Option<WebhookStep> {
    let has = |outcome| conditions.iter().any(|c| c.result == outcome);
    if conditions.is_empty() {
        None
    } else if has(ConditionOutcome::False) {
        Some(WebhookStep::Skipped)
    } else if has(ConditionOutcome::Error) {
        Some(WebhookStep::NotCalled)
    } else {
        Some(WebhookStep::Called)
    }
}

/// The outcome of an allowed request: the kubelet answers.
fn forwarded() -> Conclusion {
    Conclusion {
        outcome: Outcome::Allowed,
        allowed: true,
        status: None,
        headers: BTreeMap::new(),
        body: None,
    }
}

/// A refusal as the proxy sends it: status, headers and body taken from the response itself.
async fn refused(outcome: Outcome, response: Response<ResponseBody>) -> Conclusion {
    let (parts, body) = response.into_parts();
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    // Refusals are built in memory (`Full`), so collecting them cannot fail.
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Conclusion {
        outcome,
        allowed: false,
        status: Some(parts.status.as_u16()),
        headers,
        body: Some(String::from_utf8_lossy(&body).into_owned()),
    }
}
