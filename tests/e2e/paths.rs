//! The path gate (Go's `net/http` `ServeMux` redirects unclean paths
//! before the kubelet's auth filter sees them): unclean paths are redirected and malformed
//! ones refused before authentication, and an authorized path reaches the kubelet byte for byte.

use http::StatusCode;

use crate::support::client::{empty, request};
use crate::support::harness::ProxySpec;

#[tokio::test]
async fn dot_segments_redirect_before_authentication() {
    // Anonymous off and no certificate: anything authenticated would be a 401.
    let h = ProxySpec::always_allow(&[]).start().await;
    let nobody = h.anonymous();
    assert_eq!(
        nobody.get("/exec/a/b/c").await.status,
        StatusCode::UNAUTHORIZED
    );

    let reply = nobody.get("/stats/../exec/a/b/c?command=id&stdout=1").await;
    assert_eq!(
        reply.status,
        StatusCode::MOVED_PERMANENTLY,
        "{}",
        reply.text()
    );
    assert_eq!(
        reply.header("location"),
        Some("/exec/a/b/c?command=id&stdout=1")
    );

    let reply = nobody.get("/stats/./summary").await;
    assert_eq!(reply.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(reply.header("location"), Some("/stats/summary"));

    let reply = nobody.get("/pods//x").await;
    assert_eq!(reply.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(reply.header("location"), Some("/pods/x"));
}

#[tokio::test]
async fn malformed_escapes_are_400_before_authentication() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let nobody = h.anonymous();
    for path in [
        "/stats%2F..%2Fexec/a/b/c",
        "/logs/a%2fb",
        "/pods%zz",
        "/pods/%4",
        "/logs/x%00y",
    ] {
        let reply = nobody.get(path).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            reply.text()
        );
    }
}

#[tokio::test]
async fn kubelet_sees_the_raw_path_and_query() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let alice = h.user("alice", &[]);
    for (method, path, query) in [
        ("GET", "/debug/my%20profile", "seconds=1&x=%2F&y=a+b"),
        ("GET", "/a;b/c%20d", "x=1&y=%2F"),
        ("POST", "/run/ns/my%20pod/ctr", "cmd=ls%20-l"),
        ("GET", "/configz", ""),
    ] {
        let target = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        };
        let echo = alice
            .send(request(method, &target).body(empty()).unwrap())
            .await
            .echo();
        assert_eq!(
            (echo.method(), echo.path(), echo.query()),
            (method, path, query),
            "{target}"
        );
    }
}

#[tokio::test]
async fn container_logs_path_with_escapes_is_forwarded() {
    let h = ProxySpec::always_allow(&[]).start().await;
    let reply = h
        .user("alice", &[])
        .get("/containerLogs/ns/my%20pod/c?tailLines=1")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(reply.text().starts_with("line 1\n"), "{}", reply.text());
}
