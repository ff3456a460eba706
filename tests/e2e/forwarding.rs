//! Forwarding to the kubelet: the three upstream kinds, header hygiene (client-supplied identity
//! and hop-by-hop headers never reach the kubelet), streaming in both directions, and an
//! unreachable kubelet answered with 502 without harming the proxy.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;

use kubelet_auth_proxy::tools::demo::kubelet::StandInKubelet;

use crate::support::client::{Identity, channel_body, empty, plain_send, request};
use crate::support::harness::{ProxySpec, Upstream};
use crate::support::pki::CertSpec;
use crate::support::within;

#[tokio::test]
async fn every_upstream_kind_is_reached() {
    for upstream in [
        Upstream::Https,
        Upstream::HttpsRequiringClientCert {
            proxy_has_cert: true,
        },
        Upstream::Http,
        Upstream::Unix,
    ] {
        let h = ProxySpec::always_allow(&[])
            .upstream(upstream)
            .start()
            .await;
        let alice = h.user("alice", &[]);
        let echo = alice.get("/echo?upstream=1").await.echo();
        assert_eq!(
            (echo.path(), echo.query()),
            ("/echo", "upstream=1"),
            "{upstream:?}"
        );
        let pods = alice.get("/pods").await;
        assert_eq!(pods.status, StatusCode::OK, "{upstream:?}");
        assert!(pods.text().contains("PodList"), "{upstream:?}");
    }
}

#[tokio::test]
async fn kubelet_requiring_a_client_certificate_refuses_a_proxy_without_one() {
    let h = ProxySpec::always_allow(&[])
        .upstream(Upstream::HttpsRequiringClientCert {
            proxy_has_cert: false,
        })
        .start()
        .await;
    let reply = h.user("alice", &[]).get("/echo").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
}

/// Headers a client must never get through to the kubelet, and one it may.
fn hostile_request() -> http::Request<crate::support::client::Body> {
    request("GET", "/echo")
        .header("authorization", "Bearer a-secret-token")
        .header("x-remote-user", "mallory")
        .header("x-remote-group", "system:masters")
        .header("x-remote-uid", "0")
        .header("x-remote-extra-scopes", "everything")
        .header("X-Remote-Extra-Foo%2Fbar", "x")
        .header("impersonate-user", "admin")
        .header("impersonate-group", "system:masters")
        .header("impersonate-uid", "0")
        .header("impersonate-extra-scopes", "everything")
        .header("connection", "x-hop-by-hop, keep-alive")
        .header("x-hop-by-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic bWFsbG9yeTpwdw==")
        .header("proxy-connection", "keep-alive")
        .header("te", "trailers")
        .header("trailer", "x-checksum")
        .header("x-kept", "yes")
        .body(empty())
        .unwrap()
}

const STRIPPED: &[&str] = &[
    "authorization",
    "x-remote-user",
    "x-remote-group",
    "x-remote-uid",
    "x-remote-extra-scopes",
    "x-remote-extra-foo%2fbar",
    "impersonate-user",
    "impersonate-group",
    "impersonate-uid",
    "impersonate-extra-scopes",
    "connection",
    "x-hop-by-hop",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
];

#[tokio::test]
async fn hostile_headers_do_reach_a_kubelet_without_the_proxy() {
    // The control for the next test: the client really sends every one of those headers.
    let kubelet = within("starting the stand-in kubelet", StandInKubelet::start(None))
        .await
        .unwrap();
    let echo = plain_send(kubelet.addr().unwrap(), hostile_request())
        .await
        .echo();
    for name in STRIPPED {
        assert!(
            !echo.header(name).is_empty(),
            "{name} was not sent: {:?}",
            echo.header_names()
        );
    }
}

#[tokio::test]
async fn client_identity_and_hop_by_hop_headers_never_reach_the_kubelet() {
    for forward_identity in [false, true] {
        let mut args = vec!["--authorization-mode=AlwaysAllow"];
        if forward_identity {
            args.push("--forward-identity-headers");
        }
        let h = ProxySpec::new(&args).start().await;
        let cert = h.ca.issue(&CertSpec::client("alice").org("ops"));
        // HTTP/1.1, where connection-specific headers can be sent at all.
        let alice = h.http1_client(Identity::of(&cert));
        let echo = alice.send(hostile_request()).await.echo();
        let names = echo.header_names();
        for stripped in STRIPPED {
            if forward_identity && ["x-remote-user", "x-remote-group"].contains(stripped) {
                continue; // set by the proxy; their values are checked below
            }
            assert!(
                !names.iter().any(|n| n == stripped),
                "{stripped} reached the kubelet: {names:?}"
            );
        }
        assert_eq!(echo.header("x-kept"), ["yes"]);
        let identity = echo.identity();
        if forward_identity {
            assert_eq!(identity.user, ["alice"]);
            assert_eq!(identity.groups, ["ops", "system:authenticated"]);
            assert!(identity.uid.is_empty());
            assert_eq!(
                identity.extra.keys().collect::<Vec<_>>(),
                ["authentication.kubernetes.io/credential-id"]
            );
        } else {
            assert!(
                !names.iter().any(|n| n.starts_with("x-remote-")),
                "identity headers without the flag: {names:?}"
            );
        }
    }
}

#[tokio::test]
async fn followed_logs_arrive_line_by_line() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = h.user("alice", &[]);
    // The stream never ends: reading three lines proves the proxy does not buffer it.
    let response = alice
        .open(
            request("GET", "/containerLogs/ns/pod/ctr?follow=true")
                .body(empty())
                .unwrap(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = String::new();
    while text.lines().count() < 3 || !text.ends_with('\n') {
        let frame = within("the next log line", body.frame())
            .await
            .expect("the log stream does not end")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
    let lines: Vec<&str> = text.lines().take(3).collect();
    assert_eq!(lines, ["line 1", "line 2", "line 3"]);
}

#[tokio::test]
async fn request_body_is_streamed_to_the_kubelet() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 64;
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = h.user("alice", &[]);
    let (tx, body) = channel_body();
    let feeder = tokio::spawn(async move {
        for i in 0..CHUNKS {
            if tx.send(Bytes::from(vec![i as u8; CHUNK])).await.is_err() {
                return;
            }
        }
    });
    let echo = alice
        .send(
            request("POST", "/run/ns/pod/ctr?cmd=cat")
                .body(body)
                .unwrap(),
        )
        .await
        .echo();
    within("the body feeder", feeder).await.unwrap();
    assert_eq!(echo.method(), "POST");
    assert_eq!(echo.body_bytes(), (CHUNK * CHUNKS) as u64);
}

#[tokio::test]
async fn unreachable_kubelet_is_502_and_the_proxy_recovers() {
    let mut h = ProxySpec::always_allow(&[])
        .upstream(Upstream::Unix)
        .start()
        .await;
    let alice = h.user("alice", &[]);
    assert_eq!(alice.get("/echo").await.status, StatusCode::OK);

    h.stop_kubelet().await;
    for _ in 0..3 {
        let reply = alice.get("/echo").await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
        assert!(reply.body.len() < 200, "a short body: {}", reply.text());
        assert!(
            !reply.text().contains(h.dir.path().to_str().unwrap()),
            "{}",
            reply.text()
        );
    }
    // Still serving: refusals and admin endpoints are unaffected.
    assert_eq!(
        h.anonymous().get("/echo").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(h.admin_get("/healthz").await.status, StatusCode::OK);

    h.restart_kubelet().await;
    let echo = alice.get("/echo?after=restart").await.echo();
    assert_eq!(echo.query(), "after=restart");
    h.shutdown().await;
}
