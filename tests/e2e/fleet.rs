//! The caches at fleet scale (issue 19, `docs/FLEET.md`), against the stand-in API server: keys
//! filled together expire apart while renewals live their whole TTL; a key in use is revalidated
//! in the background, once, while requests are answered from its entry; a denying revalidation
//! replaces the entry at once; a failed one leaves it. Counts and order only: the sleeps pass a
//! TTL or half of one, nothing is asserted about how long anything took.

use std::time::Duration;

use http::StatusCode;

use crate::support::apiserver::{ApiServer, Fault, Kind, TokenUser, Verdict};
use crate::support::client::{Client, empty, request};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::metrics::total;
use crate::support::{eventually, within};

/// Between two uses of a key while waiting for its refresh ahead.
const PACE: Duration = Duration::from_millis(20);

async fn proxy(api: &ApiServer, args: &[&str]) -> Harness {
    ProxySpec::new(args).apiserver(api).start().await
}

/// Bearer tokens reviewed with a token cache TTL of `ttl`; every authenticated request allowed.
async fn token_proxy(api: &ApiServer, ttl: &str) -> Harness {
    let ttl = format!("--authentication-token-webhook-cache-ttl={ttl}");
    proxy(
        api,
        &[
            "--authentication-token-webhook",
            "--authorization-mode=AlwaysAllow",
            &ttl,
        ],
    )
    .await
}

/// Waits until the proxy has counted one refresh ahead of tokens with `result`, and no other.
async fn refresh_counted(h: &Harness, result: &str) {
    eventually(
        &format!("one refresh ahead counted as {result}"),
        || async {
            let reply = h.admin_get("/metrics").await;
            let text = reply.text();
            let counted = |result| {
                total(
                    &text,
                    "kubelet_auth_proxy_cache_refreshes_ahead_total",
                    &[("cache", "TokenReview"), ("result", result)],
                )
            };
            let other = if result == "replaced" {
                "failed"
            } else {
                "replaced"
            };
            assert_eq!(counted(other), 0.0);
            (counted(result) == 1.0).then_some(())
        },
    )
    .await;
}

/// Sends each of `tokens` once, each must be accepted; returns how many of them were reviewed
/// by this round.
async fn round(api: &ApiServer, client: &Client, tokens: &[String]) -> usize {
    let before = api.token_reviews().len();
    for token in tokens {
        assert_eq!(
            client.get_with_token("/pods", token).await.status,
            StatusCode::OK
        );
    }
    let reviewed = api.token_reviews()[before..]
        .iter()
        .filter_map(|spec| spec["token"].as_str().map(str::to_owned))
        .collect::<std::collections::BTreeSet<_>>();
    tokens.iter().filter(|t| reviewed.contains(*t)).count()
}

#[tokio::test]
async fn new_keys_filled_together_expire_apart_and_renewals_live_the_whole_ttl() {
    let api = ApiServer::start().await;
    let tokens = |set: &str| -> Vec<String> { (0..40).map(|n| format!("tok-{set}-{n}")).collect() };
    let (first, second) = (tokens("a"), tokens("b"));
    for token in first.iter().chain(&second) {
        api.add_token(token, TokenUser::new(token));
    }
    let h = token_proxy(&api, "8s").await;
    let client = h.anonymous();

    let started = tokio::time::Instant::now();
    assert_eq!(round(&api, &client, &first).await, 40, "new keys");
    // Past the TTL (8 s) every first lifetime has ended, none being longer; within a TTL of
    // their end (at least 2 + 8 s) the keys are remembered, so the first set is renewed. A second
    // set of new keys is filled at the same moment.
    tokio::time::sleep_until(started + Duration::from_secs(9)).await;
    assert_eq!(round(&api, &client, &first).await, 40, "renewals");
    assert_eq!(round(&api, &client, &second).await, 40, "new keys");
    // Half a TTL later: the renewals all live (a whole TTL each); of the new keys, filled
    // together, some first lifetimes (a random part of the TTL, at least a quarter) have ended
    // and some have not.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        round(&api, &client, &first).await,
        0,
        "renewals live the TTL"
    );
    let expired = round(&api, &client, &second).await;
    assert!(
        expired > 0 && expired < 40,
        "{expired} of 40 keys filled together were reviewed again half a TTL later"
    );
}

/// Uses the token until a second review of it arrives (its refresh ahead, held by the stand-in),
/// every request answered meanwhile.
async fn use_until_refreshed(api: &ApiServer, client: &Client, token: &str) {
    within("a refresh ahead of a key in use", async {
        while api.arrivals(Kind::TokenReview) < 2 {
            assert_eq!(
                client.get_with_token("/pods", token).await.status,
                StatusCode::OK
            );
            tokio::time::sleep(PACE).await;
        }
    })
    .await;
}

/// The start of a refresh ahead: a stand-in API server knowing `tok-bob`, a proxy caching tokens
/// for 15 s, and an anonymous client whose first request with the token was answered.
async fn bob_reviewed_once() -> (ApiServer, Harness, Client) {
    let api = ApiServer::start().await;
    api.add_token("tok-bob", TokenUser::new("bob"));
    let h = token_proxy(&api, "15s").await;
    let client = h.anonymous();
    assert_eq!(
        client.get_with_token("/pods", "tok-bob").await.status,
        StatusCode::OK
    );
    (api, h, client)
}

#[tokio::test]
async fn a_key_in_use_is_refreshed_ahead_once_while_requests_are_answered_from_it() {
    let (api, h, client) = bob_reviewed_once().await;
    assert_eq!(api.arrivals(Kind::TokenReview), 1);

    let gate = api.hold(Kind::TokenReview);
    use_until_refreshed(&api, &client, "tok-bob").await;
    // The refresh is still unanswered: requests are answered from the entry, and no other call
    // goes out for the key (one refresh, not one per request).
    for _ in 0..3 {
        assert_eq!(
            client.get_with_token("/pods", "tok-bob").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(api.arrivals(Kind::TokenReview), 2);
    gate.release();
    refresh_counted(&h, "replaced").await;
    assert_eq!(
        client.get_with_token("/pods", "tok-bob").await.status,
        StatusCode::OK
    );
    assert_eq!(api.statuses(Kind::TokenReview), vec![201, 201]);
    assert_eq!(
        api.arrivals(Kind::TokenReview),
        2,
        "the refreshed entry answers"
    );
}

#[tokio::test]
async fn a_failed_refresh_leaves_the_entry_and_is_not_retried() {
    let (api, h, client) = bob_reviewed_once().await;
    // The refresh meets a final error (403, not retried).
    api.inject(Kind::TokenReview, Fault::Forbidden, 1);
    let gate = api.hold(Kind::TokenReview);
    use_until_refreshed(&api, &client, "tok-bob").await;
    gate.release();
    refresh_counted(&h, "failed").await;
    assert_eq!(api.statuses(Kind::TokenReview), vec![201, 403]);
    // The entry still answers, and the failed refresh is not tried again for it.
    for _ in 0..3 {
        assert_eq!(
            client.get_with_token("/pods", "tok-bob").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(api.arrivals(Kind::TokenReview), 2);
}

#[tokio::test]
async fn a_refresh_that_denies_replaces_the_entry_at_once() {
    let api = ApiServer::start_allowing().await;
    let h = proxy(
        &api,
        &[
            "--authorization-mode=Webhook",
            "--authorization-webhook-cache-authorized-ttl=15s",
        ],
    )
    .await;
    let alice = h.user("alice", &[]);
    let stats = |client: &Client| {
        let client = client.clone();
        async move {
            client
                .send(request("GET", "/stats/summary").body(empty()).unwrap())
                .await
                .status
        }
    };
    assert_eq!(stats(&alice).await, StatusCode::OK);
    assert_eq!(api.arrivals(Kind::SubjectAccessReview), 1);

    // The permission is revoked; the allowed entry keeps answering until its refresh ahead.
    api.set_rules(|_| Verdict::deny());
    let gate = api.hold(Kind::SubjectAccessReview);
    within("a refresh ahead of the allowed entry", async {
        while api.arrivals(Kind::SubjectAccessReview) < 2 {
            assert_eq!(stats(&alice).await, StatusCode::OK);
            tokio::time::sleep(PACE).await;
        }
    })
    .await;
    assert_eq!(stats(&alice).await, StatusCode::OK, "answered while held");
    gate.release();
    // Its denial replaces the entry as soon as it is answered: the next requests are refused
    // without another review.
    within("the denial in force", async {
        while stats(&alice).await == StatusCode::OK {
            tokio::time::sleep(PACE).await;
        }
    })
    .await;
    assert_eq!(stats(&alice).await, StatusCode::FORBIDDEN);
    assert_eq!(api.arrivals(Kind::SubjectAccessReview), 2);
}
