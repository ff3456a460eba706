//! The forwarder's tests, against a stand-in kubelet on loopback: what goes up, what comes back.

use super::*;
use crate::forward::UpstreamBody;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use http_body_util::{BodyExt, Either, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

use crate::test_fixtures::{certificate_user, http2_connect, send_http2};
use crate::tools::demo::kubelet::StandInKubelet;

/// Bound on every wait, so a bug fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(10);

type FrontBody = Either<UpstreamBody, Full<Bytes>>;

/// A stand-in kubelet over TLS and a front server forwarding to it as alice, with or without
/// identity headers.
async fn tls_front(identity_headers: bool) -> (StandInKubelet, SocketAddr) {
    let (server, ca) = kubelet_tls();
    let kubelet = StandInKubelet::start(Some(server)).await.unwrap();
    let addr = tls_front_to(kubelet.upstream(), ca, identity_headers).await;
    (kubelet, addr)
}

/// A front server forwarding as alice to `target` over TLS, trusting `ca`.
async fn tls_front_to(
    target: UpstreamTarget,
    ca: CertificateDer<'static>,
    identity_headers: bool,
) -> SocketAddr {
    let tls = Some(client_tls(ca));
    let forwarder = Forwarder::new(target, tls, None, options(identity_headers)).unwrap();
    front(forwarder, alice()).await
}

/// A stand-in kubelet over plain HTTP and a front server forwarding to it as alice, with or
/// without identity headers.
async fn plain_front(identity_headers: bool) -> (StandInKubelet, SocketAddr) {
    let kubelet = StandInKubelet::start(None).await.unwrap();
    let addr = plain_front_to(kubelet.upstream(), identity_headers).await;
    (kubelet, addr)
}

/// A front server forwarding as alice to `target` over plain HTTP (or a unix socket).
async fn plain_front_to(target: UpstreamTarget, identity_headers: bool) -> SocketAddr {
    let forwarder = Forwarder::new(target, None, None, options(identity_headers)).unwrap();
    front(forwarder, alice()).await
}

/// A minimal front server: every request is forwarded as `user`; a `ForwardError` becomes a
/// 502 whose body is the error's `Display`, as the real server does.
async fn front(forwarder: Forwarder, user: User) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let forwarder = Arc::new(forwarder);
    let user = Arc::new(user);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (forwarder, user) = (forwarder.clone(), user.clone());
            let service = service_fn(move |req: Request<Incoming>| {
                let (forwarder, user) = (forwarder.clone(), user.clone());
                async move {
                    let resp: Response<FrontBody> = match forwarder.forward(req, &user).await {
                        Ok(resp) => resp.map(Either::Left),
                        Err(err) => {
                            let body = Full::new(Bytes::from(err.to_string()));
                            let mut resp = Response::new(Either::Right(body));
                            *resp.status_mut() = StatusCode::BAD_GATEWAY;
                            resp
                        }
                    };
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                let _ = builder
                    .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

/// Sends one request over a fresh HTTP/1.1 connection (upgrades enabled).
async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Response<Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    timeout(WAIT, sender.send_request(req))
        .await
        .unwrap()
        .unwrap()
}

fn get(path: &str) -> http::request::Builder {
    Request::get(path).header(HOST, "proxy.test")
}

/// `request` asking to switch to `protocol`.
fn asking_upgrade(request: http::request::Builder, protocol: &str) -> http::request::Builder {
    request
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, protocol)
}

/// Sends a plain `GET path` to `addr`; returns the answer's status and body.
async fn get_text(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let resp = send(addr, get(path).body(Full::default()).unwrap()).await;
    (resp.status(), body_text(resp).await)
}

/// The front server's answer to a `ForwardError` whose `Display` is `error`.
fn bad_gateway(error: &str) -> (StatusCode, String) {
    (StatusCode::BAD_GATEWAY, error.to_owned())
}

/// A kubelet's `/healthz` answer.
fn healthy() -> (StatusCode, String) {
    (StatusCode::OK, "ok".to_owned())
}

async fn body_text(resp: Response<Incoming>) -> String {
    let bytes = timeout(WAIT, resp.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn echo_of(resp: Response<Incoming>) -> Value {
    assert_eq!(resp.status(), StatusCode::OK);
    serde_json::from_str(&body_text(resp).await).unwrap()
}

fn header_values(echo: &Value, name: &str) -> Vec<String> {
    echo["headers"][name]
        .as_array()
        .map(|vs| vs.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn has_identity_or_credential(echo: &Value) -> Vec<String> {
    echo["headers"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|n| {
            n.starts_with("x-remote-") || n.starts_with("impersonate-") || *n == "authorization"
        })
        .cloned()
        .collect()
}

fn alice() -> User {
    certificate_user(
        "alice",
        "u-1",
        &["devs", "system:authenticated"],
        "X509SHA256=ab",
    )
}

fn options(identity: bool) -> ForwardOptions {
    ForwardOptions {
        forward_identity_headers: identity,
        ..ForwardOptions::default()
    }
}

/// A request that carries every kind of client-supplied credential and identity.
fn hostile_post(path: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header(HOST, "proxy.test")
        .header("authorization", "Bearer stolen")
        .header("x-remote-user", "system:admin")
        .header("x-remote-group", "system:masters")
        .header("X-Remote-Extra-Scopes", "all")
        .header("impersonate-user", "system:admin")
        .header("Impersonate-Extra-Foo", "bar")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "1")
        .header("x-custom", "kept")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap()
}

fn unique_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kap-proxy-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A fresh CA and a kubelet serving certificate for `127.0.0.1` and `kubelet.test`, both
/// made in memory. Returns the server config and the CA certificate.
fn kubelet_tls() -> (Arc<rustls::ServerConfig>, CertificateDer<'static>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "kubelet.test".to_owned()])
            .unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let server = rustls::ServerConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    (Arc::new(server), ca.der().clone())
}

fn client_tls(ca: CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Sends [`hostile_post`] to `/a;b/c%20d?x=1&y=%2F` through the front server of a stand-in
/// `kubelet` at `addr`, and checks that the stand-in saw it unchanged but for its identities,
/// credentials and hop-by-hop headers, with the kubelet's address as its Host (`localhost` on a
/// unix socket).
async fn assert_forwarded_clean((kubelet, addr): &(StandInKubelet, SocketAddr)) {
    let host = kubelet
        .addr()
        .map_or_else(|| "localhost".to_owned(), |a| a.to_string());
    let echo = &echo_of(send(*addr, hostile_post("/a;b/c%20d?x=1&y=%2F")).await).await;
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/a;b/c%20d");
    assert_eq!(echo["query"], "x=1&y=%2F");
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["bodyBytes"], 5);
    assert_eq!(header_values(echo, "host"), [host]);
    assert_eq!(header_values(echo, "x-custom"), ["kept"]);
    assert!(header_values(echo, "x-hop").is_empty(), "{echo}");
    assert_eq!(
        has_identity_or_credential(echo),
        Vec::<String>::new(),
        "{echo}"
    );
}

#[tokio::test]
async fn plain_http_forwards_path_and_query_unchanged_without_client_identity() {
    assert_forwarded_clean(&plain_front(false).await).await;
}

#[tokio::test]
async fn identity_headers_replace_client_ones_when_enabled() {
    let (_kubelet, addr) = plain_front(true).await;
    let echo = echo_of(send(addr, hostile_post("/pods/x")).await).await;
    assert_eq!(header_values(&echo, "x-remote-user"), ["alice"]);
    assert_eq!(header_values(&echo, "x-remote-uid"), ["u-1"]);
    assert_eq!(
        header_values(&echo, "x-remote-group"),
        ["devs", "system:authenticated"]
    );
    assert_eq!(
        header_values(
            &echo,
            "x-remote-extra-authentication.kubernetes.io%2fcredential-id"
        ),
        ["X509SHA256=ab"]
    );
    assert!(header_values(&echo, "x-remote-extra-scopes").is_empty());
    assert!(header_values(&echo, "impersonate-user").is_empty());
    assert!(header_values(&echo, "authorization").is_empty());
}

#[tokio::test]
async fn identity_value_that_cannot_be_a_header_is_a_502_and_nothing_is_sent() {
    let kubelet = StandInKubelet::start(None).await.unwrap();
    let forwarder = Forwarder::new(kubelet.upstream(), None, None, options(true)).unwrap();
    let mut user = alice();
    user.groups.push("evil\r\nx-remote-user: root".into());
    let addr = front(forwarder, user).await;
    assert_eq!(
        get_text(addr, "/pods").await,
        bad_gateway("cannot forward the caller's identity")
    );
}

#[tokio::test]
async fn tls_upstream_is_verified_and_forwarded() {
    assert_forwarded_clean(&tls_front(false).await).await;
}

#[tokio::test]
async fn tls_server_name_override_is_used_for_verification() {
    let (server, ca) = kubelet_tls();
    let kubelet = StandInKubelet::start(Some(server)).await.unwrap();
    let tls = client_tls(ca);
    let good = Forwarder::new(
        kubelet.upstream(),
        Some(tls.clone()),
        Some(ServerName::try_from("kubelet.test").unwrap()),
        options(false),
    )
    .unwrap();
    assert_eq!(
        get_text(front(good, alice()).await, "/healthz").await,
        healthy()
    );

    let wrong = Forwarder::new(
        kubelet.upstream(),
        Some(tls),
        Some(ServerName::try_from("other.test").unwrap()),
        options(false),
    )
    .unwrap();
    assert_eq!(
        get_text(front(wrong, alice()).await, "/healthz").await,
        bad_gateway("upstream TLS handshake failed")
    );
}

#[tokio::test]
async fn untrusted_kubelet_certificate_is_a_tls_error() {
    let (server, _) = kubelet_tls();
    let (_, other_ca) = kubelet_tls();
    let kubelet = StandInKubelet::start(Some(server)).await.unwrap();
    let addr = tls_front_to(kubelet.upstream(), other_ca, false).await;
    assert_eq!(
        get_text(addr, "/healthz").await,
        bad_gateway("upstream TLS handshake failed")
    );
}

#[tokio::test]
async fn unix_socket_upstream() {
    let dir = unique_dir();
    let kubelet = StandInKubelet::start_unix(dir.join("kubelet.sock"))
        .await
        .unwrap();
    let addr = plain_front_to(kubelet.upstream(), false).await;
    let front = (kubelet, addr);
    assert_forwarded_clean(&front).await;
    front.0.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn http2_caller_is_forwarded_as_http11() {
    let (kubelet, addr) = plain_front(false).await;
    let mut sender = http2_connect(addr).await;
    let req = Request::get("http://proxy.test/stats/summary?only_cpu_and_memory=true")
        .header("te", "trailers")
        .body(Full::<Bytes>::default())
        .unwrap();
    let resp = send_http2(&mut sender, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let stats: Value = serde_json::from_str(&body_text(resp).await).unwrap();
    assert_eq!(stats["node"]["nodeName"], "stand-in");

    let req = Request::get("http://proxy.test/a%2Fb?q")
        .body(Full::<Bytes>::default())
        .unwrap();
    let echo = echo_of(send_http2(&mut sender, req).await).await;
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["path"], "/a%2Fb");
    assert_eq!(echo["query"], "q");
    assert_eq!(
        header_values(&echo, "host"),
        [kubelet.addr().unwrap().to_string()]
    );
}

#[tokio::test]
async fn followed_log_streams_while_the_kubelet_keeps_writing() {
    let (_kubelet, addr) = plain_front(false).await;
    let req = get("/containerLogs/default/web-0/web?follow=true")
        .body(Full::default())
        .unwrap();
    let resp = send(addr, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut text = String::new();
    while text.lines().count() < 3 {
        let frame = timeout(WAIT, body.frame()).await.unwrap().unwrap().unwrap();
        if let Some(data) = frame.data_ref() {
            text.push_str(std::str::from_utf8(data).unwrap());
        }
    }
    assert!(text.starts_with("line 1\nline 2\nline 3\n"), "{text}");
    // The stream is endless: more keeps coming.
    assert!(timeout(WAIT, body.frame()).await.unwrap().is_some());
}

/// Checks a 101 and that bytes written to the upgraded connection come back unchanged.
async fn echo_through_upgrade(mut resp: Response<Incoming>) {
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()[CONNECTION], "Upgrade");
    let upgraded = timeout(WAIT, hyper::upgrade::on(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let mut io = TokioIo::new(upgraded);
    for msg in [&b"ping"[..], b"second message", &[0u8, 255, 10, 13]] {
        io.write_all(msg).await.unwrap();
        let mut back = vec![0; msg.len()];
        timeout(WAIT, io.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
}

#[tokio::test]
async fn websocket_upgrade_is_spliced_both_ways() {
    let (_kubelet, addr) = plain_front(false).await;
    let req = asking_upgrade(
        get("/exec/default/web-0/web?command=sh&stdin=true"),
        "websocket",
    )
    .header(SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
    .header("sec-websocket-version", "13")
    .body(Full::default())
    .unwrap();
    let resp = send(addr, req).await;
    assert_eq!(resp.headers()[UPGRADE], "websocket");
    assert_eq!(
        resp.headers()[SEC_WEBSOCKET_ACCEPT],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    echo_through_upgrade(resp).await;
}

#[tokio::test]
async fn spdy_upgrade_over_tls_is_spliced_both_ways() {
    let (_kubelet, addr) = tls_front(true).await;
    let post = Request::post("/portForward/default/web-0").header(HOST, "proxy.test");
    let req = asking_upgrade(post, "SPDY/3.1")
        .header("x-stream-protocol-version", "portforward.k8s.io")
        .body(Full::default())
        .unwrap();
    let resp = send(addr, req).await;
    assert_eq!(resp.headers()[UPGRADE], "SPDY/3.1");
    echo_through_upgrade(resp).await;
}

#[tokio::test]
async fn upgrade_refused_by_the_kubelet_is_a_normal_response() {
    let (_kubelet, addr) = plain_front(false).await;
    let req = asking_upgrade(get("/healthz"), "websocket")
        .body(Full::default())
        .unwrap();
    let resp = send(addr, req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(!resp.headers().contains_key(UPGRADE));
    assert_eq!(body_text(resp).await, "ok");
}

/// An upstream that answers every request with `101` (to h2c), whatever was asked, after
/// handing the request head it read to the test.
async fn always_switching_upstream() -> (UpstreamTarget, tokio::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = UpstreamTarget::Http {
        authority: listener.local_addr().unwrap().to_string().parse().unwrap(),
    };
    let (heads, received) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && tcp.read(&mut byte).await.unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let _ = heads
                    .send(String::from_utf8_lossy(&head).to_lowercase())
                    .await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
                    .await;
                let mut sink = Vec::new();
                let _ = tcp.read_to_end(&mut sink).await;
            });
        }
    });
    (target, received)
}

#[tokio::test]
async fn an_upgrade_anywhere_else_is_stripped_and_never_spliced() {
    let (target, mut heads) = always_switching_upstream().await;
    let addr = plain_front_to(target, false).await;
    for (path, protocol) in [
        ("/pods", "websocket"),
        ("/run/ns/pod/ctr", "websocket"),
        ("/exec/ns/pod/ctr", "h2c"),
    ] {
        let req = asking_upgrade(get(path), protocol)
            .body(Full::default())
            .unwrap();
        let resp = send(addr, req).await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{path} {protocol}");
        assert_eq!(body_text(resp).await, "upstream switched protocols unasked");
        let head = timeout(WAIT, heads.recv()).await.unwrap().unwrap();
        assert!(!head.contains("upgrade"), "{path} {protocol}: {head}");
    }
}

#[tokio::test]
async fn kubelet_down_is_a_prompt_error_and_the_forwarder_recovers() {
    // A port that was just free: connecting to it is refused.
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let target = UpstreamTarget::Http {
        authority: refused.to_string().parse().unwrap(),
    };
    let addr = plain_front_to(target, false).await;
    assert_eq!(
        get_text(addr, "/healthz").await,
        bad_gateway("upstream connection failed")
    );

    // Same forwarder, kubelet comes up (on a unix socket, whose address we can choose).
    let dir = unique_dir();
    let sock = dir.join("kubelet.sock");
    let addr = plain_front_to(UpstreamTarget::Unix { path: sock.clone() }, false).await;
    assert_eq!(
        get_text(addr, "/healthz").await,
        bad_gateway("upstream connection failed")
    );
    let kubelet = StandInKubelet::start_unix(&sock).await.unwrap();
    assert_eq!(get_text(addr, "/healthz").await, healthy());
    // And again after the kubelet restarts: stale pooled connections are not an error.
    kubelet.shutdown().await;
    let kubelet = StandInKubelet::start_unix(&sock).await.unwrap();
    assert_eq!(get_text(addr, "/healthz").await, healthy());
    drop(kubelet);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn stalled_tls_handshake_is_a_connect_timeout() {
    // Accepts TCP connections and never answers: the TLS handshake cannot finish.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = UpstreamTarget::Https {
        authority: silent.local_addr().unwrap().to_string().parse().unwrap(),
    };
    let (_, ca) = kubelet_tls();
    let options = ForwardOptions {
        connect_timeout: Duration::from_millis(200),
        ..ForwardOptions::default()
    };
    let forwarder = Forwarder::new(target, Some(client_tls(ca)), None, options).unwrap();
    let addr = front(forwarder, alice()).await;
    assert_eq!(
        get_text(addr, "/healthz").await,
        bad_gateway("upstream connect timed out")
    );
    drop(silent);
}

#[tokio::test]
async fn connect_is_refused_as_unsupported() {
    let (_kubelet, addr) = plain_front(false).await;
    let req = Request::connect("kubelet.test:10250")
        .header(HOST, "kubelet.test:10250")
        .body(Full::default())
        .unwrap();
    let resp = send(addr, req).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(body_text(resp).await, "request cannot be forwarded");
}

#[test]
fn configuration_errors() {
    let authority: Authority = "127.0.0.1:10250".parse().unwrap();
    let https = UpstreamTarget::Https {
        authority: authority.clone(),
    };
    let err = Forwarder::new(https.clone(), None, None, options(false)).err();
    assert!(matches!(err, Some(ProxyError::MissingTlsConfig)), "{err:?}");

    let (_, ca) = kubelet_tls();
    let mut alpn = (*client_tls(ca.clone())).clone();
    alpn.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let err = Forwarder::new(https.clone(), Some(Arc::new(alpn)), None, options(false)).err();
    assert!(matches!(err, Some(ProxyError::AlpnNotHttp11)), "{err:?}");

    let mut h11 = (*client_tls(ca.clone())).clone();
    h11.alpn_protocols = vec![b"http/1.1".to_vec()];
    assert!(Forwarder::new(https, Some(Arc::new(h11)), None, options(false)).is_ok());

    let with_user = UpstreamTarget::Http {
        authority: "user@127.0.0.1:10250".parse().unwrap(),
    };
    let err = Forwarder::new(with_user, None, None, options(false)).err();
    assert!(
        matches!(err, Some(ProxyError::AuthorityWithUserInfo)),
        "{err:?}"
    );

    let ipv6 = UpstreamTarget::Https {
        authority: "[::1]:10250".parse().unwrap(),
    };
    assert!(Forwarder::new(ipv6, Some(client_tls(ca)), None, options(false)).is_ok());
}

#[test]
fn host_port_strips_ipv6_brackets_and_defaults_the_port() {
    let a: Authority = "[::1]:10250".parse().unwrap();
    assert_eq!(host_port(&a, 443).unwrap(), ("::1".to_owned(), 10250));
    let a: Authority = "kubelet.test".parse().unwrap();
    assert_eq!(
        host_port(&a, 443).unwrap(),
        ("kubelet.test".to_owned(), 443)
    );
}

/// A kubelet that answers one request with a chunked log of `lines` lines, each written and
/// flushed alone (one chunk, one TLS record, as the kubelet's flush-writer sends them), then
/// waits for `finish` before the last chunk. It runs on a thread of its own, so every line is on
/// the socket before the proxy reads the first.
fn line_by_line_kubelet(
    lines: &[String],
    finish: std::sync::mpsc::Receiver<()>,
) -> (UpstreamTarget, CertificateDer<'static>) {
    let (server_tls, ca) = kubelet_tls();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let lines = lines.to_vec();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let (tcp, _) = TcpListener::from_std(listener)
                .unwrap()
                .accept()
                .await
                .unwrap();
            tcp.set_nodelay(true).unwrap();
            let mut tls = tokio_rustls::TlsAcceptor::from(server_tls)
                .accept(tcp)
                .await
                .unwrap();
            let mut head = [0u8; 4096];
            let _ = tls.read(&mut head).await.unwrap();
            tls.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            for line in &lines {
                tls.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
                    .await
                    .unwrap();
                tls.flush().await.unwrap();
            }
            let _ = finish.recv_timeout(WAIT);
            tls.write_all(b"0\r\n\r\n").await.unwrap();
            tls.flush().await.unwrap();
            let _ = tls.read(&mut head).await;
        });
    });
    let authority = http::uri::Authority::try_from(addr.to_string()).unwrap();
    (UpstreamTarget::Https { authority }, ca)
}

#[tokio::test]
async fn log_lines_already_written_leave_the_server_gathered() {
    let lines: Vec<String> = (0..300)
        .map(|i| format!("2026-11-27T06:00:00.{i:09}Z INFO line {i} of a container log\n"))
        .collect();
    let (finish, finished) = std::sync::mpsc::channel();
    let (upstream, ca) = line_by_line_kubelet(&lines, finished);
    let addr = tls_front_to(upstream, ca, false).await;
    let resp = send(
        addr,
        get("/containerLogs/default/web-0/web")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Every line reaches the proxy's socket before it reads the first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut body = resp.into_body();
    let mut frames = 0;
    let mut got = Vec::new();
    while let Some(frame) = timeout(WAIT, body.frame()).await.unwrap() {
        got.extend_from_slice(frame.unwrap().data_ref().unwrap());
        frames += 1;
        if frames == 1 {
            let _ = finish.send(());
        }
    }
    assert_eq!(
        String::from_utf8(got).unwrap(),
        lines.concat(),
        "every line, in order"
    );
    // hyper's server polls a body several times in one run of its task: a gathering that took
    // the second poll for the end of its turn sent 300 chunks here.
    assert!(
        frames <= 5,
        "300 readable lines came out in {frames} chunks"
    );
}
