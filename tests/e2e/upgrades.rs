//! Upgrades through the proxy (exec, attach, portForward): WebSocket and SPDY/3.1 handshakes are
//! answered 101 by the kubelet, and bytes then flow both ways until one side closes.

use http::StatusCode;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::client::{empty, request};
use crate::support::harness::{ProxySpec, Upstream};
use crate::support::within;

/// RFC 6455's sample key and the accept value it must produce.
const WEBSOCKET_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const WEBSOCKET_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// How the caller saw the spliced connection end.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// A TLS close_notify, then EOF.
    Clean,
    /// The connection was dropped without close_notify.
    Truncated,
}

/// Upgrades through a proxy in front of `upstream`, exchanges bytes both ways, closes the caller's
/// side and reports how the connection then ended.
async fn splice(
    upstream: Upstream,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    protocol: &str,
) -> End {
    let h = ProxySpec::always_allow(&[])
        .upstream(upstream)
        .start()
        .await;
    let alice = h.http1_user("alice");
    let mut req = request(method, target)
        .header("connection", "Upgrade")
        .header("upgrade", protocol);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = alice.open(req.body(empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        response.headers().get("upgrade").unwrap().to_str().unwrap(),
        protocol
    );
    if protocol == "websocket" {
        assert_eq!(
            response.headers().get("sec-websocket-accept").unwrap(),
            WEBSOCKET_ACCEPT
        );
    }
    let upgraded = within("the upgrade", hyper::upgrade::on(response))
        .await
        .unwrap();
    let mut stream = TokioIo::new(upgraded);
    for message in [
        &b"hello kubelet"[..],
        &[0u8, 1, 2, 255][..],
        &[b'x'; 100_000][..],
    ] {
        within("writing", stream.write_all(message)).await.unwrap();
        let mut back = vec![0u8; message.len()];
        within("reading the echo", stream.read_exact(&mut back))
            .await
            .unwrap();
        assert_eq!(back, message);
    }
    // Closing our side ends the kubelet's echo, which closes its side: the splice ends.
    within("closing", stream.shutdown()).await.unwrap();
    let mut rest = Vec::new();
    let end = match within("the end of the splice", stream.read_to_end(&mut rest)).await {
        Ok(_) => End::Clean,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => End::Truncated,
        Err(e) => panic!("the splice ended with {e}"),
    };
    assert!(rest.is_empty(), "nothing after the echoes: {rest:?}");
    end
}

const WEBSOCKET_EXEC: &str = "/exec/ns/pod/ctr?command=sh&stdin=true&stdout=true";
const WEBSOCKET_HEADERS: &[(&str, &str)] = &[
    ("sec-websocket-key", WEBSOCKET_KEY),
    ("sec-websocket-version", "13"),
    ("sec-websocket-protocol", "v5.channel.k8s.io"),
];

/// [`splice`] of kubectl's WebSocket exec through a proxy in front of `upstream`.
async fn websocket_exec(upstream: Upstream) -> End {
    splice(
        upstream,
        "GET",
        WEBSOCKET_EXEC,
        WEBSOCKET_HEADERS,
        "websocket",
    )
    .await
}

#[tokio::test]
async fn websocket_exec_echoes_both_ways() {
    // Over plain HTTP to the kubelet, the kubelet's close reaches the caller as a clean close.
    let end = websocket_exec(Upstream::Http).await;
    assert_eq!(end, End::Clean);
}

#[tokio::test]
async fn websocket_exec_through_an_https_kubelet_ends_when_the_caller_closes() {
    // The splice ends either way (see the ignored test below for how).
    websocket_exec(Upstream::Https).await;
}

#[tokio::test]
async fn websocket_exec_through_an_https_kubelet_ends_with_a_clean_close() {
    let end = websocket_exec(Upstream::Https).await;
    assert_eq!(end, End::Clean);
}

#[tokio::test]
async fn spdy_attach_echoes_both_ways() {
    let end = splice(
        Upstream::Unix,
        "POST",
        "/attach/ns/pod/ctr?stdin=true&stdout=true",
        &[("x-stream-protocol-version", "v4.channel.k8s.io")],
        "SPDY/3.1",
    )
    .await;
    assert_eq!(end, End::Clean);
}

#[tokio::test]
async fn spdy_port_forward_echoes_both_ways() {
    let end = splice(
        Upstream::Http,
        "POST",
        "/portForward/ns/pod",
        &[("x-stream-protocol-version", "portforward.k8s.io")],
        "SPDY/3.1",
    )
    .await;
    assert_eq!(end, End::Clean);
}
