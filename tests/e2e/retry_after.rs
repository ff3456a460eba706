//! The API server's `Retry-After`, obeyed by the whole review client: while it answers 429, one
//! call goes out per `Retry-After` for all keys and both kinds together, the requests waiting
//! for a review are answered once it recovers, and a hold longer than a review may wait fails
//! closed without calling.

use std::time::Duration;

use http::StatusCode;

use crate::support::apiserver::{ApiServer, Fault, Kind, Target, TokenUser};
use crate::support::harness::{Harness, ProxySpec};

/// The 429s' `Retry-After`.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The stand-in, allowing every review, and a proxy in mode Webhook with `args` asking it.
async fn webhook_proxy(args: &[&str]) -> (ApiServer, Harness) {
    let api = ApiServer::start_allowing().await;
    let h = ProxySpec::new(&["--authorization-mode=Webhook"])
        .args(args)
        .apiserver(&api)
        .start()
        .await;
    (api, h)
}

/// The stand-in answers its next `count` calls, of either kind, 429 with `Retry-After: seconds`.
fn throttle(api: &ApiServer, seconds: u32, count: usize) {
    let fault = Fault::TooManyRequests {
        retry_after_seconds: seconds,
    };
    api.inject(Target::Both, fault, count);
}

#[tokio::test]
async fn one_call_per_retry_after_for_every_key_then_all_are_answered() {
    let (api, h) = webhook_proxy(&["--apiserver-request-timeout=8s"]).await;

    // Three 429s in a row, then normal answers. One user meets the first; eleven more users
    // (eleven more keys) ask while the API server is holding the proxy off.
    throttle(&api, 1, 3);
    let mut requests = Vec::new();
    for n in 0..12 {
        let client = h.user(&format!("user-{n}"), &[]);
        requests.push(tokio::spawn(async move { client.get("/pods").await }));
        if n == 0 {
            api.wait_for_arrivals(Kind::SubjectAccessReview, 1).await;
        }
    }
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }

    let mut calls = api.calls();
    calls.sort_by_key(|c| c.arrived);
    let statuses: Vec<u16> = calls.iter().map(|c| c.status).collect();
    // One call per Retry-After while the API server refused: the three 429s and the call that
    // found it answering again; then the eleven others at once. One review per user.
    assert_eq!(statuses[..4], [429, 429, 429, 201], "{calls:?}");
    assert_eq!(calls.len(), 15, "{calls:?}");
    // Each call after a 429 came no sooner than its Retry-After (a lower bound: a loaded machine
    // only spaces calls further; 50 ms of slack for the answer's own way back).
    for pair in calls[..4].windows(2) {
        let gap = pair[1].arrived.duration_since(pair[0].arrived);
        assert!(
            gap >= RETRY_AFTER - Duration::from_millis(50),
            "{gap:?}: {calls:?}"
        );
    }
}

#[tokio::test]
async fn a_hold_longer_than_a_review_may_wait_fails_closed_without_calling() {
    let (api, h) = webhook_proxy(&[
        "--authentication-token-webhook",
        "--apiserver-request-timeout=1s",
    ])
    .await;
    api.add_token("tok", TokenUser::new("carol"));

    throttle(&api, 10, 1);
    let reply = h.user("alice", &[]).get("/pods").await;
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    // During the hold: a TokenReview is not made either, and the caller gets the kubelet's 401.
    let reply = h.bearer_get("/pods", "tok").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.calls().len(), 1, "{:?}", api.calls());
    assert_eq!(
        h.metric(
            "kubelet_auth_proxy_apiserver_reviews_held_off_total",
            &[("kind", "TokenReview")]
        )
        .await,
        1.0
    );
    // The hold's end is exposed as a time still to come.
    let until = h
        .metric(
            "kubelet_auth_proxy_apiserver_hold_off_until_timestamp_seconds",
            &[],
        )
        .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(until > now, "hold-off until {until}, now {now}");
}
