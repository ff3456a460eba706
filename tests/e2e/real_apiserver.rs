//! The `RBAC` authorization mode against a real kube-apiserver (v1.36): the proxy lists and
//! watches the cluster's ClusterRoles and ClusterRoleBindings through `--kubeconfig` and decides
//! locally. A binding created with kube's API grants within a short bound and its deletion
//! revokes; aggregation follows labels as the API server's controller would; with
//! `Node,RBAC,Webhook` a user RBAC allows costs no SubjectAccessReview while a user only the
//! API server's other authorizers allow (`system:masters`) still gets in through the webhook;
//! `/readyz` and the metrics say when the state is synced.
//!
//! Skipped (saying so) unless `.ci/run` started an API server and set `KAP_REAL_APISERVER_*`
//! (see `support::real_apiserver`); failing, not skipped, when `KAP_REAL_APISERVER_REQUIRED=1`.
//! Every object a scenario creates carries its own owner label and unique names, and is deleted
//! by that label when the scenario ends, passed or failed. The proxy's answer is the evidence:
//! 403 is refused, anything else (the stand-in kubelet's 200) allowed. Every change is polled for
//! up to [`CHANGE_BOUND`]; nothing asserts how fast it came.

use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::client::Client;
use crate::support::eventually_within;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::real_apiserver::{
    OWNER_LABEL, RealApiServer, aggregated_cluster_role, apiserver_metric, cluster_role,
    cluster_role_binding, core_rule, user_subject,
};

/// How long a change on the API server may take to show in the proxy's answers: generous (the
/// machine is shared); a watch event normally arrives within milliseconds.
const CHANGE_BOUND: Duration = Duration::from_secs(20);
/// What a bound ClusterRole grants: the kubelet API's catch-all subresource.
const GRANT: (&[&str], &[&str]) = (&["nodes/proxy"], &["get", "create"]);
/// The request asked: `GET /pods` (`nodes/proxy`, verb `get`).
const ASKED: &str = "/pods";
/// SubjectAccessReviews the proxy sent (its own API-call counter).
const SAR_CALLS: &str = "kubelet_auth_proxy_apiserver_calls_total";

/// A unique name for this process and scenario: `kap-e2e-<pid>-<scenario>-<what>`.
fn name(scenario: &str, what: &str) -> String {
    format!("kap-e2e-{}-{scenario}-{what}", std::process::id())
}

/// The owner label's value for `scenario`.
fn owner(scenario: &str) -> String {
    format!("kap-e2e-{}-{scenario}", std::process::id())
}

/// The proxy in front of the stand-in kubelet with `--authorization-mode=<modes>`, watching the
/// real API server, and synced: `/readyz` ready and `rbac_synced` 1 for both cluster kinds.
async fn synced_proxy(api: &RealApiServer, modes: &str) -> Harness {
    let mode = format!("--authorization-mode={modes}");
    let proxy = ProxySpec::new(&[&mode, "--rbac-start-jitter=0s"])
        .kubeconfig(&api.proxy_kubeconfig)
        .start()
        .await;
    poll("the proxy to sync with the API server", || async {
        let ready = proxy.admin_get("/readyz").await.status == StatusCode::OK;
        let roles = synced(&proxy, "clusterroles").await;
        let bindings = synced(&proxy, "clusterrolebindings").await;
        (ready && roles && bindings).then_some(())
    })
    .await;
    proxy
}

/// Whether `rbac_synced{kind}` is 1.
async fn synced(proxy: &Harness, kind: &str) -> bool {
    proxy
        .metric("kubelet_auth_proxy_rbac_synced", &[("kind", kind)])
        .await
        == 1.0
}

/// Calls `check` every 20 ms until it returns `Some`, for at most [`CHANGE_BOUND`].
async fn poll<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(CHANGE_BOUND, what, check).await
}

/// Whether the proxy lets `client` in: anything but 403 is allowed (the stand-in kubelet
/// answers 200).
async fn allowed(client: &Client) -> bool {
    let status = client.get(ASKED).await.status;
    assert!(
        status == StatusCode::FORBIDDEN || status == StatusCode::OK,
        "GET {ASKED}: neither refused nor forwarded: {status}"
    );
    status != StatusCode::FORBIDDEN
}

/// Polls until `client` is allowed (`true`) or refused (`false`).
async fn until_allowed(client: &Client, want: bool, what: &str) {
    poll(what, || async {
        (allowed(client).await == want).then_some(())
    })
    .await;
}

/// The ClusterRoles and ClusterRoleBindings of one scenario, through the admin's client: each
/// created labelled as the scenario's own, so [`with_cleanup`] deletes it; a refusal by the API
/// server fails the scenario.
#[derive(Clone)]
struct Objects {
    scenario: &'static str,
    owner: String,
    kube: kube::Client,
    roles: Api<ClusterRole>,
    bindings: Api<ClusterRoleBinding>,
}

impl Objects {
    fn new(kube: kube::Client, scenario: &'static str) -> Objects {
        Objects {
            scenario,
            owner: owner(scenario),
            roles: Api::all(kube.clone()),
            bindings: Api::all(kube.clone()),
            kube,
        }
    }

    /// A ClusterRole `name` labelled `labels`, granting [`GRANT`].
    async fn granting_role(&self, name: &str, labels: &[(&str, &str)]) {
        let rules = vec![core_rule(GRANT.0, GRANT.1)];
        self.create_role(&cluster_role(name, &self.owner, labels, rules))
            .await;
    }

    async fn create_role(&self, role: &ClusterRole) {
        self.roles
            .create(&PostParams::default(), role)
            .await
            .unwrap();
    }

    /// A ClusterRoleBinding `name` of the ClusterRole `role` to the user `user`.
    async fn bind(&self, name: &str, role: &str, user: &str) {
        let binding = cluster_role_binding(name, &self.owner, role, vec![user_subject(user)]);
        self.bindings
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }

    /// Deletes every ClusterRoleBinding and ClusterRole labelled as the scenario's.
    async fn delete_all(&self) {
        let scenario = self.scenario;
        let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={}", self.owner));
        let params = DeleteParams::default();
        self.bindings
            .delete_collection(&params, &selector)
            .await
            .unwrap_or_else(|e| panic!("cleaning up the ClusterRoleBindings of {scenario}: {e}"));
        self.roles
            .delete_collection(&params, &selector)
            .await
            .unwrap_or_else(|e| panic!("cleaning up the ClusterRoles of {scenario}: {e}"));
    }
}

/// Runs `scenario` against the real API server (or skips it), then deletes every ClusterRole
/// and ClusterRoleBinding labelled as `scenario`'s, whether it passed or not, and reports its
/// outcome.
async fn with_cleanup<F, Fut>(scenario: &'static str, body: F)
where
    F: FnOnce(RealApiServer, Objects) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(api) = RealApiServer::from_env(scenario) else {
        return;
    };
    eprintln!("{scenario}: against the real API server at {}", api.url);
    let objects = Objects::new(api.admin().await, scenario);
    let outcome = tokio::spawn(body(api, objects.clone())).await;
    objects.delete_all().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// (a) A ClusterRoleBinding created through the API server lets its user in; deleted, the user
/// is refused again. Another user, never bound, stays refused throughout.
#[tokio::test]
async fn a_cluster_role_binding_grants_and_its_deletion_revokes() {
    const SCENARIO: &str = "binding";
    with_cleanup(SCENARIO, |api, objects| async move {
        let proxy = synced_proxy(&api, "Node,RBAC").await;
        let user = name(SCENARIO, "alice");
        let alice = proxy.user(&user, &[]);
        let bob = proxy.user(&name(SCENARIO, "bob"), &[]);
        assert!(!allowed(&alice).await, "bound to nothing yet");

        let role = name(SCENARIO, "role");
        objects.granting_role(&role, &[]).await;
        let binding = name(SCENARIO, "binding");
        objects.bind(&binding, &role, &user).await;
        until_allowed(&alice, true, "the new binding lets alice in").await;
        assert!(!allowed(&bob).await, "bob is bound to nothing");

        objects
            .bindings
            .delete(&binding, &DeleteParams::default())
            .await
            .unwrap();
        until_allowed(&alice, false, "the deleted binding no longer lets alice in").await;
        assert_eq!(
            proxy
                .metric(
                    "kubelet_auth_proxy_authorization_decisions_total",
                    &[("mode", "RBAC"), ("decision", "allowed")]
                )
                .await
                .min(1.0),
            1.0,
            "the allowed requests were decided by RBAC"
        );
        proxy.shutdown().await;
    })
    .await;
}

/// (b) An aggregated ClusterRole (no rules of its own, an aggregationRule selecting a label)
/// bound to a user: a labelled ClusterRole granting `nodes/proxy` lets the user in, as the API
/// server's aggregation controller would fill the role; the label removed, the user is refused.
#[tokio::test]
async fn an_aggregated_cluster_role_follows_the_labels_of_the_roles_it_selects() {
    const SCENARIO: &str = "aggregated";
    with_cleanup(SCENARIO, |api, objects| async move {
        let label_key = "kubelet-auth-proxy.test/aggregate-to";
        let label_value = objects.owner.clone();
        let proxy = synced_proxy(&api, "Node,RBAC").await;
        let user = name(SCENARIO, "carol");
        let carol = proxy.user(&user, &[]);

        let aggregated = name(SCENARIO, "aggregated");
        objects
            .create_role(&aggregated_cluster_role(
                &aggregated,
                &objects.owner,
                label_key,
                &label_value,
            ))
            .await;
        objects
            .bind(&name(SCENARIO, "binding"), &aggregated, &user)
            .await;
        // An unlabelled role granting the same is not aggregated.
        objects
            .granting_role(&name(SCENARIO, "unlabelled"), &[])
            .await;
        // A sentinel role created last, bound (first) to a user of its own: once that user is
        // let in, both watches have delivered everything created before it (each watch delivers
        // its kind in order), so the refusal below is carol's final answer, not a late event.
        let sentinel = name(SCENARIO, "sentinel");
        objects.bind(&sentinel, &sentinel, &sentinel).await;
        objects.granting_role(&sentinel, &[]).await;
        until_allowed(
            &proxy.user(&sentinel, &[]),
            true,
            "the sentinel binding lets its user in",
        )
        .await;
        assert!(
            !allowed(&carol).await,
            "the aggregated role selects nothing yet"
        );

        let part = name(SCENARIO, "part");
        objects
            .granting_role(&part, &[(label_key, &label_value)])
            .await;
        until_allowed(&carol, true, "the labelled role is aggregated").await;

        let unlabel = json!({"metadata": {"labels": {label_key: null}}});
        objects
            .roles
            .patch(&part, &PatchParams::default(), &Patch::Merge(&unlabel))
            .await
            .unwrap();
        until_allowed(
            &carol,
            false,
            "the role without its label is no longer aggregated",
        )
        .await;
        proxy.shutdown().await;
    })
    .await;
}

/// (c) With `Node,RBAC,Webhook`: a user RBAC allows costs no SubjectAccessReview; a user only
/// the API server's privileged-group authorizer allows (`system:masters`, once no binding grants
/// that group anything) gets in through the webhook; a user nobody allows is refused after a
/// review. The cluster's own `cluster-admin` binding of `system:masters` is taken away for the
/// scenario and put back after it.
#[tokio::test]
async fn with_a_webhook_after_rbac_only_what_rbac_does_not_allow_is_reviewed() {
    const SCENARIO: &str = "webhook";
    with_cleanup(SCENARIO, |api, objects| async move {
        let bindings = objects.bindings.clone();
        let saved = bindings.get("cluster-admin").await.unwrap();
        bindings
            .delete("cluster-admin", &DeleteParams::default())
            .await
            .unwrap();
        let outcome = tokio::spawn(webhook_scenario(api, objects)).await;
        let mut restored = saved;
        restored.metadata.resource_version = None;
        restored.metadata.uid = None;
        restored.metadata.creation_timestamp = None;
        restored.metadata.managed_fields = None;
        bindings
            .create(&PostParams::default(), &restored)
            .await
            .unwrap_or_else(|e| panic!("putting the cluster-admin binding back: {e}"));
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    })
    .await;
}

async fn webhook_scenario(api: RealApiServer, objects: Objects) {
    const SCENARIO: &str = "webhook";
    let role = name(SCENARIO, "role");
    let user = name(SCENARIO, "dave");
    objects.granting_role(&role, &[]).await;
    objects.bind(&name(SCENARIO, "binding"), &role, &user).await;
    let proxy = synced_proxy(&api, "Node,RBAC,Webhook").await;
    let dave = proxy.user(&user, &[]);
    // The binding may have been listed or may still be on its way as an event.
    until_allowed(&dave, true, "the binding lets dave in").await;
    // Only this scenario's proxy has a webhook: the API server's own count is this proxy's.
    let reviews = || {
        apiserver_metric(
            &objects.kube,
            "apiserver_request_total",
            &[("resource", "subjectaccessreviews")],
        )
    };
    let reviewed_before = reviews().await;
    for _ in 0..5 {
        assert!(allowed(&dave).await);
    }
    assert_eq!(
        reviews().await,
        reviewed_before,
        "the API server counted no SubjectAccessReview for requests RBAC allowed"
    );
    let sar = [("kind", "SubjectAccessReview")];
    assert_eq!(
        proxy.metric(SAR_CALLS, &sar).await,
        0.0,
        "RBAC allowed every request: no SubjectAccessReview"
    );
    assert!(
        proxy
            .metric(
                "kubelet_auth_proxy_authorization_decisions_total",
                &[("mode", "RBAC"), ("decision", "allowed")]
            )
            .await
            >= 6.0,
        "RBAC decided them"
    );

    let master = proxy.user(&name(SCENARIO, "erin"), &["system:masters"]);
    assert!(
        allowed(&master).await,
        "system:masters is allowed by the API server's privileged-group authorizer, through the webhook"
    );
    assert!(
        proxy.metric(SAR_CALLS, &sar).await >= 1.0,
        "the webhook asked the API server"
    );
    assert_eq!(
        proxy
            .metric(
                "kubelet_auth_proxy_authorization_decisions_total",
                &[("mode", "Webhook"), ("decision", "allowed")]
            )
            .await,
        1.0
    );

    let nobody = proxy.user(&name(SCENARIO, "frank"), &[]);
    let before = proxy.metric(SAR_CALLS, &sar).await;
    assert!(
        !allowed(&nobody).await,
        "neither RBAC nor the API server allows frank"
    );
    assert!(
        proxy.metric(SAR_CALLS, &sar).await > before,
        "frank was reviewed before being refused"
    );
    proxy.shutdown().await;
}

/// (d) Once synced, `/readyz` is ready and the metrics say so: `rbac_synced` 1 for both watched
/// kinds, the objects held counted, one start list each and a watch each.
#[tokio::test]
async fn readyz_and_the_metrics_show_the_sync() {
    const SCENARIO: &str = "readyz";
    with_cleanup(SCENARIO, |api, _objects| async move {
        let proxy = synced_proxy(&api, "Node,RBAC").await;
        assert_eq!(proxy.admin_get("/readyz").await.status, StatusCode::OK);
        for kind in ["clusterroles", "clusterrolebindings"] {
            let labels = [("kind", kind)];
            assert_eq!(
                proxy
                    .metric("kubelet_auth_proxy_rbac_synced", &labels)
                    .await,
                1.0,
                "{kind} synced"
            );
            assert!(
                proxy
                    .metric("kubelet_auth_proxy_rbac_objects", &labels)
                    .await
                    >= 1.0,
                "{kind}: the cluster's bootstrap objects are held (those that can grant)"
            );
            assert_eq!(
                proxy
                    .metric(
                        "kubelet_auth_proxy_rbac_lists_total",
                        &[("kind", kind), ("reason", "start")]
                    )
                    .await,
                1.0,
                "{kind}: listed once"
            );
            poll("a watch of each kind", || async {
                let watches = proxy
                    .metric("kubelet_auth_proxy_rbac_watches_total", &labels)
                    .await;
                (watches >= 1.0).then_some(())
            })
            .await;
            assert!(
                proxy
                    .metric(
                        "kubelet_auth_proxy_rbac_last_contact_timestamp_seconds",
                        &labels
                    )
                    .await
                    > 0.0
            );
        }
        // Without --pod-scoped-authz, Roles and RoleBindings are not watched.
        assert_eq!(
            proxy
                .metric(
                    "kubelet_auth_proxy_rbac_synced",
                    &[("kind", "rolebindings")]
                )
                .await,
            0.0
        );
        proxy.shutdown().await;
    })
    .await;
}
