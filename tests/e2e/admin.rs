//! The admin listener: liveness, readiness and Prometheus metrics that account for the requests
//! just made, by status code and decision, with a latency histogram.

use http::StatusCode;

use crate::support::harness::ProxySpec;
use crate::support::metrics::total;

#[tokio::test]
async fn health_readiness_and_request_metrics() {
    let h = ProxySpec::new(&["--authorization-mode=AlwaysDeny,AlwaysAllow"])
        .start()
        .await;
    let healthz = h.admin_get("/healthz").await;
    assert_eq!(
        (healthz.status, healthz.text().as_str()),
        (StatusCode::OK, "ok")
    );
    assert_eq!(h.admin_get("/readyz").await.status, StatusCode::OK);
    assert_eq!(
        h.admin_get("/nothing-here").await.status,
        StatusCode::NOT_FOUND
    );

    let alice = h.user("alice", &[]);
    for _ in 0..2 {
        assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    }
    assert_eq!(alice.get("/stats/summary").await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            h.anonymous().get("/pods").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        h.anonymous().get("/a/../pods").await.status,
        StatusCode::MOVED_PERMANENTLY
    );

    let metrics = h.admin_get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    let text = metrics.text();
    let requests =
        |labels: &[(&str, &str)]| total(&text, "kubelet_auth_proxy_requests_total", labels);
    let allowed = |subresource| {
        [
            ("code", "200"),
            ("decision", "allowed"),
            ("subresource", subresource),
        ]
    };
    assert_eq!(requests(&allowed("pods")), 2.0, "{text}");
    assert_eq!(requests(&allowed("stats")), 1.0, "{text}");
    assert_eq!(
        requests(&[("code", "401"), ("decision", "unauthenticated")]),
        3.0,
        "{text}"
    );
    assert_eq!(
        requests(&[("code", "301"), ("decision", "redirected")]),
        1.0,
        "{text}"
    );
    assert_eq!(requests(&[]), 7.0, "{text}");

    let latency = "kubelet_auth_proxy_request_duration_seconds";
    assert_eq!(
        total(
            &text,
            &format!("{latency}_count"),
            &[("decision", "allowed")]
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        total(
            &text,
            &format!("{latency}_bucket"),
            &[("decision", "unauthenticated"), ("le", "+Inf")]
        ),
        3.0,
        "{text}"
    );
    assert!(total(&text, &format!("{latency}_sum"), &[]) > 0.0, "{text}");
    // What the proxy adds is timed for the allowed requests alone, and is part of their time.
    let added = "kubelet_auth_proxy_request_decision_duration_seconds";
    assert_eq!(total(&text, &format!("{added}_count"), &[]), 3.0, "{text}");
    let added_sum = total(&text, &format!("{added}_sum"), &[]);
    let allowed_sum = total(&text, &format!("{latency}_sum"), &[("decision", "allowed")]);
    assert!(
        added_sum > 0.0 && added_sum <= allowed_sum,
        "added {added_sum} of {allowed_sum}: {text}"
    );
    h.shutdown().await;
}
