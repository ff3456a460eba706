//! The token classes only a real kube-apiserver (v1.36) tells apart, through the one gate every
//! TokenReview passes (`review_gate.rs` runs the rest against the stand-in): a service account's
//! token verifies on the node until it expires, even after the service account is deleted, and
//! a token for another audience verifies there too (no `--api-audiences` given); the API server
//! refuses both. Replayed, each costs one TokenReview (its refusal is cached); many distinct
//! ones cost at most the node's budget of failures. A real token spelled with the unused bits of
//! its signature set is the same token for the API server, and is served.
//!
//! Skipped (saying so) unless `.ci/run` started an API server (see `support::real_apiserver`).
//! Every object the scenario creates carries its owner label and is deleted when it ends.

use http::StatusCode;
use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use kubelet_auth_proxy::authn::failure_budget::OVERALL_LIMITS;

use crate::support::client::bearer;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::issuer::with_unused_bits;
use crate::support::real_apiserver::{
    OWNER_LABEL, RealApiServer, cluster_role_binding, meta, user_subject,
};
use crate::support::{eventually, eventually_within};

const SCENARIO: &str = "tokens";
/// The namespace the service account lives in (always there, even without controllers).
const NAMESPACE: &str = "default";
/// Times a refused token is sent again.
const REPLAYS: usize = 50;
/// Distinct tokens of the deleted service account sent one after the other.
const DISTINCT: usize = 30;
/// The proxy's own count of TokenReviews sent.
const CALLS: &str = "kubelet_auth_proxy_apiserver_calls_total";

fn owner() -> String {
    format!("kap-e2e-{}-{SCENARIO}", std::process::id())
}

fn name(what: &str) -> String {
    format!("{}-{what}", owner())
}

/// A token of the service account `account`, for `audiences` (the API server's own when empty).
async fn token_of(accounts: &Api<ServiceAccount>, account: &str, audiences: &[&str]) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!audiences.is_empty())
                .then(|| audiences.iter().map(|a| (*a).to_owned()).collect()),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of {account}: {e}"))
        .status
        .and_then(|status| status.token)
        .expect("a TokenRequest answer has a token")
}

/// Whether the API server authenticates `token`, asked directly (not through the proxy).
async fn authenticated(admin: &kube::Client, token: &str) -> bool {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    let reviews: Api<TokenReview> = Api::all(admin.clone());
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("a TokenReview: {e}"));
    answer.status.and_then(|s| s.authenticated) == Some(true)
}

/// The TokenReviews the proxy sent so far.
async fn reviews(proxy: &Harness) -> f64 {
    proxy.metric(CALLS, &[("kind", "TokenReview")]).await
}

#[tokio::test]
async fn refused_service_account_tokens_cost_one_review_each_and_at_most_the_budget() {
    let Some(api) = RealApiServer::from_env(SCENARIO) else {
        return;
    };
    eprintln!("{SCENARIO}: against the real API server at {}", api.url);
    let admin = api.admin().await;
    let outcome = tokio::spawn(scenario(api, admin.clone())).await;
    let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={}", owner()));
    let params = DeleteParams::default();
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(admin, NAMESPACE);
    bindings
        .delete_collection(&params, &selector)
        .await
        .unwrap_or_else(|e| panic!("cleaning up the ClusterRoleBindings of {SCENARIO}: {e}"));
    accounts
        .delete_collection(&params, &selector)
        .await
        .unwrap_or_else(|e| panic!("cleaning up the ServiceAccounts of {SCENARIO}: {e}"));
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn scenario(api: RealApiServer, admin: kube::Client) {
    // The proxy may read the issuer's keys, as config/rbac.yaml lets it in a cluster.
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let discovery = cluster_role_binding(
        &name("discovery"),
        &owner(),
        "system:service-account-issuer-discovery",
        vec![user_subject("kubelet-auth-proxy")],
    );
    bindings
        .create(&PostParams::default(), &discovery)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let account = name("sa");
    let service_account = ServiceAccount {
        metadata: meta(&account, &owner(), &[]),
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &service_account)
        .await
        .unwrap();
    let live = token_of(&accounts, &account, &[]).await;
    let other_audience = token_of(&accounts, &account, &["https://other.example"]).await;
    let mut doomed = Vec::new();
    for _ in 0..=DISTINCT {
        doomed.push(token_of(&accounts, &account, &[]).await);
    }

    let proxy = ProxySpec::new(&[
        "--authentication-token-webhook",
        "--authorization-mode=AlwaysAllow",
    ])
    .kubeconfig(&api.proxy_kubeconfig)
    .start()
    .await;
    proxy.wait_for_issuer_keys().await;
    let client = proxy.anonymous();
    let status = |token: String| {
        let client = client.clone();
        async move { client.send(bearer("/pods", &token)).await.status }
    };

    // A live token, and the same spelled with unused bits set: the API server's same token.
    assert_eq!(status(live.clone()).await, StatusCode::OK);
    assert_eq!(
        status(with_unused_bits(&live)).await,
        StatusCode::OK,
        "a real token spelled with its unused bits set"
    );

    // Another audience's token verifies on the node; the API server refuses it, once.
    let before = reviews(&proxy).await;
    for _ in 0..REPLAYS {
        assert_eq!(
            status(other_audience.clone()).await,
            StatusCode::UNAUTHORIZED
        );
    }
    let cost = reviews(&proxy).await - before;
    assert_eq!(
        cost, 1.0,
        "another audience's token replayed {REPLAYS} times"
    );

    // The service account deleted, its tokens still verify on the node until they expire.
    accounts
        .delete(&account, &DeleteParams::default())
        .await
        .unwrap();
    let last = doomed.pop().unwrap();
    eventually_within(
        std::time::Duration::from_secs(30),
        "the API server to refuse the deleted service account's tokens",
        || async { (!authenticated(&admin, &last).await).then_some(()) },
    )
    .await;
    let before = reviews(&proxy).await;
    for _ in 0..REPLAYS {
        assert_eq!(status(doomed[0].clone()).await, StatusCode::UNAUTHORIZED);
    }
    let cost = reviews(&proxy).await - before;
    assert_eq!(
        cost, 1.0,
        "a deleted service account's token replayed {REPLAYS} times"
    );

    // Many of them, each new: at most the node's budget of failures.
    let before = reviews(&proxy).await;
    let started = std::time::Instant::now();
    for token in &doomed[1..] {
        assert_eq!(status(token.clone()).await, StatusCode::UNAUTHORIZED);
    }
    let cost = reviews(&proxy).await - before;
    let bound =
        OVERALL_LIMITS.burst + (OVERALL_LIMITS.rate * started.elapsed().as_secs_f64()).ceil();
    assert!(
        cost <= bound,
        "{} distinct tokens of a deleted service account: {cost} reviews, bound {bound}",
        doomed.len() - 1
    );
    eventually("the skipped reviews counted", || async {
        (proxy
            .metric("kubelet_auth_proxy_token_reviews_skipped_total", &[])
            .await
            > 0.0)
            .then_some(())
    })
    .await;
}
