//! May they do it: authorizer attributes, decisions, and the authorizer chain.
//!
//! The chain has the union semantics of `k8s.io/apiserver` (v0.33
//! `pkg/authorization/union/union.go` `Authorize`): authorizers are asked
//! in order, the first `Allow` or `Deny` wins, `NoOpinion` moves on. The kubelet's own loop over
//! the attribute list (kubernetes v1.33 `pkg/kubelet/server/server.go` `InstallAuthFilter`: only
//! `Allow` stops, an error is a 500 at once) lives in [`authorize_request`].

pub mod attributes;
pub mod node;
pub mod policy;
pub mod rbac;
pub mod webhook;

use std::fmt;
use std::sync::Arc;

use crate::authn::User;
use crate::reload::Reloadable;
use attributes::KubeletAttributes;
use node::NodeAuthorizer;
use policy::PolicyAuthorizer;
use webhook::SubjectAccessReviewAuthorizer;

/// The resource every kubelet attribute names.
pub const RESOURCE: &str = "nodes";
/// The API version every kubelet attribute carries.
pub const API_VERSION: &str = "v1";

/// The authorizer attributes of one kubelet request for one subresource, borrowed from the request.
///
/// The remaining Kubernetes fields are constant for the kubelet: namespace `""`, apiGroup `""`,
/// apiVersion [`API_VERSION`], resource [`RESOURCE`], resourceRequest `true`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The authenticated caller.
    pub user: &'a User,
    /// `get`, `create`, …; empty for methods the kubelet does not map (HEAD, OPTIONS, …).
    pub verb: &'a str,
    /// `proxy`, `stats`, `pods`, …
    pub subresource: &'a str,
    /// The Node name of the kubelet behind the proxy (`--node-name`).
    pub name: &'a str,
    /// The percent-decoded request path.
    pub path: &'a str,
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

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Static(s) => f.write_str(s),
            Reason::Shared(s) => f.write_str(s),
        }
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
            Authorizer::Webhook(_) => "Webhook",
        }
    }

    /// Whether an error of this authorizer ends the chain (a webhook with `failurePolicy: Deny`).
    fn stops_chain_on_error(&self) -> bool {
        matches!(self, Authorizer::Webhook(webhook) if webhook.stops_chain_on_error())
    }

    /// This authorizer's decision on one attribute set.
    pub async fn authorize(&self, attrs: &Attributes<'_>) -> Result<Decision, AuthorizationError> {
        Ok(match self {
            Authorizer::AlwaysAllow => Decision::Allow(Reason::Static("AlwaysAllow")),
            Authorizer::AlwaysDeny => {
                Decision::NoOpinion(Reason::Static("Everything is forbidden."))
            }
            Authorizer::Node(node) => node.authorize(attrs),
            Authorizer::Policy(policy) => policy.current().authorize(attrs),
            Authorizer::Webhook(webhook) => return webhook.authorize(attrs).await,
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
    /// order; authorizers after the deciding one are not asked and not shown. `explain` uses it
    /// to show every answer with exactly the chain's semantics; the server passes a no-op.
    pub async fn authorize_observed(
        &self,
        attrs: &Attributes<'_>,
        mut observe: impl FnMut(&Authorizer, &Result<Decision, AuthorizationError>),
    ) -> Result<(Decision, Option<&'static str>), AuthorizationError> {
        let mut last = Decision::NoOpinion(Reason::Static("no authorizer configured"));
        let mut error = None;
        for authorizer in &self.authorizers {
            let answer = authorizer.authorize(attrs).await;
            observe(authorizer, &answer);
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

/// The outcome of the kubelet's loop over a request's attribute list.
#[derive(Debug, Clone)]
pub enum RequestDecision {
    /// Allowed on `subresource` by `authorizer` for `reason`.
    Allowed {
        /// The subresource whose attributes were allowed.
        subresource: &'static str,
        /// The authorizer that allowed.
        authorizer: &'static str,
        /// Its reason.
        reason: Reason,
    },
    /// No attribute set was allowed: 403. `reason` is the last decision's reason.
    Forbidden {
        /// The last authorizer reason seen, for logs.
        reason: Reason,
    },
    /// Authorizing `subresource` failed: 500, and the remaining attribute sets were not tried.
    Error {
        /// The subresource whose authorization failed.
        subresource: &'static str,
        /// What failed.
        error: AuthorizationError,
    },
}

/// The kubelet's authorization loop (kubernetes v1.33 `pkg/kubelet/server/server.go`
/// `InstallAuthFilter`): each attribute set in order; only `Allow`
/// stops it, `Deny` and `NoOpinion` both move on to the next set, and an error ends it at once.
pub async fn authorize_request(
    chain: &AuthorizerChain,
    request: &KubeletAttributes,
    user: &User,
    node_name: &str,
    path: &str,
) -> RequestDecision {
    let mut reason = Reason::Static("no attributes");
    for subresource in request.subresources.iter() {
        let attrs = Attributes {
            user,
            verb: request.verb,
            subresource,
            name: node_name,
            path,
        };
        match chain.authorize(&attrs).await {
            Ok((Decision::Allow(why), authorizer)) => {
                return RequestDecision::Allowed {
                    subresource,
                    authorizer: authorizer.unwrap_or_default(),
                    reason: why,
                };
            }
            Ok((Decision::Deny(why) | Decision::NoOpinion(why), _)) => reason = why,
            Err(error) => return RequestDecision::Error { subresource, error },
        }
    }
    RequestDecision::Forbidden { reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::attributes::{AttributeMapping, kubelet_attributes};
    use http::Method;

    const PROXY_ONLY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: proxy-reader}
rules: [{apiGroups: [""], resources: [nodes/proxy], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: proxy-reader}
subjects: [{kind: User, name: alice}]
"#;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..User::default()
        }
    }

    fn decide(chain: &AuthorizerChain, user: &User, method: Method, path: &str) -> RequestDecision {
        let attrs = kubelet_attributes(&AttributeMapping::default(), &method, path);
        block_on(authorize_request(chain, &attrs, user, "node-a", path))
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
            .block_on(future)
    }

    #[test]
    fn always_deny_has_no_opinion_so_a_later_allow_wins() {
        let chain = AuthorizerChain::new(vec![Authorizer::AlwaysDeny, Authorizer::AlwaysAllow]);
        let decision = decide(&chain, &user("bob", &[]), Method::GET, "/pods");
        assert!(
            matches!(
                decision,
                RequestDecision::Allowed {
                    subresource: "pods",
                    authorizer: "AlwaysAllow",
                    ..
                }
            ),
            "{decision:?}"
        );
        let only_deny = AuthorizerChain::new(vec![Authorizer::AlwaysDeny]);
        match decide(&only_deny, &user("bob", &[]), Method::GET, "/pods") {
            RequestDecision::Forbidden { reason } => {
                assert_eq!(reason, Reason::Static("Everything is forbidden."));
            }
            other => panic!("expected Forbidden, got {other:?}"),
        }
    }

    #[test]
    fn an_explicit_deny_stops_the_chain_before_a_later_allow() {
        let chain = AuthorizerChain::new(vec![
            Authorizer::Node(NodeAuthorizer),
            Authorizer::AlwaysAllow,
        ]);
        let other_node = user("system:node:node-b", &["system:nodes"]);
        assert!(matches!(
            decide(&chain, &other_node, Method::GET, "/healthz"),
            RequestDecision::Forbidden { .. }
        ));
        let own_node = user("system:node:node-a", &["system:nodes"]);
        assert!(matches!(
            decide(&chain, &own_node, Method::GET, "/healthz"),
            RequestDecision::Allowed { .. }
        ));
    }

    #[test]
    fn the_loop_falls_back_to_proxy_and_reports_which_subresource_allowed() {
        let policy = Reloadable::load("policy", Vec::new(), |_| {
            PolicyAuthorizer::from_sources(&[("p.yaml".into(), PROXY_ONLY.into())])
                .map_err(|e| e.to_string())
        })
        .expect("policy loads");
        let chain = AuthorizerChain::new(vec![Authorizer::Policy(Arc::new(policy))]);
        let alice = user("alice", &[]);
        match decide(&chain, &alice, Method::GET, "/pods") {
            RequestDecision::Allowed {
                subresource,
                authorizer,
                reason,
            } => {
                assert_eq!((subresource, authorizer), ("proxy", "Policy"));
                assert_eq!(
                    reason.to_string(),
                    r#"RBAC: allowed by ClusterRoleBinding "alice-proxy" of ClusterRole "proxy-reader" to User "alice""#
                );
            }
            other => panic!("expected Allowed, got {other:?}"),
        }
        // The exec hardening: a WebSocket GET to /exec needs `create`, which alice lacks.
        assert!(matches!(
            decide(&chain, &alice, Method::GET, "/exec/ns/pod/ctr"),
            RequestDecision::Forbidden { .. }
        ));
        assert!(matches!(
            decide(&chain, &user("bob", &[]), Method::GET, "/pods"),
            RequestDecision::Forbidden { .. }
        ));
    }
}
