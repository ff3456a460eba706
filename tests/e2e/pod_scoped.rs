//! `--pod-scoped-authz` through the real proxy: after the kubelet's own `nodes/…` sets, a
//! container path is also asked about as the API server asks about the same operation
//! (`create pods/exec`, `get pods/log`, … on that pod, in its namespace), by a Webhook with the
//! exact SubjectAccessReview and by local Roles and RoleBindings; an exec session opens only for
//! the pod granted, and the audit event names the pod.

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::TempDir;
use crate::support::apiserver::{ApiServer, Verdict};
use crate::support::client::{Body, empty, request};
use crate::support::harness::{NODE_NAME, ProxySpec};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession, FOLLOW_TARGET};

/// `dev` may exec into pod `ns/pod` (the target of [`ExecSession::open`]) and read its logs,
/// through a Role and a RoleBinding; nothing on the node.
const POD_POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-debugger, namespace: ns}
rules:
- {apiGroups: [""], resources: [pods/exec], verbs: [create], resourceNames: [pod]}
- {apiGroups: [""], resources: [pods/log], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dev-debugs-pod, namespace: ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-debugger}
subjects: [{kind: User, name: dev}]
"#;

fn post(target: &str) -> http::Request<Body> {
    request("POST", target).body(empty()).unwrap()
}

fn forbidden(verb: &str) -> String {
    format!("Forbidden (user=dev, verb={verb}, resource=nodes, subresource(s)=[proxy])\n")
}

#[tokio::test]
async fn a_webhook_is_asked_about_the_pod_after_the_node() {
    let api = ApiServer::start().await;
    api.set_rules(|r| {
        Verdict::allow_when(r.resource == "pods" && r.namespace == "ns" && r.name == "pod")
    });
    let h = ProxySpec::new(&["--authorization-mode=Webhook", "--pod-scoped-authz"])
        .apiserver(&api)
        .start()
        .await;
    let dev = h.user("dev", &["team-a"]);

    let reply = dev.get("/containerLogs/ns/pod/ctr?tailLines=1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let user = json!({"user": "dev", "groups": ["team-a", "system:authenticated"]});
    let review = |attributes: Value| {
        let mut spec = user.clone();
        spec["resourceAttributes"] = attributes;
        spec
    };
    let reviews: Vec<Value> = api
        .access_reviews()
        .into_iter()
        .map(|mut spec| {
            // The x509 credential id is checked in delegated.rs; here, the attributes.
            spec.as_object_mut().unwrap().remove("extra");
            spec
        })
        .collect();
    assert_eq!(
        reviews,
        [
            review(json!({
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": "proxy", "name": NODE_NAME,
            })),
            review(json!({
                "namespace": "ns", "verb": "get", "version": "v1", "resource": "pods",
                "subresource": "log", "name": "pod",
            })),
        ]
    );

    // Another pod: both sets refused, the kubelet's own 403 body.
    let reply = dev.send(post("/exec/ns/other/ctr?command=id")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.text(), forbidden("create"));
    assert_eq!(
        api.access_reviews()[3]["resourceAttributes"],
        json!({
            "namespace": "ns", "verb": "create", "version": "v1", "resource": "pods",
            "subresource": "exec", "name": "other",
        })
    );
    // Node-level paths are never asked about a pod.
    let before = api.access_reviews().len();
    let reply = dev.get("/pods").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let asked: Vec<String> = api.access_reviews()[before..]
        .iter()
        .map(|r| {
            r["resourceAttributes"]["resource"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // nodes/pods is asked; nodes/proxy (get) is answered from the cache of the log request.
    assert_eq!(asked, ["nodes"]);
}

#[tokio::test]
async fn a_role_binding_opens_an_exec_session_into_its_pod_only() {
    let audit = TempDir::new("pod-audit");
    let log = audit.path().join("audit.log");
    let audit_flag = format!("--audit-log-path={}", log.display());
    let h = ProxySpec::new(&[
        "--authorization-mode=Node,Policy",
        "--pod-scoped-authz",
        &audit_flag,
    ])
    .policy(POD_POLICY)
    .start()
    .await;

    let mut session = ExecSession::open(&h.http1_user("dev"), EXEC_PROTOCOL).await;
    session.echo(b"id\n").await;
    session.close().await;

    let dev = h.user("dev", &[]);
    let reply = dev
        .get(FOLLOW_TARGET.replace("follow=true", "tailLines=1").as_str())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    for (method, path, verb) in [
        ("POST", "/exec/ns/other/ctr?command=id", "create"),
        ("POST", "/exec/other-ns/pod/ctr?command=id", "create"),
        ("POST", "/attach/ns/pod/ctr", "create"),
        ("GET", "/pods", "get"),
        ("GET", "/checkpoint/ns/pod/ctr", "get"),
    ] {
        let reply = match method {
            "POST" => dev.send(post(path)).await,
            _ => dev.get(path).await,
        };
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path}");
        if path != "/pods" && !path.starts_with("/checkpoint") {
            assert_eq!(reply.text(), forbidden(verb), "{method} {path}");
        }
    }
    h.shutdown().await;

    let text = std::fs::read_to_string(&log).unwrap();
    let exec = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|e| {
            e["requestURI"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/exec/ns/pod/")
        })
        .expect("the exec session's audit event");
    assert_eq!(
        exec["objectRef"],
        json!({"resource": "pods", "namespace": "ns", "name": "pod", "apiVersion": "v1",
               "subresource": "exec"})
    );
    assert_eq!(
        exec["annotations"]["authorization.k8s.io/reason"],
        r#"RBAC: allowed by RoleBinding "dev-debugs-pod/ns" of Role "pod-debugger" to User "dev""#
    );
}

#[tokio::test]
async fn without_the_flag_role_bindings_grant_nothing() {
    let h = ProxySpec::new(&["--authorization-mode=Node,Policy"])
        .policy(POD_POLICY)
        .start()
        .await;
    let dev = h.user("dev", &[]);
    let reply = dev.get("/containerLogs/ns/pod/ctr").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.text(), forbidden("get"));
}
