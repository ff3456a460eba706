//! The `RBAC` authorizer against the stand-in API server's list and watch: grants and
//! revocations followed live, zero reviews for what RBAC allows, aggregation, the readiness wait,
//! watches resumed without relisting, `410 Gone` relisted once, and the staleness bound.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::answers::assert_forbidden;
use crate::support::apiserver::{ApiServer, RbacKind, Verdict};
use crate::support::assert_contains;
use crate::support::client::{empty, request};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::metrics::total;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

fn cluster_role(name: &str, resources: &[&str], labels: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["get", "create"]}],
    })
}

/// A ClusterRoleBinding of `role` to `user`, named `<user>-<role>`.
fn cluster_role_binding(role: &str, user: &str) -> Value {
    let name = format!("{user}-{role}");
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": user}],
    })
}

/// The ClusterRole most scenarios bind: get and create on `nodes/stats`.
fn stats_role() -> Value {
    cluster_role("kubelet-stats", &["nodes/stats"], json!({}))
}

/// Applies [`stats_role`] and a binding of it to each of `users`.
fn grant_stats(api: &ApiServer, users: &[&str]) {
    api.apply_rbac(stats_role());
    for user in users {
        api.apply_rbac(cluster_role_binding("kubelet-stats", user));
    }
}

/// `POST /exec/<namespace>/web/app?command=true`.
fn exec(namespace: &str) -> http::Request<crate::support::client::Body> {
    request("POST", &format!("/exec/{namespace}/web/app?command=true"))
        .body(empty())
        .expect("a valid request")
}

/// The proxy deciding with `modes`, watching the stand-in, its first lists not delayed; returned
/// once `/readyz` says its first lists are in force.
async fn proxy(api: &ApiServer, modes: &str, extra: &[&str]) -> Harness {
    let h = unsynced_proxy(api, modes, extra).await;
    synced(&h).await;
    h
}

/// [`proxy`], returned at once.
async fn unsynced_proxy(api: &ApiServer, modes: &str, extra: &[&str]) -> Harness {
    let mode = format!("--authorization-mode={modes}");
    ProxySpec::new(&[&mode, "--rbac-start-jitter=0s"])
        .args(extra)
        .apiserver(api)
        .start()
        .await
}

/// Waits until `/readyz` answers 200: the RBAC authorizer's first lists are in force.
async fn synced(h: &Harness) {
    eventually("/readyz once the first lists are in force", || async {
        (h.admin_get("/readyz").await.status == StatusCode::OK).then_some(())
    })
    .await;
}

/// Waits until `user`'s `GET path` gets `status`.
async fn answers(h: &Harness, user: &str, path: &str, status: StatusCode) {
    eventually(&format!("{user} GET {path} answered {status}"), || async {
        (h.user(user, &[]).get(path).await.status == status).then_some(())
    })
    .await;
}

/// The samples of `metric` for the RBAC kind `kind` in the exposition `text`.
fn of_kind(text: &str, metric: &str, kind: &str) -> f64 {
    total(text, metric, &[("kind", kind)])
}

async fn metrics(h: &Harness) -> String {
    let reply = h.admin_get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.text()
}

#[tokio::test]
async fn grants_and_revocations_at_the_api_server_decide_on_the_node_without_reviews() {
    let api = ApiServer::start().await;
    api.set_rules(|_| Verdict::no_opinion());
    grant_stats(&api, &["alice"]);
    let h = proxy(&api, "Node,RBAC,Webhook", &[]).await;

    answers(&h, "alice", "/stats/summary", StatusCode::OK).await;
    let reply = h.user("alice", &[]).get("/stats/summary").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(api.access_reviews().is_empty(), "RBAC allowed: no review");

    // Revoked at the API server: the next requests are refused (the Webhook has no opinion).
    api.delete_rbac(RbacKind::ClusterRoleBinding, "", "alice-kubelet-stats");
    answers(&h, "alice", "/stats/summary", StatusCode::FORBIDDEN).await;
    assert_forbidden(
        &h.user("alice", &[]).get("/stats/summary").await,
        "alice",
        "get",
        "stats",
    );

    // Granted again, to another user: allowed, still by RBAC.
    api.apply_rbac(cluster_role_binding("kubelet-stats", "bob"));
    answers(&h, "bob", "/stats/summary", StatusCode::OK).await;

    let text = metrics(&h).await;
    let decisions = |mode: &str| {
        total(
            &text,
            "kubelet_auth_proxy_authorization_decisions_total",
            &[("mode", mode), ("decision", "allowed")],
        )
    };
    assert!(decisions("RBAC") >= 2.0, "{text}");
    assert_eq!(decisions("Webhook"), 0.0, "{text}");
    for kind in ["clusterroles", "clusterrolebindings"] {
        assert_eq!(
            of_kind(&text, "kubelet_auth_proxy_rbac_synced", kind),
            1.0,
            "{text}"
        );
        assert_eq!(
            total(
                &text,
                "kubelet_auth_proxy_rbac_lists_total",
                &[("kind", kind), ("reason", "start")]
            ),
            1.0,
            "{text}"
        );
    }
    assert_eq!(
        of_kind(
            &text,
            "kubelet_auth_proxy_rbac_objects",
            "clusterrolebindings"
        ),
        1.0,
        "{text}"
    );
    // Roles and RoleBindings are not watched without --pod-scoped-authz.
    assert_eq!(api.rbac_lists(RbacKind::RoleBinding), 0);
}

#[tokio::test]
async fn roles_that_cannot_grant_a_kubelet_attribute_are_not_held() {
    let api = ApiServer::start().await;
    api.apply_rbac(cluster_role("config-reader", &["configmaps"], json!({})));
    api.apply_rbac(cluster_role("kubelet-proxy", &["nodes/proxy"], json!({})));
    api.apply_rbac(cluster_role_binding("config-reader", "carol"));
    let h = proxy(&api, "Node,RBAC", &[]).await;
    answers(&h, "carol", "/pods", StatusCode::FORBIDDEN).await;
    let text = metrics(&h).await;
    assert_eq!(
        of_kind(&text, "kubelet_auth_proxy_rbac_objects", "clusterroles"),
        1.0,
        "only kubelet-proxy is held: {text}"
    );
}

#[tokio::test]
async fn an_aggregated_role_follows_the_labels_of_the_roles_it_selects() {
    let api = ApiServer::start().await;
    api.apply_rbac(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kubelet-readers"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.com/kubelet": "true"}}]},
        "rules": [],
    }));
    api.apply_rbac(cluster_role_binding("kubelet-readers", "dave"));
    let h = proxy(&api, "Node,RBAC", &[]).await;
    answers(&h, "dave", "/pods", StatusCode::FORBIDDEN).await;

    api.apply_rbac(cluster_role(
        "kubelet-pods",
        &["nodes/pods"],
        json!({"example.com/kubelet": "true"}),
    ));
    answers(&h, "dave", "/pods", StatusCode::OK).await;

    // The label taken off: the aggregated role no longer carries the rule.
    api.apply_rbac(cluster_role("kubelet-pods", &["nodes/pods"], json!({})));
    answers(&h, "dave", "/pods", StatusCode::FORBIDDEN).await;
}

#[tokio::test]
async fn role_bindings_grant_pod_subresources_with_pod_scoped_authz() {
    let api = ApiServer::start().await;
    api.apply_rbac(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "exec", "namespace": "team-a"},
        "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}],
    }));
    api.apply_rbac(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "erin-exec", "namespace": "team-a"},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "exec"},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": "erin"}],
    }));
    let h = proxy(&api, "Node,RBAC", &["--pod-scoped-authz"]).await;
    eventually("erin may exec in team-a", || async {
        let reply = h.user("erin", &[]).send(exec("team-a")).await;
        (reply.status != StatusCode::FORBIDDEN).then_some(())
    })
    .await;
    let elsewhere = h.user("erin", &[]).send(exec("team-b")).await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN);
    assert_eq!(api.rbac_lists(RbacKind::Role), 1);
    assert_eq!(api.rbac_lists(RbacKind::RoleBinding), 1);
}

#[tokio::test]
async fn until_the_first_list_the_mode_has_no_opinion_and_readyz_waits() {
    let api = ApiServer::start().await;
    api.set_rules(|r| Verdict::allow_when(r.user == "alice"));
    grant_stats(&api, &["alice", "frank"]);
    api.set_rbac_list_delay(Duration::from_secs(3));
    let h = unsynced_proxy(&api, "Node,RBAC,Webhook", &[]).await;

    let ready = h.admin_get("/readyz").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_contains(&ready.text(), "RBAC");
    // Meanwhile the Webhook decides.
    assert_eq!(
        h.user("alice", &[]).get("/stats/summary").await.status,
        StatusCode::OK
    );
    assert_eq!(api.access_reviews().len(), 1);

    synced(&h).await;
    // Once synced, RBAC decides: frank, whom only RBAC allows, gets in without a review.
    assert_eq!(
        h.user("frank", &[]).get("/stats/summary").await.status,
        StatusCode::OK
    );
    assert_eq!(api.access_reviews().len(), 1, "frank was allowed by RBAC");
}

#[tokio::test]
async fn a_dropped_watch_resumes_from_the_last_version_without_listing_again() {
    let api = ApiServer::start().await;
    api.apply_rbac(stats_role());
    let h = proxy(&api, "Node,RBAC", &[]).await;
    api.wait_for_rbac_watches(RbacKind::ClusterRoleBinding, 1)
        .await;

    let version = api.apply_rbac(cluster_role_binding("kubelet-stats", "alice"));
    answers(&h, "alice", "/stats/summary", StatusCode::OK).await;
    api.drop_rbac_watches();
    api.wait_for_rbac_watches(RbacKind::ClusterRoleBinding, 2)
        .await;
    assert_eq!(api.rbac_watches(RbacKind::ClusterRoleBinding)[1], version);

    // A bookmark moves the version the next watch resumes from.
    api.apply_rbac(cluster_role("unrelated", &["configmaps"], json!({})));
    api.rbac_bookmark();
    let bookmarked = eventually(
        "the bookmark's version is the next one asked from",
        || async {
            api.drop_rbac_watches();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let watches = api.rbac_watches(RbacKind::ClusterRoleBinding);
            watches.last().filter(|v| **v != version).cloned()
        },
    )
    .await;
    assert!(bookmarked.parse::<u64>().unwrap_or(0) > version.parse::<u64>().unwrap_or(0));

    // Changes made while it was cut arrive.
    api.delete_rbac(RbacKind::ClusterRoleBinding, "", "alice-kubelet-stats");
    answers(&h, "alice", "/stats/summary", StatusCode::FORBIDDEN).await;
    assert_eq!(
        api.rbac_lists(RbacKind::ClusterRoleBinding),
        1,
        "never relisted"
    );
    assert_eq!(api.rbac_lists(RbacKind::ClusterRole), 1, "never relisted");
}

#[tokio::test]
async fn a_version_the_api_server_no_longer_has_is_listed_again_once() {
    let api = ApiServer::start().await;
    grant_stats(&api, &["alice"]);
    let h = proxy(&api, "Node,RBAC", &[]).await;
    answers(&h, "alice", "/stats/summary", StatusCode::OK).await;
    api.wait_for_rbac_watches(RbacKind::ClusterRoleBinding, 1)
        .await;

    // While cut off, the binding goes and the history with it: 410, then one new list.
    api.set_rbac_available(false);
    api.drop_rbac_watches();
    api.delete_rbac(RbacKind::ClusterRoleBinding, "", "alice-kubelet-stats");
    api.compact_rbac_history();
    api.set_rbac_available(true);
    answers(&h, "alice", "/stats/summary", StatusCode::FORBIDDEN).await;
    eventually("the relist counted", || async {
        let text = metrics(&h).await;
        let gone = total(
            &text,
            "kubelet_auth_proxy_rbac_lists_total",
            &[("kind", "clusterrolebindings"), ("reason", "gone")],
        );
        (gone == 1.0).then_some(())
    })
    .await;
    api.wait_for_rbac_watches(RbacKind::ClusterRoleBinding, 3)
        .await;
    assert_eq!(
        api.rbac_lists(RbacKind::ClusterRoleBinding),
        2,
        "listed again once"
    );
}

#[tokio::test]
async fn a_watch_broken_longer_than_the_staleness_bound_has_no_opinion_until_it_resumes() {
    let api = ApiServer::start().await;
    grant_stats(&api, &["alice"]);
    let h = proxy(&api, "Node,RBAC", &["--rbac-max-staleness=1s"]).await;
    answers(&h, "alice", "/stats/summary", StatusCode::OK).await;

    api.set_rbac_available(false);
    api.drop_rbac_watches();
    // Within the bound the last state decides; past it, no opinion: refused.
    answers(&h, "alice", "/stats/summary", StatusCode::FORBIDDEN).await;
    let text = metrics(&h).await;
    assert_eq!(
        of_kind(
            &text,
            "kubelet_auth_proxy_rbac_synced",
            "clusterrolebindings"
        ),
        0.0,
        "{text}"
    );
    assert!(
        of_kind(
            &text,
            "kubelet_auth_proxy_rbac_watch_failures_total",
            "clusterrolebindings"
        ) >= 1.0,
        "{text}"
    );

    // Back: the watches resume and the state decides again.
    api.set_rbac_available(true);
    answers(&h, "alice", "/stats/summary", StatusCode::OK).await;
    assert_eq!(
        api.rbac_lists(RbacKind::ClusterRoleBinding),
        1,
        "resumed, not relisted"
    );
}
