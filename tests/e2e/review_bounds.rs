//! Reviews in flight to the API server are bounded per kind (`--apiserver-max-reviews-inflight`):
//! a flood of requests with ever new tokens, or ever new users to authorize, holds at most that
//! many API server calls (and sockets) at once; at most 16 more per place wait their turn, and
//! beyond that a request fails closed at once with the kubelet's status for a failed review (401
//! for a token, 500 for an authorization). The gauges and the refusal counter show it. A wait
//! that outlasts `--apiserver-request-timeout` is refused too (unit tests of
//! `src/apiserver/gate.rs`, on a paused clock).

use http::StatusCode;

use crate::support::apiserver::issuer::service_account_claims;
use crate::support::apiserver::{ApiServer, Kind, TokenUser};
use crate::support::client::{Client, empty, request};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::within;

const IN_FLIGHT: &str = "kubelet_auth_proxy_apiserver_reviews_in_flight";
const WAITING: &str = "kubelet_auth_proxy_apiserver_reviews_waiting";
const REFUSED: &str = "kubelet_auth_proxy_apiserver_reviews_refused_total";

/// A flood's shape: `--apiserver-max-reviews-inflight` and the requests beyond the places and
/// the queue (16 per place).
#[derive(Clone, Copy)]
struct Shape {
    limit: usize,
    beyond: usize,
}

impl Shape {
    fn queue(self) -> usize {
        16 * self.limit
    }

    /// Requests sent at once, each needing a review of its own.
    fn flood(self) -> usize {
        self.limit + self.queue() + self.beyond
    }
}

/// Authorizations: two places.
const ACCESS: Shape = Shape {
    limit: 2,
    beyond: 3,
};
/// Token reviews: one place, so that the whole flood fits within the places the budget of
/// failures gives reviews whose answer is not known yet (failure_budget.rs: 19 at once, the
/// node's last place kept for clean sources), and reaches the API server's gate.
const TOKENS: Shape = Shape {
    limit: 1,
    beyond: 2,
};

async fn proxy(api: &ApiServer, mode: &str, shape: Shape) -> Harness {
    let limit = format!("--apiserver-max-reviews-inflight={}", shape.limit);
    ProxySpec::new(&["--authentication-token-webhook", mode, &limit])
        .apiserver(api)
        .start()
        .await
}

async fn get(client: &Client, token: Option<&str>) -> StatusCode {
    let mut req = request("GET", "/pods");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    client.send(req.body(empty()).unwrap()).await.status
}

/// Sends `shape.flood()` requests at once while the API server holds every `kind` call:
/// `shape.limit` calls are made, `shape.queue()` requests wait, `shape.beyond` are refused at
/// once; once the API server answers, the waiting ones are reviewed in turn and served.
async fn flood(
    h: &Harness,
    api: &ApiServer,
    kind: Kind,
    shape: Shape,
    token_for: &dyn Fn(usize) -> Option<String>,
) {
    let Shape { limit, beyond } = shape;
    let queue = shape.queue();
    let label = [("kind", kind_label(kind))];
    let refused_status = match kind {
        Kind::TokenReview => StatusCode::UNAUTHORIZED,
        Kind::SubjectAccessReview => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let gate = api.hold(kind);
    let mut requests = Vec::new();
    for i in 0..shape.flood() {
        let token = token_for(i);
        let client = match token {
            Some(_) => h.anonymous(),
            None => h.user(&format!("user-{i}"), &[]),
        };
        requests.push(tokio::spawn(
            async move { get(&client, token.as_deref()).await },
        ));
    }
    within("the flood to fill the places and the queue", async {
        loop {
            let waiting = h.metric(WAITING, &label).await;
            let refused = h.metric(REFUSED, &label).await;
            if api.arrivals(kind) == limit && waiting == queue as f64 && refused == beyond as f64 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(h.metric(IN_FLIGHT, &label).await, limit as f64);
    // The refused requests have their answer while the others still wait.
    within("the refused requests' answers", async {
        while requests.iter().filter(|r| r.is_finished()).count() < beyond {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut answered = Vec::new();
    let mut pending = Vec::new();
    for request in requests {
        if request.is_finished() {
            answered.push(request.await.unwrap());
        } else {
            pending.push(request);
        }
    }
    assert_eq!(answered, vec![refused_status; beyond]);

    gate.release();
    for request in pending {
        let status = within("a waiting request", request).await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(api.arrivals(kind), limit + queue);
    assert_eq!(h.metric(IN_FLIGHT, &label).await, 0.0);
    assert_eq!(h.metric(WAITING, &label).await, 0.0);
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::TokenReview => "TokenReview",
        Kind::SubjectAccessReview => "SubjectAccessReview",
    }
}

#[tokio::test]
async fn token_reviews_in_flight_are_bounded_and_the_rest_fail_closed() {
    let api = ApiServer::start().await;
    // Service-account tokens the node verifies: their reviews are not held to a source's budget
    // of failed authentications (failure_budget.rs), so one client can fill the places.
    let tokens: Vec<String> = (0..TOKENS.flood())
        .map(|i| {
            let token = api.sign_token(&service_account_claims("flood", &format!("sa-{i}")), None);
            api.add_token(&token, TokenUser::new(&format!("user-{i}")));
            token
        })
        .collect();
    api.add_token("tok-late", TokenUser::new("late"));
    let h = proxy(&api, "--authorization-mode=AlwaysAllow", TOKENS).await;
    h.wait_for_issuer_keys().await;
    flood(&h, &api, Kind::TokenReview, TOKENS, &|i| {
        Some(tokens[i].clone())
    })
    .await;
    // Afterwards a new token is reviewed and served as usual.
    assert_eq!(get(&h.anonymous(), Some("tok-late")).await, StatusCode::OK);
}

#[tokio::test]
async fn access_reviews_in_flight_are_bounded_and_the_rest_fail_closed() {
    let api = ApiServer::start_allowing().await;
    let h = proxy(&api, "--authorization-mode=Webhook", ACCESS).await;
    flood(&h, &api, Kind::SubjectAccessReview, ACCESS, &|_| None).await;
    assert_eq!(get(&h.user("late", &[]), None).await, StatusCode::OK);
}
