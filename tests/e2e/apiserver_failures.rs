//! A review the API server refuses or cannot answer is said at the default log level with its
//! cause and what to do, once a minute per kind and cause, and counted by cause, while every
//! request it concerned fails closed.

use http::StatusCode;

use crate::support::apiserver::{ApiServer, Fault, Kind, TokenUser};
use crate::support::client::H2_AND_HTTP1;
use crate::support::eventually;
use crate::support::metrics::total;
use crate::support::process::ProcessSpec;

#[tokio::test]
async fn failed_reviews_are_logged_once_per_cause_with_a_hint_and_counted() {
    let mut api = ApiServer::start().await;
    api.add_token("tok", TokenUser::new("carol"));
    let site = ProcessSpec::new("apiserver-failures")
        .config("authenticationTokenWebhook: true\n")
        .apiserver(&api)
        .prepare()
        .await;
    let proxy = site
        .start("proxy", &["--authorization-mode=Webhook".to_owned()])
        .await;
    let alice = site.client(proxy.addr(), "alice", H2_AND_HTTP1);

    // Three SubjectAccessReviews refused with 403 (distinct paths: no cache, no coalescing).
    api.inject(Kind::SubjectAccessReview, Fault::Forbidden, 3);
    for path in ["/stats/summary", "/metrics", "/spec/"] {
        let reply = alice.get(path).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
    }
    // A TokenReview that cannot reach the API server: another kind and cause, reported too.
    api.stop().await;
    let token = site.anonymous(proxy.addr());
    let reply = token.get_with_token("/pods", "tok").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);

    // The log reaches the test through a pipe: wait until both reports are in.
    let log = eventually("both failure reports in the log", || async {
        let log = proxy.stderr();
        (log.contains("SubjectAccessReview failed") && log.contains("TokenReview failed"))
            .then_some(log)
    })
    .await;
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("SubjectAccessReview failed (fails closed): API server answered 403")
        })
        .collect();
    assert_eq!(forbidden.len(), 1, "one report a minute: {log}");
    assert!(
        forbidden[0].contains("WARN")
            && forbidden[0].contains("bind it to the ClusterRole system:auth-delegator"),
        "{}",
        forbidden[0]
    );
    assert!(
        log.lines().any(|l| l
            .contains("TokenReview failed (fails closed): API server unreachable")
            && l.contains("check the kubeconfig's server address and CA")),
        "{log}"
    );
    assert!(
        !log.contains("Bearer tok") && !log.contains("\"tok\""),
        "{log}"
    );

    let metrics = crate::support::client::plain_get(proxy.admin_addr(), "/metrics")
        .await
        .text();
    let failures = |kind: &str, cause: &str| {
        total(
            &metrics,
            "kubelet_auth_proxy_apiserver_review_failures_total",
            &[("kind", kind), ("cause", cause)],
        )
    };
    assert_eq!(failures("SubjectAccessReview", "forbidden"), 3.0);
    assert_eq!(failures("TokenReview", "unreachable"), 1.0);
}
