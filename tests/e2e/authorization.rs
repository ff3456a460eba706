//! Authorization as the kubelet's filter does it (kubernetes v1.33
//! `pkg/kubelet/server/server.go` `InstallAuthFilter`, `auth.go` `GetRequestAttributes`; RBAC and
//! node identities as `docs/COMPATIBILITY.md` cites them): the verb and
//! subresource list of every request, the authorizer modes and their chain, local RBAC policies,
//! node identities held to their node, and the exact refusal bodies.

use http::StatusCode;

use crate::support::answers::{assert_forbidden, forbidden_body};
use crate::support::client::{Client, Reply, empty, request};
use crate::support::harness::{Harness, ProxySpec, Subject, grant};
use crate::support::streams::{EXEC_PROTOCOL, websocket_request};
use crate::test_data::{AttributeCase, KUBELET_VECTORS, RBAC_DUMP, cases, text};

async fn websocket_exec(client: &Client) -> Reply {
    let req = websocket_request("/exec/ns/pod/ctr?command=sh&stdin=true", EXEC_PROTOCOL);
    let response = client.open(req).await;
    // A 101 has no body to read; anything else is read whole.
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Reply {
            status: response.status(),
            version: response.version(),
            headers: response.headers().clone(),
            body: Default::default(),
        };
    }
    Reply::read(response).await.unwrap()
}

fn proxy_getter_policy() -> String {
    grant(
        "proxy-getter",
        &["nodes/proxy"],
        &["get"],
        &[Subject::User("alice")],
    )
}

/// The proxy deciding with `modes`, its policy letting `subjects` get `resource`.
async fn getters_proxy(modes: &str, resource: &str, subjects: &[Subject<'_>]) -> Harness {
    let policy = grant("getters", &[resource], &["get"], subjects);
    ProxySpec::new(&[&format!("--authorization-mode={modes}")])
        .policy(&policy)
        .start()
        .await
}

#[tokio::test]
async fn websocket_exec_needs_create_by_default() {
    let h = getters_proxy("Policy", "nodes/proxy", &[Subject::User("alice")]).await;
    let reply = websocket_exec(&h.http1_user("alice")).await;
    assert_forbidden(&reply, "alice", "create", "proxy");
}

#[tokio::test]
async fn websocket_exec_with_get_when_exec_requires_create_is_off() {
    let h = ProxySpec::new(&[
        "--authorization-mode=Policy",
        "--exec-requires-create=false",
    ])
    .policy(&proxy_getter_policy())
    .start()
    .await;
    let reply = websocket_exec(&h.http1_user("alice")).await;
    assert_eq!(
        reply.status,
        StatusCode::SWITCHING_PROTOCOLS,
        "{}",
        reply.text()
    );
}

#[tokio::test]
async fn fine_grained_pods_then_proxy_fallback() {
    let policy = [
        grant(
            "pods-reader",
            &["nodes/pods"],
            &["get"],
            &[Subject::User("bob")],
        ),
        proxy_getter_policy(),
    ]
    .join("---\n");
    let h = ProxySpec::new(&["--authorization-mode=Policy"])
        .policy(&policy)
        .start()
        .await;
    let bob = h.user("bob", &[]).get("/pods").await;
    assert_eq!(bob.status, StatusCode::OK, "{}", bob.text());
    assert_eq!(bob.header("content-type"), Some("application/json"));
    // alice has only nodes/proxy: allowed through the fallback.
    let alice = h.user("alice", &[]).get("/pods").await;
    assert_eq!(alice.status, StatusCode::OK, "{}", alice.text());
    // carol has nothing: both subresources were tried, in order.
    let carol = h.user("carol", &[]).get("/pods").await;
    assert_forbidden(&carol, "carol", "get", "pods proxy");
    // bob's nodes/pods does not open anything else.
    let stats = h.user("bob", &[]).get("/stats/summary").await;
    assert_forbidden(&stats, "bob", "get", "stats");
}

#[tokio::test]
async fn always_allow_and_always_deny() {
    let allow = ProxySpec::always_allow(&[]).start().await;
    assert_eq!(
        allow.user("alice", &[]).get("/pods").await.status,
        StatusCode::OK
    );

    let deny = ProxySpec::new(&["--authorization-mode=AlwaysDeny"])
        .start()
        .await;
    let reply = deny.user("alice", &[]).get("/pods").await;
    assert_forbidden(&reply, "alice", "get", "pods proxy");
}

#[tokio::test]
async fn always_deny_has_no_opinion_so_a_later_allow_wins() {
    let h = ProxySpec::new(&["--authorization-mode=AlwaysDeny,AlwaysAllow"])
        .start()
        .await;
    let reply = h.user("alice", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn node_identities_only_on_their_own_node() {
    let h = getters_proxy(
        "Node,Policy",
        "nodes/proxy",
        &[Subject::Group("system:nodes")],
    )
    .await;
    // The policy grants every node identity, but node-b's certificate is refused on node-a.
    let other = h
        .user("system:node:node-b", &["system:nodes"])
        .get("/echo")
        .await;
    assert_forbidden(&other, "system:node:node-b", "get", "proxy");
    // node-a's own identity passes Node and is allowed by the policy.
    let own = h
        .user("system:node:node-a", &["system:nodes"])
        .get("/echo")
        .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.text());
    // Without system:nodes, system:node:node-b is no node identity, and the group grant does not
    // apply to it either.
    let pretender = h.user("system:node:node-b", &[]).get("/echo").await;
    assert_forbidden(&pretender, "system:node:node-b", "get", "proxy");
}

#[tokio::test]
async fn node_identity_of_this_node_still_needs_the_policy() {
    let h = getters_proxy("Node,Policy", "nodes/proxy", &[Subject::User("alice")]).await;
    let own = h
        .user("system:node:node-a", &["system:nodes"])
        .get("/echo")
        .await;
    assert_forbidden(&own, "system:node:node-a", "get", "proxy");
}

#[tokio::test]
async fn policy_subjects_user_group_service_account() {
    let h = getters_proxy(
        "Policy",
        "nodes/proxy",
        &[
            Subject::User("alice"),
            Subject::Group("ops"),
            Subject::ServiceAccount {
                namespace: "mon",
                name: "agent",
            },
        ],
    )
    .await;
    for (name, groups) in [
        ("alice", &[][..]),
        ("dave", &["ops"][..]),
        ("system:serviceaccount:mon:agent", &[][..]),
    ] {
        let reply = h.user(name, groups).get("/echo").await;
        assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text());
    }
    for (name, groups) in [
        ("Alice", &[][..]),
        ("erin", &["Ops"][..]),
        ("system:serviceaccount:other:agent", &[][..]),
        ("system:serviceaccount:mon:agent2", &[][..]),
    ] {
        let reply = h.user(name, groups).get("/echo").await;
        assert_forbidden(&reply, name, "get", "proxy");
    }
}

#[tokio::test]
async fn exact_refusal_bodies() {
    let h = getters_proxy("Policy", "nodes/healthz", &[Subject::User("alice")]).await;

    let unauthorized = h.anonymous().get("/pods").await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&unauthorized.body[..], b"Unauthorized");
    assert_eq!(unauthorized.header("www-authenticate"), None);

    let alice = h.user("alice", &[]);
    assert_forbidden(&alice.get("/pods").await, "alice", "get", "pods proxy");
    assert_eq!(alice.get("/healthz").await.status, StatusCode::OK);

    // HEAD maps to the empty verb, which only a `*` rule matches. A HEAD response carries no
    // body, but its length is announced.
    let head = h
        .http1_user("alice")
        .send(request("HEAD", "/healthz").body(empty()).unwrap())
        .await;
    assert_eq!(head.status, StatusCode::FORBIDDEN);
    let expected = forbidden_body("alice", "", "healthz proxy");
    assert_eq!(
        head.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    // The same empty verb, with a body to read.
    let options = alice
        .send(request("OPTIONS", "/healthz").body(empty()).unwrap())
        .await;
    assert_forbidden(&options, "alice", "", "healthz proxy");
}

#[tokio::test]
async fn head_refusal_over_http2_is_well_formed() {
    let h = ProxySpec::new(&["--authorization-mode=AlwaysDeny"])
        .start()
        .await;
    let alice = h.user("alice", &[]);
    let mut conn = alice.connect().await.unwrap();
    assert_eq!(conn.version(), http::Version::HTTP_2);
    let response = conn
        .send(request("HEAD", "/healthz").body(empty()).unwrap())
        .await
        .unwrap();
    let head = Reply::read(response)
        .await
        .unwrap_or_else(|e| panic!("HEAD over HTTP/2: {e:?}"));
    assert_eq!(head.status, StatusCode::FORBIDDEN);
    assert!(head.body.is_empty());
}

#[tokio::test]
async fn head_is_allowed_by_a_star_verb() {
    let policy = grant(
        "healthz-any",
        &["nodes/healthz"],
        &["*"],
        &[Subject::User("alice")],
    );
    let h = ProxySpec::new(&["--authorization-mode=Policy"])
        .policy(&policy)
        .start()
        .await;
    // Forwarded HEAD requests are fine over both protocols.
    for alice in [h.user("alice", &[]), h.http1_user("alice")] {
        let head = alice
            .send(request("HEAD", "/healthz").body(empty()).unwrap())
            .await;
        assert_eq!(head.status, StatusCode::OK);
        assert!(head.body.is_empty());
    }
}

/// Every `kubeletAttributes` vector, through the proxy: with AlwaysDeny nothing is allowed, so the
/// 403 body shows the verb and the subresources tried, in order.
#[tokio::test]
async fn kubelet_attribute_vectors_show_in_403_bodies() {
    let rows = cases::<AttributeCase>(KUBELET_VECTORS, "kubeletAttributes");
    // The kubelet exactly: fine-grained gate and path table as the row says, no exec hardening.
    let settings = [
        (true, false, vec!["--fine-grained-authz=true"]),
        (false, false, vec!["--fine-grained-authz=false"]),
        (
            true,
            true,
            vec!["--fine-grained-authz=true", "--standalone-statusz-flagz"],
        ),
        (
            false,
            true,
            vec!["--fine-grained-authz=false", "--standalone-statusz-flagz"],
        ),
    ];
    let mut checked = 0;
    for (gate, standalone, flags) in settings {
        let selected: Vec<_> = rows
            .iter()
            .filter(|row| {
                row.fine_grained_authz == gate && row.standalone_statusz_flagz == standalone
            })
            .collect();
        if selected.is_empty() {
            continue;
        }
        let h = ProxySpec::new(&[
            "--authorization-mode=AlwaysDeny",
            "--exec-requires-create=false",
        ])
        .args(&flags)
        .start()
        .await;
        let alice = h.http1_user("alice");
        for row in selected {
            let expected = forbidden_body("alice", &row.verb, &row.subresources.join(" "));
            let reply = alice
                .send(request(&row.method, &row.path).body(empty()).unwrap())
                .await;
            assert_eq!(
                reply.status,
                StatusCode::FORBIDDEN,
                "{row:?}: {}",
                reply.text()
            );
            if row.method == "HEAD" {
                assert_eq!(
                    reply.header("content-length"),
                    Some(expected.len().to_string().as_str()),
                    "{row:?}"
                );
            } else {
                assert_eq!(reply.text(), expected, "{row:?}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, rows.len(), "every vector row is covered");
}

/// A cluster's RBAC dump, as `kubectl get clusterrole,clusterrolebinding -o yaml` prints it, is
/// a local policy as it is: the aggregated roles, server-populated fields and bindings without
/// subjects load, and it answers as RBAC would.
#[tokio::test]
async fn a_cluster_rbac_dump_is_a_local_policy_as_it_is() {
    let h = ProxySpec::new(&["--authorization-mode=Policy"])
        .policy(&text(RBAC_DUMP))
        .start()
        .await;
    for (name, groups) in [
        ("alice", &["system:masters"][..]),
        ("kube-apiserver-kubelet-client", &[][..]),
    ] {
        let reply = h.user(name, groups).get("/echo").await;
        assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text());
    }
    // view and admin (aggregated) grant nothing on the kubelet.
    for (name, group) in [("dev", "dev-team"), ("ops", "platform")] {
        let reply = h.user(name, &[group]).get("/echo").await;
        assert_forbidden(&reply, name, "get", "proxy");
    }
}
