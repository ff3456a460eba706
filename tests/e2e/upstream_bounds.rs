//! Requests in flight to the kubelet are bounded, in all and per user: a caller with a read
//! permission that opens HTTP/2 streams and never reads their answers (a zero flow-control
//! window) holds at most its user's share of upstream connections; beyond it, its requests get
//! 429 at once, and other users are still served. When every place is taken, a request waits
//! `--upstream-connect-timeout` and gets 503. Places come back when the streams go.

use bytes::Bytes;
use http::{Request, StatusCode};

use crate::support::assert_contains;
use crate::support::client::Client;
use crate::support::harness::{Harness, ProxySpec};
use crate::support::pki::{CertSpec, Issued};
use crate::support::raw::{connect, tls_config};
use crate::support::{eventually, within};

const IN_FLIGHT: &str = "kubelet_auth_proxy_upstream_requests_in_flight";
const PER_USER: usize = 4;
const TOTAL: usize = 8;

async fn proxy() -> Harness {
    ProxySpec::always_allow(&[
        "--upstream-max-requests-inflight=8",
        "--upstream-max-requests-inflight-per-user=4",
        "--upstream-connect-timeout=1s",
    ])
    .start()
    .await
}

/// An HTTP/2 connection as `identity` that never opens its flow-control window: the proxy can
/// send response headers, never a byte of a body.
async fn stalled_reader(h: &Harness, identity: &Issued) -> h2::client::SendRequest<Bytes> {
    let tls = connect(h.addr(), tls_config(h.ca.cert(), Some(identity), &[b"h2"]))
        .await
        .unwrap();
    let (sender, connection) = within(
        "h2 handshake",
        h2::client::Builder::new()
            .initial_window_size(0)
            .handshake(tls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    sender
}

/// Opens `n` `GET /metrics` streams on `sender` and returns their statuses, in order; the
/// response bodies are left unread (and the streams open) by keeping the responses in `kept`.
async fn open_streams(
    sender: &mut h2::client::SendRequest<Bytes>,
    n: usize,
    kept: &mut Vec<http::Response<h2::RecvStream>>,
) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let request = Request::get("https://node/metrics").body(()).unwrap();
        let mut ready = within("h2 ready", sender.clone().ready()).await.unwrap();
        let (response, _) = ready.send_request(request, true).unwrap();
        *sender = ready;
        let response = within("the response headers", response).await.unwrap();
        statuses.push(response.status());
        kept.push(response);
    }
    statuses
}

fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[tokio::test]
async fn one_user_holds_at_most_its_share_and_others_are_served() {
    let h = proxy().await;
    let mallory = h.ca.issue(&CertSpec::client("mallory"));
    let mut kept = Vec::new();
    let mut first = stalled_reader(&h, &mallory).await;
    let statuses = open_streams(&mut first, 10, &mut kept).await;
    assert_eq!(count(&statuses, StatusCode::OK), PER_USER, "{statuses:?}");
    assert_eq!(
        count(&statuses, StatusCode::TOO_MANY_REQUESTS),
        10 - PER_USER,
        "{statuses:?}"
    );
    let throttled = kept
        .iter()
        .find(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
        .unwrap();
    assert_eq!(throttled.headers()["retry-after"], "1");
    // Another connection of the same user gets nothing more.
    let mut second = stalled_reader(&h, &mallory).await;
    let statuses = open_streams(&mut second, 3, &mut kept).await;
    assert_eq!(statuses, vec![StatusCode::TOO_MANY_REQUESTS; 3]);
    assert_eq!(h.metric(IN_FLIGHT, &[]).await, PER_USER as f64);

    // Everyone else is served.
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK);

    // The streams go, and so do their places.
    drop(kept);
    drop((first, second));
    eventually("mallory's places given back", || async {
        (h.metric(IN_FLIGHT, &[]).await == 0.0).then_some(())
    })
    .await;
    let reply = h.user("mallory", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn with_every_place_taken_a_request_waits_then_gets_503() {
    let h = proxy().await;
    let mut kept = Vec::new();
    let mut senders = Vec::new();
    for name in ["mallory", "eve"] {
        let identity = h.ca.issue(&CertSpec::client(name));
        let mut sender = stalled_reader(&h, &identity).await;
        let statuses = open_streams(&mut sender, PER_USER, &mut kept).await;
        assert_eq!(statuses, vec![StatusCode::OK; PER_USER]);
        senders.push(sender);
    }
    assert_eq!(h.metric(IN_FLIGHT, &[]).await, TOTAL as f64);
    let carol = h.user("carol", &[]);
    let reply = carol.get("/pods").await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_contains(&reply.text(), "--upstream-max-requests-inflight=8");
    assert_eq!(reply.header("retry-after"), Some("1"));
    drop(kept);
    drop(senders);
    let served = poll_until_served(&carol).await;
    assert_eq!(served, StatusCode::OK);
}

/// Asks until the places have come back (bounded).
async fn poll_until_served(client: &Client) -> StatusCode {
    eventually("a place for carol", || async {
        let status = client.get("/pods").await.status;
        (status == StatusCode::OK).then_some(status)
    })
    .await
}
