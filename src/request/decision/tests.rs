//! The decision's own tests: the kubelet's loop over attribute sets, the order of the path gate
//! and authentication, and what each refusal becomes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, StatusCode};
use http_body_util::BodyExt;

use super::*;
use crate::authz::attributes::{AttributeMapping, kubelet_attributes};
use crate::test_fixtures::{NODE, block_on, decider, monitoring_policy, node_authorizer, user};

fn judge(chain: &AuthorizerChain, user: &User, method: Method, path: &str) -> RequestDecision {
    let attrs = kubelet_attributes(&AttributeMapping::default(), &method, path);
    block_on(authorize_request(
        chain, &attrs, None, user, NODE, path, Unobserved,
    ))
}

#[test]
fn always_deny_has_no_opinion_so_a_later_allow_wins() {
    let chain = AuthorizerChain::new(vec![Authorizer::AlwaysDeny, Authorizer::AlwaysAllow]);
    let decision = judge(&chain, &user("bob", &[]), Method::GET, "/pods");
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
    match judge(&only_deny, &user("bob", &[]), Method::GET, "/pods") {
        RequestDecision::Forbidden { reason } => {
            assert_eq!(reason, Reason::Static("Everything is forbidden."));
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

#[test]
fn an_explicit_deny_stops_the_chain_before_a_later_allow() {
    let chain = AuthorizerChain::new(vec![node_authorizer(), Authorizer::AlwaysAllow]);
    let other_node = user("system:node:node-b", &["system:nodes"]);
    assert!(matches!(
        judge(&chain, &other_node, Method::GET, "/healthz"),
        RequestDecision::Forbidden { .. }
    ));
    let own_node = user("system:node:node-a", &["system:nodes"]);
    assert!(matches!(
        judge(&chain, &own_node, Method::GET, "/healthz"),
        RequestDecision::Allowed { .. }
    ));
}

#[test]
fn the_loop_falls_back_to_proxy_and_reports_which_subresource_allowed() {
    let chain = AuthorizerChain::new(vec![monitoring_policy()]);
    let debugger = user("debugger", &[]);
    match judge(&chain, &debugger, Method::GET, "/pods") {
        RequestDecision::Allowed {
            subresource,
            authorizer,
            reason,
        } => {
            assert_eq!((subresource, authorizer), ("proxy", "Policy"));
            assert_eq!(
                reason.to_string(),
                r#"RBAC: allowed by ClusterRoleBinding "debugger-proxy" of ClusterRole "proxy-reader" to User "debugger""#
            );
        }
        other => panic!("expected Allowed, got {other:?}"),
    }
    // The exec hardening: a WebSocket GET to /exec needs `create`, which debugger lacks.
    assert!(matches!(
        judge(&chain, &debugger, Method::GET, "/exec/ns/pod/ctr"),
        RequestDecision::Forbidden { .. }
    ));
    assert!(matches!(
        judge(&chain, &user("bob", &[]), Method::GET, "/pods"),
        RequestDecision::Forbidden { .. }
    ));
}

/// Decides `target` (path and optional query) for `user`, recording whether authentication ran.
pub(super) fn decide_as(
    decider: &Decider,
    user: &User,
    method: &Method,
    target: &str,
) -> (Verdict, bool) {
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let authenticated = AtomicBool::new(false);
    let user = Arc::new(user.clone());
    let verdict = block_on(decider.decide(
        method,
        path,
        query,
        async |_| {
            authenticated.store(true, Ordering::Relaxed);
            Authentication::User(user)
        },
        Unobserved,
    ));
    (verdict, authenticated.into_inner())
}

pub(super) fn answer(verdict: &Verdict, method: &Method) -> (StatusCode, Outcome, String) {
    let refusal = verdict.refusal().expect("a refusal");
    let (response, outcome) = refusal.answer(method);
    let status = response.status();
    let body = block_on(response.into_body().collect()).expect("an in-memory body");
    (
        status,
        outcome,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}

#[test]
fn the_path_gate_answers_before_authentication_and_keeps_the_query() {
    let decider = decider(vec![Authorizer::AlwaysAllow]);
    let alice = user("alice", &[]);
    let (verdict, authenticated) = decide_as(&decider, &alice, &Method::GET, "/stats/../pods?x=1");
    assert!(
        !authenticated,
        "an unclean path must not cost a TokenReview"
    );
    assert!(
        matches!(&verdict, Verdict::Redirect { location } if location == "/pods?x=1"),
        "{verdict:?}"
    );
    let (status, outcome, body) = answer(&verdict, &Method::GET);
    assert_eq!(
        (status, outcome),
        (StatusCode::MOVED_PERMANENTLY, Outcome::Redirected)
    );
    assert!(body.contains("/pods?x=1"), "{body}");
    assert_eq!(verdict.audit(), None);
    assert_eq!(verdict.subresource(), "");
    assert_eq!(verdict.verb(&Method::GET), "get");

    let (verdict, authenticated) = decide_as(&decider, &alice, &Method::GET, "/pods%2f..%2fexec");
    assert!(!authenticated);
    let (status, outcome, _) = answer(&verdict, &Method::GET);
    assert_eq!(
        (status, outcome),
        (StatusCode::BAD_REQUEST, Outcome::BadRequest)
    );
}

#[test]
fn an_unauthenticated_request_is_a_401_without_an_audit_decision() {
    let decider = decider(vec![Authorizer::AlwaysAllow]);
    let verdict = block_on(decider.decide(
        &Method::GET,
        "/pods",
        None,
        async |_| Authentication::Failed("token rejected".into()),
        Unobserved,
    ));
    assert!(
        matches!(&verdict, Verdict::Unauthenticated { failure: Some(f) } if f == "token rejected")
    );
    let (status, outcome, body) = answer(&verdict, &Method::GET);
    assert_eq!(
        (status, outcome, body.as_str()),
        (
            StatusCode::UNAUTHORIZED,
            Outcome::Unauthenticated,
            "Unauthorized"
        )
    );
    assert_eq!(verdict.audit(), None);
    assert!(verdict.user().is_none());
}

#[test]
fn judgements_become_the_kubelets_answers_and_audit_annotations() {
    let alice = user("alice", &[]);
    let get_pods_by =
        |authorizer| decide_as(&decider(vec![authorizer]), &alice, &Method::GET, "/pods").0;
    let allowed = get_pods_by(Authorizer::AlwaysAllow);
    assert!(allowed.refusal().is_none());
    assert_eq!(
        allowed.audit(),
        Some(AuditAuthorization::Allow(Reason::Static("AlwaysAllow")))
    );
    assert_eq!(allowed.subresource(), "pods");

    let forbidden = get_pods_by(Authorizer::AlwaysDeny);
    let (status, outcome, body) = answer(&forbidden, &Method::GET);
    assert_eq!(
        (status, outcome),
        (StatusCode::FORBIDDEN, Outcome::Forbidden)
    );
    assert_eq!(
        body,
        "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    assert_eq!(
        forbidden.audit(),
        Some(AuditAuthorization::Forbid(Reason::Static(
            "Everything is forbidden."
        )))
    );
    assert_eq!(forbidden.subresource(), "pods");
    assert_eq!(forbidden.user().map(|u| u.name.as_str()), Some("alice"));
}

#[test]
fn refusals_met_while_forwarding_have_their_codes_and_labels() {
    for (refusal, status, outcome) in [
        (
            Refusal::AuditUnavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::AuditUnavailable,
        ),
        (
            Refusal::CallerBody("cut short"),
            StatusCode::BAD_REQUEST,
            Outcome::BadRequest,
        ),
        (
            Refusal::Upstream("refused"),
            StatusCode::BAD_GATEWAY,
            Outcome::UpstreamError,
        ),
    ] {
        let (response, label) = refusal.answer(&Method::GET);
        assert_eq!((response.status(), label), (status, outcome), "{refusal:?}");
    }
}
