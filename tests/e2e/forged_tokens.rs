//! Forged service-account tokens cost the API server nothing: a JWT naming the cluster's issuer
//! is checked on the node against the keys the API server publishes, and one with a bad
//! signature, an unpublished key id, an algorithm the issuer has no key for, past its expiry or
//! for another audience is refused with 401 and no TokenReview. A valid one is still reviewed (the API server alone knows whether its pod
//! still exists) and cached; a key rotation is followed; keys that cannot be fetched leave every
//! token to TokenReview, as before.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};

use kubelet_auth_proxy::authn::service_account_keys::REFRESH_COOLDOWN;

use crate::support::apiserver::issuer::{ISSUER, service_account_claims};
use crate::support::apiserver::{ApiServer, Kind, TokenUser};
use crate::support::eventually;
use crate::support::harness::{Harness, ProxySpec};

/// A proxy checking bearer tokens with `api`, allowing whoever is authenticated.
async fn proxy(api: &ApiServer, extra: &[&str]) -> Harness {
    let h = ProxySpec::always_allow(&["--authentication-token-webhook"])
        .args(extra)
        .apiserver(api)
        .start()
        .await;
    h.wait_for_issuer_keys().await;
    assert!(api.jwks_fetches() > 0);
    h
}

/// `GET /pods` with `token`: the status.
async fn status_with(h: &Harness, token: &str) -> StatusCode {
    h.bearer_get("/pods", token).await.status
}

/// `claims` as an HS256 token (a shared-secret signature the issuer never makes) with a made-up
/// signature.
fn hs256(claims: &Value) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    format!(
        "{}.{}.{}",
        encode(&json!({"alg": "HS256"})),
        encode(claims),
        URL_SAFE_NO_PAD.encode([7u8; 32])
    )
}

fn with(mut claims: Value, field: &str, value: Value) -> Value {
    claims[field] = value;
    claims
}

#[tokio::test]
async fn forged_service_account_tokens_are_refused_without_a_token_review() {
    let api = ApiServer::start().await;
    let h = proxy(&api, &["--api-audiences", ISSUER]).await;
    let claims = service_account_claims("monitoring", "prometheus");
    let now = claims["iat"].as_u64().unwrap();

    let valid = api.sign_token(&claims, None);
    let (head, signature) = valid.rsplit_once('.').unwrap();
    let mut flipped = signature.as_bytes().to_vec();
    flipped[5] = if flipped[5] == b'A' { b'B' } else { b'A' };
    let forged = [
        (
            "bad signature",
            format!("{head}.{}", String::from_utf8(flipped).unwrap()),
            "signature",
        ),
        (
            "unpublished key id",
            api.sign_token(&claims, Some("attacker-key")),
            "unknown_key",
        ),
        (
            "expired",
            api.sign_token(&with(claims.clone(), "exp", json!(now - 3600)), None),
            "expired",
        ),
        (
            "another audience",
            api.sign_token(
                &with(claims.clone(), "aud", json!(["https://vault.example"])),
                None,
            ),
            "audience",
        ),
        ("another algorithm", hs256(&claims), "algorithm"),
        (
            "issued in the future",
            api.sign_token(&with(claims.clone(), "iat", json!(now + 3600)), None),
            "not_yet_valid",
        ),
    ];
    for (what, token, reason) in &forged {
        // Twice each: a refusal is not cached as an answer, and never becomes a review.
        for _ in 0..2 {
            assert_eq!(
                status_with(&h, token).await,
                StatusCode::UNAUTHORIZED,
                "{what}"
            );
        }
        assert_eq!(
            h.metric(
                "kubelet_auth_proxy_tokens_refused_locally_total",
                &[("reason", reason)]
            )
            .await,
            2.0,
            "{what}"
        );
    }
    assert_eq!(
        api.arrivals(Kind::TokenReview),
        0,
        "no forged token reached the API server"
    );

    // The valid token is reviewed once, then answered from the cache.
    api.add_token(
        &valid,
        TokenUser::new("system:serviceaccount:monitoring:prometheus"),
    );
    for _ in 0..3 {
        assert_eq!(status_with(&h, &valid).await, StatusCode::OK);
    }
    assert_eq!(api.arrivals(Kind::TokenReview), 1);
    // A verified token the API server no longer accepts (its pod deleted) is refused by it.
    let orphan = api.sign_token(
        &with(claims.clone(), "sub", json!("system:serviceaccount:x:gone")),
        None,
    );
    assert_eq!(status_with(&h, &orphan).await, StatusCode::UNAUTHORIZED);
    assert_eq!(api.arrivals(Kind::TokenReview), 2);
    // Opaque tokens (a static token file, OIDC of another issuer) still go to TokenReview.
    assert_eq!(
        status_with(&h, "opaque-token").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(api.arrivals(Kind::TokenReview), 3);
}

#[tokio::test]
async fn a_key_rotation_is_followed_and_an_invented_key_id_refused() {
    let api = ApiServer::start().await;
    let h = proxy(&api, &[]).await;
    let fetched = api.jwks_fetches();
    let claims = service_account_claims("kube-system", "metrics-server");
    let old = api.sign_token(&claims, None);
    api.add_token(
        &old,
        TokenUser::new("system:serviceaccount:kube-system:metrics-server"),
    );

    // A new key signs from now on: a token naming it, issued after the keys were fetched (and
    // past the cooldown after that fetch), makes the proxy fetch them again once, then verifies.
    tokio::time::sleep(REFRESH_COOLDOWN + Duration::from_secs(1)).await;
    api.rotate_keys(false);
    let claims_later = service_account_claims("kube-system", "metrics-server");
    let new = api.sign_token(&claims_later, None);
    api.add_token(
        &new,
        TokenUser::new("system:serviceaccount:kube-system:metrics-server"),
    );
    assert_eq!(status_with(&h, &new).await, StatusCode::OK);
    assert_eq!(api.jwks_fetches(), fetched + 1, "one fetch for the new key");
    assert_eq!(
        status_with(&h, &old).await,
        StatusCode::OK,
        "the old key still verifies"
    );
    assert_eq!(api.arrivals(Kind::TokenReview), 2);

    // The next unknown key id within the cooldown is refused without a fetch or a review.
    let stranger = api.sign_token(&claims_later, Some("never-published"));
    assert_eq!(status_with(&h, &stranger).await, StatusCode::UNAUTHORIZED);
    assert_eq!(api.jwks_fetches(), fetched + 1);
    assert_eq!(api.arrivals(Kind::TokenReview), 2);

    // Past the cooldown, a burst of invented key ids at once: one fetch for all of them, each
    // refused, none reviewed (those that waited for the fetch judge by it).
    tokio::time::sleep(REFRESH_COOLDOWN + Duration::from_secs(1)).await;
    let burst = service_account_claims("default", "attacker");
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..16 {
        let token = api.sign_token(&burst, Some(&format!("invented-{i}")));
        let client = h.anonymous();
        requests.spawn(async move { client.get_with_token("/pods", &token).await.status });
    }
    while let Some(status) = requests.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        api.jwks_fetches(),
        fetched + 2,
        "one fetch for the whole burst"
    );
    assert_eq!(
        api.arrivals(Kind::TokenReview),
        2,
        "no review for any of them"
    );
}

#[tokio::test]
async fn without_the_issuers_keys_every_token_goes_to_token_review_as_before() {
    let api = ApiServer::start().await;
    api.set_issuer_discovery_forbidden(true);
    let h = ProxySpec::always_allow(&["--authentication-token-webhook"])
        .apiserver(&api)
        .start()
        .await;
    eventually("a failed fetch of the issuer's keys", || async {
        (h.metric(
            "kubelet_auth_proxy_service_account_key_fetches_total",
            &[("result", "failed")],
        )
        .await
            > 0.0)
            .then_some(())
    })
    .await;
    let claims = service_account_claims("monitoring", "prometheus");
    let valid = api.sign_token(&claims, None);
    api.add_token(
        &valid,
        TokenUser::new("system:serviceaccount:monitoring:prometheus"),
    );
    assert_eq!(status_with(&h, &valid).await, StatusCode::OK);
    let forged = api.sign_token(&claims, Some("attacker-key"));
    assert_eq!(status_with(&h, &forged).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        api.arrivals(Kind::TokenReview),
        2,
        "both reviewed: no keys, no local decision"
    );
}
