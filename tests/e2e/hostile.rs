//! Hostile clients against the real proxy over TLS: forged identity headers, request smuggling,
//! oversized and trickled headers, connection and stream floods, wrong or absent TLS, and client
//! certificate chains built to exhaust verification. The proxy refuses them and keeps serving.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::client::{Identity, empty, request};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::pki::{CertSpec, Issued};
use crate::support::raw::{connect, exchange, read_to_close, statuses, tls_config};
use crate::support::{eventually, within};

const HANDSHAKE_FAILURES: &str = "kubelet_auth_proxy_tls_handshake_failures_total";

async fn allow_all() -> (Harness, Issued) {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = h.ca.issue(&CertSpec::client("alice").org("devs"));
    (h, alice)
}

/// Sends `bytes` as alice over HTTP/1.1 and returns everything the proxy answered.
async fn raw_http1(h: &Harness, alice: &Issued, bytes: &[u8]) -> String {
    let config = tls_config(h.ca.cert(), Some(alice), &[b"http/1.1"]);
    let mut tls = connect(h.addr(), config).await.unwrap();
    String::from_utf8_lossy(&exchange(&mut tls, bytes).await).into_owned()
}

/// The proxy still authenticates and forwards for a well-behaved client.
async fn still_serving(h: &Harness) {
    let reply = h.user("bob", &[]).get("/pods").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn spoofed_identity_headers_never_reach_the_kubelet() {
    for forward in [false, true] {
        spoofed_identity_headers_over_http1(forward).await;
    }
    spoofed_identity_headers_over_http2().await;
}

/// Forged identity headers in every spelling, also named in `Connection` (which must not make
/// the proxy drop the identity it sets itself), as alice and as an anonymous caller.
async fn spoofed_identity_headers_over_http1(forward: bool) {
    let h = ProxySpec::always_allow(&[
        "--anonymous-auth=true",
        &format!("--forward-identity-headers={forward}"),
    ])
    .start()
    .await;
    let alice = h.ca.issue(&CertSpec::client("alice").org("devs"));
    let forged = "X-Remote-User: root\r\n\
                  x-remote-user: root2\r\n\
                  X-rEmOtE-gRoUp: system:masters\r\n\
                  X-Remote-Group: system:masters\r\n\
                  X-Remote-Uid: forged-uid\r\n\
                  X-Remote-Extra-Scopes: forged-scope\r\n\
                  Impersonate-User: root\r\n\
                  IMPERSONATE-GROUP: system:masters\r\n\
                  Impersonate-Uid: forged-uid\r\n\
                  Impersonate-Extra-Scopes: forged-scope\r\n";
    for connection in [
        "close",
        "close, X-Remote-User, X-Remote-Group, Impersonate-User",
    ] {
        let bytes = format!(
            "GET /configz HTTP/1.1\r\nHost: node\r\n{forged}Connection: {connection}\r\n\r\n"
        );
        for (who, identity) in [("alice", Some(&alice)), ("system:anonymous", None)] {
            let config = tls_config(h.ca.cert(), identity, &[b"http/1.1"]);
            let mut tls = connect(h.addr(), config).await.unwrap();
            let answer =
                String::from_utf8_lossy(&exchange(&mut tls, bytes.as_bytes()).await).into_owned();
            let case = format!("{who}, Connection: {connection}, forwarding {forward}");
            assert_eq!(statuses(answer.as_bytes()), [200], "{case}: {answer}");
            let echoed = answer.to_ascii_lowercase();
            for forged in ["root", "system:masters", "forged", "impersonate"] {
                assert!(
                    !echoed.contains(forged),
                    "{case}: {forged} reached the kubelet: {answer}"
                );
            }
            assert_eq!(
                answer.contains(&format!("\"x-remote-user\":[\"{who}\"]")),
                forward,
                "{case}: the real identity is wrong: {answer}"
            );
            if !forward {
                assert!(!echoed.contains("x-remote-"), "{case}: {answer}");
            }
        }
    }
}

async fn spoofed_identity_headers_over_http2() {
    let h = ProxySpec::always_allow(&["--forward-identity-headers=true"])
        .start()
        .await;
    let alice = h.ca.issue(&CertSpec::client("alice").org("devs"));
    // Header names are lower case in HTTP/2, and `Connection` is not allowed.
    let mut req = request("GET", "/configz");
    for (name, value) in [
        ("x-remote-user", "root"),
        ("x-remote-group", "system:masters"),
        ("impersonate-user", "root"),
        ("impersonate-group", "system:masters"),
    ] {
        req = req.header(name, value);
    }
    let reply = h
        .client(Identity::of(&alice))
        .send(req.body(empty()).unwrap())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let identity = reply.echo().identity();
    assert_eq!(identity.user, ["alice"]);
    assert_eq!(identity.groups, ["devs", "system:authenticated"]);
    assert!(
        !reply
            .echo()
            .header_names()
            .iter()
            .any(|name| name.starts_with("impersonate-")),
        "{:?}",
        reply.echo().header_names()
    );
}

#[tokio::test]
async fn request_smuggling_forms_are_refused_and_never_forwarded() {
    let (h, alice) = allow_all().await;
    let smuggled = "GET /exec/ns/pod/smuggled HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n";
    let cases = [
        (
            "duplicate Content-Length",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nContent-Length: 0\r\n\
                 Content-Length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            ),
        ),
        (
            "Content-Length list",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nContent-Length: 0, {}\r\n\r\n\
                 {smuggled}",
                smuggled.len()
            ),
        ),
        (
            "obs-fold",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nX-Folded: a\r\n \
                 Content-Length: {}\r\nContent-Length: 0\r\n\r\n{smuggled}",
                smuggled.len()
            ),
        ),
        (
            "obs-fold of Transfer-Encoding",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nTransfer-Encoding:\r\n chunked\r\n\
                 Content-Length: 0\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "Transfer-Encoding not ending in chunked",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked, \
                 identity\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "space before colon",
            format!(
                "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nTransfer-Encoding : chunked\r\n\
                 \r\n0\r\n\r\n{smuggled}"
            ),
        ),
    ];
    for (name, bytes) in &cases {
        let answer = raw_http1(&h, &alice, bytes.as_bytes()).await;
        assert_eq!(statuses(answer.as_bytes()), [400], "{name}: {answer}");
        assert!(!answer.contains("smuggled"), "{name}: {answer}");
    }
    still_serving(&h).await;
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_never_forwarded_ambiguous() {
    let (h, alice) = allow_all().await;
    let smuggled = "GET /exec/ns/pod/smuggled HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n";
    let bytes = format!(
        "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nContent-Length: {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        smuggled.len() + 5
    );
    let answer = raw_http1(&h, &alice, bytes.as_bytes()).await;
    let lower = answer.to_ascii_lowercase();
    // Whatever the status, the kubelet saw one framing only and the connection was not reused
    // for the bytes a Content-Length reader would have taken as body.
    assert!(!answer.contains("smuggled"), "{answer}");
    assert!(
        !(lower.contains("\"content-length\"") && lower.contains("\"transfer-encoding\"")),
        "forwarded with both framings: {answer}"
    );
    assert!(statuses(answer.as_bytes()).len() <= 1, "{answer}");
}

#[tokio::test]
async fn bad_chunk_sizes_are_refused_without_a_forwarded_body() {
    let (h, alice) = allow_all().await;
    for chunk in [
        "zz\r\nabc\r\n",
        "-1\r\nabc\r\n",
        "fffffffffffffffffff\r\nabc\r\n",
        "3 x\r\n",
    ] {
        let bytes = format!(
            "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n{chunk}"
        );
        let answer = raw_http1(&h, &alice, bytes.as_bytes()).await;
        let codes = statuses(answer.as_bytes());
        assert!(
            codes.iter().all(|code| *code == 400 || *code == 502),
            "{chunk:?}: {answer}"
        );
        assert!(!answer.contains("\"bodyBytes\""), "{chunk:?}: {answer}");
    }
    still_serving(&h).await;
}

#[tokio::test]
async fn bad_chunk_sizes_are_400() {
    let (h, alice) = allow_all().await;
    let bytes = "POST /run/ns/pod/ctr HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\
                 Connection: close\r\n\r\nzz\r\nabc\r\n";
    let answer = raw_http1(&h, &alice, bytes.as_bytes()).await;
    assert_eq!(statuses(answer.as_bytes()), [400], "{answer}");
}

#[tokio::test]
async fn oversized_headers_are_431() {
    let (h, alice) = allow_all().await;
    let big = format!(
        "GET /pods HTTP/1.1\r\nHost: node\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(512 * 1024)
    );
    let answer = raw_http1(&h, &alice, big.as_bytes()).await;
    assert_eq!(statuses(answer.as_bytes()), [431], "{:.200}", answer);

    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET /pods HTTP/1.1\r\nHost: node\r\n{many}Connection: close\r\n\r\n");
    let answer = raw_http1(&h, &alice, many.as_bytes()).await;
    assert_eq!(statuses(answer.as_bytes()), [431], "{answer}");
    still_serving(&h).await;
}

#[tokio::test]
async fn slowloris_is_cut_off_while_others_are_served() {
    let h = ProxySpec::always_allow(&["--header-read-timeout=1s"])
        .start()
        .await;
    let alice = h.ca.issue(&CertSpec::client("alice"));
    let config = tls_config(h.ca.cert(), Some(&alice), &[b"http/1.1"]);
    let tls = connect(h.addr(), config).await.unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let closed = tokio::spawn(async move { read_to_close(&mut reader).await });
    writer
        .write_all(b"GET /pods HTTP/1.1\r\nHost: node\r\n")
        .await
        .unwrap();
    // Trickle one header line every 250 ms, for up to 60 lines (15 s): far past the 1 s limit.
    let mut cut_off = false;
    for i in 0..60 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if closed.is_finished() {
            cut_off = true;
            break;
        }
        if writer
            .write_all(format!("X-Slow-{i}: x\r\n").as_bytes())
            .await
            .is_err()
            || writer.flush().await.is_err()
        {
            cut_off = true;
            break;
        }
        // Meanwhile another client is served.
        if i % 8 == 0 {
            still_serving(&h).await;
        }
    }
    assert!(
        cut_off,
        "the trickling client was still connected after 15 s"
    );
    let answer = within("the slow connection to close", closed)
        .await
        .unwrap();
    let codes = statuses(&answer);
    assert!(
        codes.is_empty() || codes == [408],
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    still_serving(&h).await;
}

#[tokio::test]
async fn max_connections_holds_and_a_waiting_client_is_served_after_one_closes() {
    let h = ProxySpec::always_allow(&["--max-connections=2"])
        .start()
        .await;
    let client = h.user("alice", &[]);
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut conn = client.connect().await.unwrap();
        let response = conn
            .send(request("GET", "/pods").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        open.push(conn);
    }
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.get("/pods").await })
    };
    // The third client's handshake cannot complete while two connections hold both slots.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a third connection was served");
    assert_eq!(
        h.metric("kubelet_auth_proxy_connections_open", &[]).await,
        2.0
    );
    drop(open.pop());
    let reply = within("the waiting client to be served", waiting)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
}

/// Opens an HTTP/2 connection as `identity` with the `h2` crate, which lets a test send what
/// hyper's client would refuse.
async fn h2_connection(h: &Harness, identity: &Issued) -> h2::client::SendRequest<Bytes> {
    let tls = connect(h.addr(), tls_config(h.ca.cert(), Some(identity), &[b"h2"]))
        .await
        .unwrap();
    let (sender, connection) = within("h2 handshake", h2::client::handshake(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends one request over HTTP/2 and returns its status, or `None` when the stream or the
/// connection was reset (refused before any answer).
async fn h2_status(
    sender: &mut h2::client::SendRequest<Bytes>,
    request: Request<()>,
) -> Option<StatusCode> {
    within("an h2 exchange", async {
        let mut ready = sender.clone().ready().await.ok()?;
        let (response, _) = ready.send_request(request, true).ok()?;
        *sender = ready;
        Some(response.await.ok()?.status())
    })
    .await
}

#[tokio::test]
async fn http2_path_oddities_are_refused() {
    let (h, alice) = allow_all().await;
    let mut sender = h2_connection(&h, &alice).await;
    let odd = |method: Method, path_and_query: &str| {
        if path_and_query.starts_with('/') {
            let uri = Uri::builder()
                .scheme("https")
                .authority(h.addr().to_string())
                .path_and_query(path_and_query)
                .build()
                .unwrap();
            return Request::builder().method(method).uri(uri).body(()).unwrap();
        }
        // A bare `*` is the one target without `/` that `http` lets h2 send (with the `:scheme`
        // h2 fills in and no `:authority`); relative paths cannot be built.
        Request::builder()
            .method(method)
            .version(http::Version::HTTP_11)
            .uri(Uri::from_static("*"))
            .body(())
            .unwrap()
    };
    let cases = [
        ("asterisk", odd(Method::OPTIONS, "*")),
        ("asterisk GET", odd(Method::GET, "*")),
        (
            "dot segments",
            odd(Method::GET, "/stats/../exec/ns/pod/ctr"),
        ),
        (
            "encoded slash",
            odd(Method::GET, "/stats%2f..%2fexec/ns/pod/ctr"),
        ),
        ("double slash", odd(Method::GET, "//exec/ns/pod/ctr")),
    ];
    for (name, request) in cases {
        if let Some(status) = h2_status(&mut sender, request).await {
            assert!(
                [301, 400, 401, 403].contains(&status.as_u16()),
                "{name}: {status}"
            );
        }
        // A refused stream may take the connection with it; the next case gets a fresh one.
        if sender.clone().ready().await.is_err() {
            sender = h2_connection(&h, &alice).await;
        }
    }
    let status = h2_status(&mut sender, odd(Method::GET, "/pods")).await;
    assert_eq!(status, Some(StatusCode::OK));
}

#[tokio::test]
async fn absolute_form_targets_never_reach_an_unauthorized_route() {
    // Alice may read stats only; an absolute-form target must be judged by its path.
    let policy = crate::support::harness::grant(
        "stats-reader",
        &["nodes/stats"],
        &["get"],
        &[crate::support::harness::Subject::User("alice")],
    );
    let h = ProxySpec::new(&["--authorization-mode=Policy"])
        .policy(&policy)
        .start()
        .await;
    let alice = h.ca.issue(&CertSpec::client("alice"));
    let summary = raw_http1(
        &h,
        &alice,
        b"GET https://node/stats/summary HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n",
    )
    .await;
    let codes = statuses(summary.as_bytes());
    assert!(codes == [200] || codes == [400], "{summary}");
    for target in [
        "https://node/exec/ns/pod/ctr?command=id",
        "https://node/stats/../exec/ns/pod/ctr",
        "https://node/stats/%2e%2e/exec/ns/pod/ctr",
        "https://node//exec/ns/pod/ctr",
        "https://evil/exec/ns/pod/ctr",
        "https://node@evil/exec/ns/pod/ctr",
        "http://node/exec/ns/pod/ctr",
        "//node/exec/ns/pod/ctr",
        "exec/ns/pod/ctr",
        "*",
    ] {
        let bytes = format!("GET {target} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
        let answer = raw_http1(&h, &alice, bytes.as_bytes()).await;
        let codes = statuses(answer.as_bytes());
        assert!(
            codes.len() == 1 && [301, 400, 401, 403].contains(&codes[0]),
            "{target}: {answer}"
        );
        if codes == [301] {
            let location = answer
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("location: ")
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            assert!(
                location.starts_with('/') && !location.starts_with("//"),
                "{target}: redirect off the host: {answer}"
            );
        }
    }
    still_serving_policy(&h, &alice).await;
}

async fn still_serving_policy(h: &Harness, alice: &Issued) {
    let reply = h.client(Identity::of(alice)).get("/stats/summary").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn http2_rapid_reset_and_stream_floods_are_bounded() {
    let (h, alice) = allow_all().await;
    let mut sender = h2_connection(&h, &alice).await;
    // Rapid reset: open a stream and cancel it at once, thousands of times.
    let mut refused = false;
    for _ in 0..5_000 {
        let request = Request::get(format!("https://{}/pods", h.addr()))
            .body(())
            .unwrap();
        let Ok(mut ready) = within("h2 ready", sender.clone().ready()).await else {
            refused = true;
            break;
        };
        match ready.send_request(request, true) {
            Ok((response, _)) => drop(response),
            Err(_) => {
                refused = true;
                break;
            }
        }
        sender = ready;
    }
    // Either the proxy closed the connection (refused) or it still answers on it.
    if !refused {
        let status = h2_status(
            &mut sender,
            Request::get(format!("https://{}/pods", h.addr()))
                .body(())
                .unwrap(),
        )
        .await;
        assert!(matches!(status, None | Some(StatusCode::OK)), "{status:?}");
    }
    still_serving(&h).await;

    // Stream flood: many concurrent streams on one connection; they are served or refused,
    // and other clients keep being served meanwhile.
    let sender = h2_connection(&h, &alice).await;
    let mut streams = Vec::new();
    for _ in 0..1_000 {
        let mut sender = sender.clone();
        let uri = format!("https://{}/pods", h.addr());
        streams.push(tokio::spawn(async move {
            let request = Request::get(uri).body(()).unwrap();
            h2_status(&mut sender, request).await
        }));
    }
    still_serving(&h).await;
    for stream in streams {
        let status = within("a flooded stream", stream).await.unwrap();
        assert!(matches!(status, None | Some(StatusCode::OK)), "{status:?}");
    }
    still_serving(&h).await;
}

/// A TLS 1.0 (or 1.1, by `version`) ClientHello offering one RSA suite and no extensions.
fn legacy_client_hello(version: u8) -> Vec<u8> {
    let mut body = vec![0x03, version];
    body.extend_from_slice(&[0x42; 32]);
    body.push(0); // no session id
    body.extend_from_slice(&[0x00, 0x04, 0x00, 0x2f, 0x00, 0x35]);
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0x00, 0x00, u8::try_from(body.len()).unwrap()];
    handshake.extend_from_slice(&body);
    let mut record = vec![
        0x16,
        0x03,
        version,
        0x00,
        u8::try_from(handshake.len()).unwrap(),
    ];
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn old_tls_plain_http_and_garbage_are_refused_without_harm() {
    let (h, _) = allow_all().await;
    let cases: [(&str, Vec<u8>); 4] = [
        ("TLS 1.0 ClientHello", legacy_client_hello(0x01)),
        ("TLS 1.1 ClientHello", legacy_client_hello(0x02)),
        (
            "plain HTTP",
            b"GET /pods HTTP/1.1\r\nHost: node\r\n\r\n".to_vec(),
        ),
        (
            "garbage",
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
    ];
    for (i, (name, bytes)) in cases.iter().enumerate() {
        let before = h.metric(HANDSHAKE_FAILURES, &[]).await;
        let mut tcp = TcpStream::connect(h.addr()).await.unwrap();
        let answer = exchange(&mut tcp, bytes).await;
        // Nothing but (at most) a TLS alert record comes back: never an HTTP answer.
        assert!(
            answer.is_empty() || answer[0] == 0x15,
            "{name}: {:?}",
            String::from_utf8_lossy(&answer)
        );
        eventually(&format!("{name} counted as a failed handshake"), || async {
            (h.metric(HANDSHAKE_FAILURES, &[]).await > before).then_some(())
        })
        .await;
        assert!(h.metric(HANDSHAKE_FAILURES, &[]).await >= (i + 1) as f64);
        still_serving(&h).await;
    }
}

#[tokio::test]
async fn too_deep_or_too_large_client_chains_are_refused() {
    let (h, _) = allow_all().await;
    // Ten intermediates between the trusted root and the leaf.
    let mut authority = h.ca.intermediate("intermediate 0");
    for i in 1..10 {
        authority = authority.intermediate(&format!("intermediate {i}"));
    }
    let deep = authority.issue(&CertSpec::client("deep"));
    assert_eq!(deep.chain.len(), 11);
    refused_chain(&h, Identity::of(&deep), "ten intermediates").await;

    // A chain over the TLS handshake message limit: the leaf repeated until it passes 64 KiB.
    let alice = h.ca.issue(&CertSpec::client("alice"));
    let Identity::Chain { chain, key } = Identity::of(&alice) else {
        unreachable!("Identity::of always has a chain");
    };
    let copies = 70 * 1024 / chain[0].len() + 1;
    let large = Identity::Chain {
        chain: std::iter::repeat_n(chain[0].clone(), copies).collect(),
        key,
    };
    let before = h.metric(HANDSHAKE_FAILURES, &[]).await;
    refused_chain(&h, large, "a chain over 64 KiB").await;
    // It is the proxy that gave up on it, at the handshake.
    eventually(
        "the oversized chain counted as a failed handshake",
        || async { (h.metric(HANDSHAKE_FAILURES, &[]).await > before).then_some(()) },
    )
    .await;
    still_serving(&h).await;
}

/// The chain is refused: a failed handshake, or a 401; never served, and never a hang (every
/// step is bounded).
async fn refused_chain(h: &Harness, identity: Identity, name: &str) {
    let client = h.http1_client(identity);
    let sent = client
        .try_send(request("GET", "/pods").body(empty()).unwrap())
        .await;
    if let Ok(reply) = sent {
        assert_eq!(
            reply.status,
            StatusCode::UNAUTHORIZED,
            "{name}: {}",
            reply.text()
        );
    }
}
