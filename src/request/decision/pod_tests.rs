//! `--pod-scoped-authz`: the pod-level set comes after the kubelet's own, can only open the pod
//! named in the path, and never changes what the node-level sets decide. Who may do what is
//! [`crate::test_fixtures::POD_POLICY`]'s.

use std::sync::Arc;

use http::{Method, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::tests::{answer, decide_as};
use super::*;
use crate::test_fixtures::{NODE, pod_decider, user};

/// The label of the set that allowed, or `None` when the request is refused.
fn allowed_by(decider: &Decider, who: &User, method: &Method, path: &str) -> Option<&'static str> {
    match decide_as(decider, who, method, path).0 {
        Verdict::Authorized(Judgement {
            decision: RequestDecision::Allowed { subresource, .. },
            ..
        }) => Some(subresource),
        _ => None,
    }
}

#[test]
fn a_role_opens_its_pod_and_nothing_else() {
    let on = pod_decider(true);
    let alice = user("alice", &[]);
    for (method, path, want) in [
        (
            Method::POST,
            "/exec/team-a/web-0/nginx?command=sh",
            Some("pods/exec"),
        ),
        (Method::GET, "/exec/team-a/web-0/nginx", Some("pods/exec")),
        (
            Method::POST,
            "/attach/team-a/web-0/nginx",
            Some("pods/attach"),
        ),
        (
            Method::POST,
            "/portForward/team-a/web-0",
            Some("pods/portforward"),
        ),
        (Method::POST, "/run/team-a/web-0/nginx", Some("pods/exec")),
        (
            Method::GET,
            "/containerLogs/team-a/web-0/nginx",
            Some("pods/log"),
        ),
        // Another pod of the same namespace: resourceNames hold.
        (Method::POST, "/exec/team-a/web-1/nginx", None),
        // Every pod of team-b, through a RoleBinding to a ClusterRole.
        (Method::POST, "/exec/team-b/api-7/app", Some("pods/exec")),
        // Namespaces with no binding.
        (Method::POST, "/exec/team-c/web-0/nginx", None),
        // Node-level paths are not pod paths.
        (Method::GET, "/pods", None),
        (Method::GET, "/logs/", None),
        (Method::GET, "/checkpoint/team-a/web-0/nginx", None),
        // A log read is `get`, not `create`.
        (Method::POST, "/containerLogs/team-a/web-0/nginx", None),
    ] {
        assert_eq!(
            allowed_by(&on, &alice, &method, path),
            want,
            "{method} {path}"
        );
    }
    // Off (the default), the kubelet's sets alone decide: alice holds no nodes/… permission.
    let off = pod_decider(false);
    assert_eq!(
        allowed_by(&off, &alice, &Method::POST, "/exec/team-a/web-0/nginx"),
        None
    );
}

#[test]
fn node_level_permission_is_unchanged_and_answered_first() {
    let ops = user("ops", &[]);
    for pod_scoped in [false, true] {
        let decider = pod_decider(pod_scoped);
        assert_eq!(
            allowed_by(&decider, &ops, &Method::POST, "/exec/team-c/any/c"),
            Some("proxy"),
            "pod_scoped={pod_scoped}"
        );
        assert_eq!(
            allowed_by(&decider, &ops, &Method::GET, "/pods"),
            Some("proxy")
        );
    }
    // Allowed at node level, the pod-level set was not asked and nothing was copied for it.
    let (verdict, _) = decide_as(
        &pod_decider(true),
        &ops,
        &Method::POST,
        "/exec/team-c/any/c",
    );
    let Verdict::Authorized(judgement) = &verdict else {
        panic!("expected a judgement, got {verdict:?}");
    };
    assert_eq!(judgement.pod, None);
    assert_eq!(
        verdict.object_ref(&Arc::from(NODE)).map(|o| o.resource),
        Some("nodes")
    );
    // Another node's identity is held to its node on the pod-level set too.
    let other_node = user("system:node:node-b", &["system:nodes"]);
    assert_eq!(
        allowed_by(
            &pod_decider(true),
            &other_node,
            &Method::POST,
            "/exec/team-b/x/c"
        ),
        None
    );
}

#[test]
fn the_pod_is_the_audited_object_and_a_refusal_keeps_the_kubelets_body() {
    let on = pod_decider(true);
    let alice = user("alice", &[]);
    let node: Arc<str> = Arc::from(NODE);
    let (allowed, _) = decide_as(&on, &alice, &Method::POST, "/exec/team-a/web-0/nginx");
    assert_eq!(allowed.subresource(), "pods/exec");
    assert_eq!(
        allowed.object_ref(&node),
        Some(ObjectRef {
            resource: "pods",
            namespace: Some(Arc::from("team-a")),
            subresource: "exec",
            name: Arc::from("web-0"),
        })
    );
    let Some(AuditAuthorization::Allow(reason)) = allowed.audit() else {
        panic!("expected an allow annotation");
    };
    assert_eq!(
        reason.to_string(),
        r#"RBAC: allowed by RoleBinding "alice-web-0/team-a" of Role "web-0-debugger" to User "alice""#
    );

    let (refused, _) = decide_as(&on, &alice, &Method::POST, "/exec/team-a/web-1/nginx");
    let (status, _, body) = answer(&refused, &Method::POST);
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "Forbidden (user=alice, verb=create, resource=nodes, subresource(s)=[proxy])\n"
    );
    // Refused: the first node-level set is what metrics and audit name, as without the flag.
    assert_eq!(refused.subresource(), "proxy");
    assert_eq!(
        refused.object_ref(&node).map(|o| (o.resource, o.name)),
        Some(("nodes", node.clone()))
    );
}

/// Path segments mixing the names the policy grants with near misses and encodings.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("team-a".to_owned()),
        Just("team-b".to_owned()),
        Just("web-0".to_owned()),
        Just("web-1".to_owned()),
        Just("exec".to_owned()),
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just(String::new()),
        Just("team-a%2Fweb-0".to_owned()),
        Just("web-0%00".to_owned()),
        Just("web%2D0".to_owned()),
        Just("Team-A".to_owned()),
        Just("web-0.".to_owned()),
        "[a-z0-9.%-]{1,6}",
    ]
}

/// Request targets: any path of [`segment`]s under a kubelet prefix, and one in five shaped like
/// a pod-level grant's (`/<prefix>/<team>/<pod>/<container>`), so that every run tries allowed
/// requests (with the shapes alone, 4,096 cases left none allowed in about one run in forty).
fn target() -> impl Strategy<Value = (Method, String)> {
    let shaped = (
        method(),
        prefix(),
        prop_oneof![Just("team-a"), Just("team-b")],
        segment(),
        segment(),
        any::<bool>(),
    )
        .prop_map(|(method, prefix, team, pod, container, slash)| {
            let mut path = format!("{prefix}/{team}/{pod}/{container}");
            if slash {
                path.push('/');
            }
            (method, path)
        });
    prop_oneof![4 => any_target(), 1 => shaped]
}

fn prefix() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("/exec"),
        Just("/attach"),
        Just("/portForward"),
        Just("/run"),
        Just("/containerLogs"),
        Just("/checkpoint"),
        Just("/execx"),
        Just(""),
    ]
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::PUT)]
}

fn any_target() -> impl Strategy<Value = (Method, String)> {
    (
        method(),
        prefix(),
        prop::collection::vec(segment(), 0..6),
        any::<bool>(),
    )
        .prop_map(|(method, prefix, segments, slash)| {
            let mut path = format!("{prefix}/{}", segments.join("/"));
            if slash {
                path.push('/');
            }
            (method, path)
        })
}

/// A request is never allowed by a pod-level set for a pod other than the one its path names,
/// and the path that was authorized is the one forwarded: the raw path's own segments name it.
#[test]
fn a_pod_level_grant_never_opens_another_pod() {
    let on = pod_decider(true);
    let alice = user("alice", &[]);
    let mut runner = TestRunner::new(Config {
        cases: 4096,
        failure_persistence: None,
        ..Config::default()
    });
    let allowed = std::cell::Cell::new(0);
    runner
        .run(&target(), |(method, path)| {
            let Some(label) = allowed_by(&on, &alice, &method, &path) else {
                return Ok(());
            };
            allowed.set(allowed.get() + 1);
            prop_assert!(label.starts_with("pods/"), "{method} {path}: {label}");
            let segments: Vec<&str> = path.split('/').collect();
            prop_assert!(segments.len() >= 4, "{method} {path}");
            match (segments[2], segments[3]) {
                ("team-a", "web-0") | ("team-b", _) => {}
                other => prop_assert!(false, "{method} {path} opened {other:?}"),
            }
            Ok(())
        })
        .unwrap();
    // The property was put to the test: some generated requests were allowed.
    assert!(allowed.get() > 0, "no generated request was allowed");
}
