//! The TLS front: ALPN serves HTTP/2 and HTTP/1.1; `--tls-min-version` is enforced; a client
//! certificate is requested only when x509 authentication is configured (kubernetes v1.33
//! `cmd/kubelet/app/server.go` `InitializeTLS`).

use http::{StatusCode, Version};

use crate::support::client::{
    ANY_TLS, Client, H2_AND_HTTP1, HTTP1_ONLY, Identity, Reply, TLS12_ONLY, empty, request,
};
use crate::support::harness::ProxySpec;
use crate::support::pki::CertSpec;
use crate::support::raw::{connect, exchange, statuses, tls_config};

#[tokio::test]
async fn alpn_serves_http2_and_http1() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = Identity::of(&h.ca.issue(&CertSpec::client("alice")));
    for (alpn, want) in [
        (H2_AND_HTTP1, Version::HTTP_2),
        (HTTP1_ONLY, Version::HTTP_11),
    ] {
        let client = Client::configured(h.ca.cert(), h.addr(), alice.clone(), alpn, ANY_TLS);
        let mut conn = client.connect().await.unwrap();
        assert_eq!(conn.version(), want);
        let response = conn
            .send(request("GET", "/echo?via=alpn").body(empty()).unwrap())
            .await
            .unwrap();
        let reply = Reply::read(response).await.unwrap();
        assert_eq!(reply.version, want);
        let echo = reply.echo();
        assert_eq!(
            (echo.method(), echo.path(), echo.query()),
            ("GET", "/echo", "via=alpn")
        );
    }
}

/// Without ALPN a connection is HTTP/1.1, as with the kubelet's Go server: a request is answered
/// in HTTP/1.1, and the HTTP/2 connection preface is not taken for HTTP/2 (over TLS, HTTP/2 is
/// only ever negotiated, RFC 9113 section 3.2).
#[tokio::test]
async fn without_alpn_a_connection_is_http1() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = h.ca.issue(&CertSpec::client("alice"));
    let no_alpn = tls_config(h.ca.cert(), Some(&alice), &[]);

    let mut tls = connect(h.addr(), no_alpn.clone()).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    let received = exchange(
        &mut tls,
        b"GET /echo HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        statuses(&received),
        [200],
        "{}",
        String::from_utf8_lossy(&received)
    );

    let mut tls = connect(h.addr(), no_alpn).await.unwrap();
    // The preface, then an empty SETTINGS frame.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let received = exchange(&mut tls, preface).await;
    // An HTTP/2 server would answer with its own SETTINGS frame.
    assert!(
        received.is_empty() || received.starts_with(b"HTTP/1.1 "),
        "not an HTTP/1.1 server's answer: {received:?}"
    );
}

#[tokio::test]
async fn tls13_minimum_refuses_a_tls12_only_client() {
    let h = ProxySpec::always_allow(&["--tls-min-version=VersionTLS13"])
        .start()
        .await;
    let alice = Identity::of(&h.ca.issue(&CertSpec::client("alice")));
    let old = Client::configured(
        h.ca.cert(),
        h.addr(),
        alice.clone(),
        H2_AND_HTTP1,
        TLS12_ONLY,
    );
    assert!(
        old.connect().await.is_err(),
        "a TLS 1.2-only client must not complete a handshake"
    );
    let current = Client::configured(h.ca.cert(), h.addr(), alice, H2_AND_HTTP1, ANY_TLS);
    assert_eq!(current.get("/echo").await.status, StatusCode::OK);
}

#[tokio::test]
async fn tls12_is_accepted_by_default() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = Identity::of(&h.ca.issue(&CertSpec::client("alice")));
    let client = Client::configured(h.ca.cert(), h.addr(), alice, H2_AND_HTTP1, TLS12_ONLY);
    let echo = client.get("/echo").await.echo();
    assert_eq!(echo.path(), "/echo");
}

#[tokio::test]
async fn no_client_certificate_requested_without_client_ca() {
    let h = ProxySpec::always_allow(&["--anonymous-auth", "--forward-identity-headers"])
        .without_client_ca()
        .start()
        .await;
    let alice = h.client(Identity::of(&h.ca.issue(&CertSpec::client("alice"))));
    let identity = alice.get("/echo").await.echo().identity();
    assert!(
        !alice.asked_for_certificate(),
        "no certificate may be requested without --client-ca-file"
    );
    assert_eq!(identity.user, ["system:anonymous"]);
    assert_eq!(identity.groups, ["system:unauthenticated"]);
}

#[tokio::test]
async fn client_certificate_requested_with_client_ca() {
    let h = ProxySpec::always_allow(&["--anonymous-auth"]).start().await;
    // Without a certificate to offer, the handshake still completes: requested, never required.
    let nobody = h.anonymous();
    assert_eq!(nobody.get("/echo").await.status, StatusCode::OK);
    assert!(nobody.asked_for_certificate());
}
