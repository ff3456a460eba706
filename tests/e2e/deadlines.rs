//! Every phase of a client connection has a deadline, so no client can hold a connection slot by
//! saying nothing: after TLS, the first request must arrive within `--header-read-timeout`
//! whatever the protocol (nothing at all, part of the HTTP/2 preface, the preface and SETTINGS);
//! after a response, an idle HTTP/1.1 or HTTP/2 connection is closed after
//! `--idle-connection-timeout`; an upgraded exec session passing no data is closed after
//! `--streaming-connection-idle-timeout`. Upgraded sessions count under `--max-connections` and in
//! the connection gauge. Streams that do pass data are never cut.
//!
//! Timeouts here are short (1–2 s) so the scenarios run fast; the assertions are about what the
//! client sees (the connection closed, the request served), each bounded by `within`.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::support::client::{ANY_TLS, Client, HTTP1_ONLY, Identity};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::pki::{CertSpec, Issued};
use crate::support::raw::{connect, exchange, read_to_close, statuses, tls_config};
use crate::support::streams::{EXEC_PROTOCOL, ExecSession, FollowedLog};
use crate::support::{eventually, within};

const TIMEOUTS: &str = "kubelet_auth_proxy_connection_timeouts_total";
const CONNECTIONS: &str = "kubelet_auth_proxy_connections_open";
const STREAMS: &str = "kubelet_auth_proxy_upgraded_streams_open";

/// The HTTP/2 connection preface a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const H2_EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

async fn proxy(extra: &[&str]) -> (Harness, Issued) {
    let h = ProxySpec::always_allow(&["--header-read-timeout=1s", "--idle-connection-timeout=2s"])
        .args(extra)
        .start()
        .await;
    let alice = h.ca.issue(&CertSpec::client("alice").org("devs"));
    (h, alice)
}

/// Completes TLS offering `alpn`, sends `bytes`, and returns once the proxy has closed the
/// connection (panics if it does not within the step bound).
async fn closed_after_sending(h: &Harness, alice: &Issued, alpn: &[&[u8]], bytes: &[u8]) {
    let mut tls = connect(h.addr(), tls_config(h.ca.cert(), Some(alice), alpn))
        .await
        .unwrap();
    if !bytes.is_empty() {
        tls.write_all(bytes).await.unwrap();
        tls.flush().await.unwrap();
    }
    within(
        "the proxy to close a connection that sent no request",
        read_to_close(&mut tls),
    )
    .await;
}

/// What a client sends before falling silent: a name, the ALPN protocols offered, the bytes.
type SilentCase<'a> = (&'a str, &'a [&'a [u8]], Vec<u8>);

#[tokio::test]
async fn a_connection_without_a_first_request_is_closed_whatever_it_sent() {
    let (h, alice) = proxy(&[]).await;
    let h2: &[&[u8]] = &[b"h2"];
    let cases: [SilentCase; 5] = [
        ("nothing, ALPN h2", h2, Vec::new()),
        ("nothing, ALPN http/1.1", HTTP1_ONLY, Vec::new()),
        ("nothing, no ALPN", &[], Vec::new()),
        ("half the HTTP/2 preface", h2, H2_PREFACE[..12].to_vec()),
        (
            "the HTTP/2 preface and SETTINGS",
            h2,
            [H2_PREFACE, H2_EMPTY_SETTINGS].concat(),
        ),
    ];
    for (what, alpn, bytes) in &cases {
        let before = h.metric(TIMEOUTS, &[]).await;
        closed_after_sending(&h, &alice, alpn, bytes).await;
        eventually(what, || async {
            (h.metric(TIMEOUTS, &[]).await > before).then_some(())
        })
        .await;
    }
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn idle_http1_and_http2_connections_are_closed_after_the_idle_timeout() {
    let (h, alice) = proxy(&[]).await;
    let before = h.metric(TIMEOUTS, &[]).await;

    // HTTP/1.1 keep-alive: the response, then the proxy closes (hyper's header timer, which
    // runs from the end of a response, closes it at --header-read-timeout already).
    let config = tls_config(h.ca.cert(), Some(&alice), HTTP1_ONLY);
    let mut tls = connect(h.addr(), config).await.unwrap();
    let received = exchange(&mut tls, b"GET /pods HTTP/1.1\r\nHost: node\r\n\r\n").await;
    assert_eq!(statuses(&received), [200]);

    // HTTP/2: one request answered, then the connection ends (GOAWAY and close).
    let tls = connect(h.addr(), tls_config(h.ca.cert(), Some(&alice), &[b"h2"]))
        .await
        .unwrap();
    let (sender, connection) = within("h2 handshake", h2::client::handshake(tls))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let request = Request::get("https://node/pods").body(()).unwrap();
    let (response, _) = within("h2 ready", sender.ready())
        .await
        .unwrap()
        .send_request(request, true)
        .unwrap();
    let mut response = within("the h2 response", response).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.body_mut();
    while let Some(chunk) = within("the h2 body", body.data()).await {
        let chunk: Bytes = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let ended = within("the proxy to close the idle HTTP/2 connection", connection).await;
    assert!(ended.is_ok(), "the connection task ended: {ended:?}");
    // Counted as the proxy drops the connection, which the client may see first.
    eventually("the HTTP/2 idle close counted", || async {
        (h.metric(TIMEOUTS, &[]).await == before + 1.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn silent_sockets_cannot_lock_out_other_clients() {
    let (h, alice) = proxy(&["--max-connections=3"]).await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        let config = tls_config(h.ca.cert(), Some(&alice), &[b"h2", b"http/1.1"]);
        silent.push(connect(h.addr(), config).await.unwrap());
    }
    // Every slot is taken by a client that says nothing; the next one is served once their
    // first-request deadline has passed.
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK);
    for mut socket in silent {
        within("the silent socket to be closed", read_to_close(&mut socket)).await;
    }
}

#[tokio::test]
async fn a_response_that_streams_outlives_the_idle_timeout() {
    let (h, _) = proxy(&[]).await;
    const H2_ONLY: &[&[u8]] = &[b"h2"];
    for alpn in [HTTP1_ONLY, H2_ONLY] {
        let issued = h.ca.issue(&CertSpec::client("carol"));
        let client =
            Client::configured(h.ca.cert(), h.addr(), Identity::of(&issued), alpn, ANY_TLS);
        let mut log = FollowedLog::open(&client).await;
        // One line every 50 ms: 80 lines take 4 s, twice the idle timeout.
        let lines = log.lines(80).await;
        assert_eq!(lines.len(), 80);
    }
}

#[tokio::test]
async fn upgraded_sessions_hold_a_connection_slot_and_show_in_the_gauges() {
    let (h, _) = proxy(&["--max-connections=2"]).await;
    let exec_client = h.http1_user("dave");
    let mut first = ExecSession::open(&exec_client, EXEC_PROTOCOL).await;
    let second = ExecSession::open(&exec_client, EXEC_PROTOCOL).await;
    assert_eq!(h.metric(CONNECTIONS, &[]).await, 2.0);
    assert_eq!(h.metric(STREAMS, &[]).await, 2.0);
    assert_eq!(
        h.metric("kubelet_auth_proxy_connections_limit", &[]).await,
        2.0,
        "the cap in force, for an alert on how near it the proxy is"
    );

    // Both slots are held by the sessions: a third client waits in the listen queue...
    let waiting = tokio::spawn({
        let client = h.user("erin", &[]);
        async move { client.get("/pods").await.status }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "served beyond --max-connections");
    // ...until one session ends.
    second.close().await;
    assert_eq!(
        within("the waiting client", waiting).await.unwrap(),
        StatusCode::OK
    );
    first.echo(b"still here").await;
    first.close().await;
    eventually("the gauges back to zero", || async {
        let open = h.metric(CONNECTIONS, &[]).await + h.metric(STREAMS, &[]).await;
        (open == 0.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_exec_session_is_closed_after_the_streaming_idle_timeout_only_when_silent() {
    let (h, _) = proxy(&["--streaming-connection-idle-timeout=1s"]).await;
    let client = h.http1_user("frank");
    let mut session = ExecSession::open(&client, EXEC_PROTOCOL).await;
    // Talking every 300 ms for 3 s keeps the session open past three idle timeouts.
    for _ in 0..10 {
        session.echo(b"ping").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Silent: the proxy closes it.
    session.closed().await;
    eventually("the session no longer counted", || async {
        (h.metric(STREAMS, &[]).await == 0.0).then_some(())
    })
    .await;
}
