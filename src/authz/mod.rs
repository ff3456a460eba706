//! May they do it: authorizer attributes, decisions, and the authorizer chain.
//!
//! The chain has the union semantics of `k8s.io/apiserver` (v0.33
//! `pkg/authorization/union/union.go` `Authorize`): authorizers are asked
//! in order, the first `Allow` or `Deny` wins, `NoOpinion` moves on. The kubelet's own loop over
//! the attribute list (kubernetes v1.33 `pkg/kubelet/server/server.go` `InstallAuthFilter`: only
//! `Allow` stops, an error is a 500 at once) lives in
//! [`crate::request::decision::authorize_request`].

pub mod attributes;
pub mod live_rbac;
pub mod match_conditions;
pub mod metrics;
pub mod node;
pub mod pod_attributes;
pub mod policy;
pub mod rbac;
pub mod webhook;

use std::fmt;
use std::sync::Arc;

use crate::authn::User;
use crate::base::reload::Reloadable;
use live_rbac::RbacAuthorizer;
use match_conditions::{ConditionTrace, MatchError};
use node::NodeAuthorizer;
use policy::PolicyAuthorizer;
use webhook::SubjectAccessReviewAuthorizer;

/// The resource every kubelet attribute names.
pub const RESOURCE: &str = "nodes";
/// The resource of the pod-level attributes (`--pod-scoped-authz`).
pub const POD_RESOURCE: &str = "pods";
/// The API version every kubelet attribute carries.
pub const API_VERSION: &str = "v1";

/// The authorizer attributes of one kubelet request for one subresource, borrowed from the request.
///
/// The kubelet's own sets are `nodes/<subresource>` on the Node, namespace `""`; the pod-level set
/// of `--pod-scoped-authz` is `pods/<subresource>` on the pod, in its namespace. The remaining
/// Kubernetes fields are constant: apiGroup `""`, apiVersion [`API_VERSION`], resourceRequest
/// `true`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The authenticated caller.
    pub user: &'a User,
    /// `get`, `create`, …; empty for methods the kubelet does not map (HEAD, OPTIONS, …).
    pub verb: &'a str,
    /// `""` for the kubelet's sets; the pod's namespace for the pod-level set.
    pub namespace: &'a str,
    /// [`RESOURCE`] (`nodes`) or [`POD_RESOURCE`] (`pods`).
    pub resource: &'static str,
    /// `proxy`, `stats`, `pods`, …; `exec`, `log`, … for the pod-level set.
    pub subresource: &'a str,
    /// The Node name of the kubelet behind the proxy (`--node-name`), or the pod's name.
    pub name: &'a str,
    /// The percent-decoded request path.
    pub path: &'a str,
}

impl<'a> Attributes<'a> {
    /// One of the kubelet's own sets: `verb` on `nodes/<subresource>` of the Node `node`, for the
    /// decoded `path`.
    pub fn node(
        user: &'a User,
        verb: &'a str,
        subresource: &'a str,
        node: &'a str,
        path: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            user,
            verb,
            namespace: "",
            resource: RESOURCE,
            subresource,
            name: node,
            path,
        }
    }
}

/// Why an authorizer decided as it did. Never shown to clients (the kubelet discards it); it goes
/// to logs, audit and `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A fixed message.
    Static(&'static str),
    /// A message built once and shared, e.g. a policy binding's description.
    Shared(Arc<str>),
}

impl Reason {
    /// The text, borrowed: audit annotations write it without building a string.
    pub fn as_str(&self) -> &str {
        match self {
            Reason::Static(s) => s,
            Reason::Shared(s) => s,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authorizer's answer. Errors are not a decision: they are `Err` and become HTTP 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The request may proceed.
    Allow(Reason),
    /// The request is refused by this authorizer; later authorizers are not asked.
    Deny(Reason),
    /// This authorizer does not decide; the next one is asked.
    NoOpinion(Reason),
}

/// An authorizer could not decide: the kubelet answers 500 and tries no further attribute.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthorizationError {
    /// The SubjectAccessReview failed after its retries, or its answer was unusable.
    #[error("SubjectAccessReview: {0}")]
    Webhook(String),
    /// A webhook's match conditions could not be evaluated (and none was false).
    #[error("matchConditions: {0}")]
    MatchConditions(#[source] MatchError),
}

/// What the chain shows its observer while it decides one attribute set, authorizer by
/// authorizer.
#[derive(Debug, Clone, Copy)]
pub enum ChainEvent<'a> {
    /// One of a Webhook authorizer's match conditions, before its answer.
    Condition(ConditionTrace<'a>),
    /// The authorizer's answer.
    Answer(&'a Result<Decision, AuthorizationError>),
}

/// One authorizer of the chain. A closed set: an enum is simpler and faster than trait objects.
pub enum Authorizer {
    /// Allows everything.
    AlwaysAllow,
    /// Has no opinion on anything, with the reason Kubernetes gives (it never denies explicitly).
    AlwaysDeny,
    /// Node identities only on their own node.
    Node(NodeAuthorizer),
    /// Local RBAC rules, reloaded when their files change.
    Policy(Arc<Reloadable<PolicyAuthorizer>>),
    /// The cluster's RBAC objects, watched and decided on the node.
    Rbac(Arc<RbacAuthorizer>),
    /// SubjectAccessReview with the API server.
    Webhook(Arc<SubjectAccessReviewAuthorizer>),
}

impl Authorizer {
    /// The mode name, as written in `--authorization-mode`.
    pub fn name(&self) -> &'static str {
        match self {
            Authorizer::AlwaysAllow => "AlwaysAllow",
            Authorizer::AlwaysDeny => "AlwaysDeny",
            Authorizer::Node(_) => "Node",
            Authorizer::Policy(_) => "Policy",
            Authorizer::Rbac(_) => "RBAC",
            Authorizer::Webhook(_) => "Webhook",
        }
    }

    /// Whether an error of this authorizer ends the chain (a webhook with `failurePolicy: Deny`).
    fn stops_chain_on_error(&self) -> bool {
        matches!(self, Authorizer::Webhook(webhook) if webhook.stops_chain_on_error())
    }

    /// This authorizer's decision on one attribute set, showing `on_condition` each match
    /// condition a Webhook authorizer evaluates first.
    async fn authorize_observed(
        &self,
        attrs: &Attributes<'_>,
        on_condition: impl FnMut(ConditionTrace<'_>),
    ) -> Result<Decision, AuthorizationError> {
        Ok(match self {
            Authorizer::AlwaysAllow => Decision::Allow(Reason::Static("AlwaysAllow")),
            Authorizer::AlwaysDeny => {
                Decision::NoOpinion(Reason::Static("Everything is forbidden."))
            }
            Authorizer::Node(node) => node.authorize(attrs),
            Authorizer::Policy(policy) => policy.current().authorize(attrs),
            Authorizer::Rbac(rbac) => rbac.authorize(attrs),
            Authorizer::Webhook(webhook) => {
                return webhook.authorize_observed(attrs, on_condition).await;
            }
        })
    }
}

/// Authorizers asked in order; the first `Allow` or `Deny` wins (union semantics).
pub struct AuthorizerChain {
    authorizers: Vec<Authorizer>,
}

impl AuthorizerChain {
    /// A chain of at least one authorizer.
    pub fn new(authorizers: Vec<Authorizer>) -> AuthorizerChain {
        AuthorizerChain { authorizers }
    }

    /// The authorizers in the order they are asked, for tools that show each one's answer
    /// (`explain`).
    pub fn authorizers(&self) -> &[Authorizer] {
        &self.authorizers
    }

    /// The local policies in force, in chain order, for tools that inspect them.
    pub fn policies(&self) -> Vec<Arc<PolicyAuthorizer>> {
        self.authorizers
            .iter()
            .filter_map(|a| match a {
                Authorizer::Policy(policy) => Some(policy.current_arc()),
                _ => None,
            })
            .collect()
    }

    /// The chain's `RBAC` authorizer, if it has one (`/readyz` waits for its first sync).
    pub fn rbac(&self) -> Option<Arc<RbacAuthorizer>> {
        self.authorizers.iter().find_map(|a| match a {
            Authorizer::Rbac(rbac) => Some(Arc::clone(rbac)),
            _ => None,
        })
    }

    /// The authorizers' mode names, in order, e.g. `Node,Policy,Webhook`.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.authorizers.iter().map(Authorizer::name).collect();
        names.join(",")
    }

    /// The chain's decision for one attribute set, with the name of the deciding authorizer
    /// (`None` when every authorizer had no opinion). As the apiserver's union authorizer: an
    /// error does not stop the chain, a later Allow or Deny still decides; the error is returned
    /// only when nothing decided.
    pub async fn authorize(
        &self,
        attrs: &Attributes<'_>,
    ) -> Result<(Decision, Option<&'static str>), AuthorizationError> {
        self.authorize_observed(attrs, |_, _| {}).await
    }

    /// [`authorize`](Self::authorize), showing `observe` each authorizer's answer as it comes, in
    /// order, after the match conditions a Webhook authorizer evaluated first; authorizers after
    /// the deciding one are not asked and not shown. `explain` uses it to show every answer with
    /// exactly the chain's semantics; the server passes a no-op.
    pub async fn authorize_observed(
        &self,
        attrs: &Attributes<'_>,
        observe: impl FnMut(&Authorizer, ChainEvent<'_>),
    ) -> Result<(Decision, Option<&'static str>), AuthorizationError> {
        self.authorize_part(0..self.authorizers.len(), attrs, observe)
            .await
    }

    /// How many authorizers lead the chain before the first `Webhook`: those decide on the node
    /// (from files, the node name or watched objects), without a call per request. The kubelet's
    /// loop asks them about every attribute set before any review is made
    /// ([`crate::request::decision::authorize_request`]).
    pub fn local_prefix(&self) -> usize {
        self.authorizers
            .iter()
            .take_while(|a| !matches!(a, Authorizer::Webhook(_)))
            .count()
    }

    /// [`authorize_observed`](Self::authorize_observed) with only the authorizers in `part`, in
    /// order: the whole chain, or its local prefix and then the rest.
    pub async fn authorize_part(
        &self,
        part: std::ops::Range<usize>,
        attrs: &Attributes<'_>,
        mut observe: impl FnMut(&Authorizer, ChainEvent<'_>),
    ) -> Result<(Decision, Option<&'static str>), AuthorizationError> {
        let mut last = Decision::NoOpinion(Reason::Static("no authorizer configured"));
        let mut error = None;
        for authorizer in self.authorizers.get(part).unwrap_or_default() {
            let answer = authorizer
                .authorize_observed(attrs, |condition| {
                    observe(authorizer, ChainEvent::Condition(condition));
                })
                .await;
            observe(authorizer, ChainEvent::Answer(&answer));
            match answer {
                Ok(decision @ (Decision::Allow(_) | Decision::Deny(_))) => {
                    return Ok((decision, Some(authorizer.name())));
                }
                Ok(no_opinion) => last = no_opinion,
                Err(e) if authorizer.stops_chain_on_error() => return Err(e),
                Err(e) => error = Some(e),
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok((last, None)),
        }
    }
}
