//! The admin listener: liveness, readiness and Prometheus metrics that account for the requests
//! just made, by status code and decision, with a latency histogram.

use std::collections::BTreeMap;

use http::StatusCode;

use crate::support::harness::ProxySpec;

/// The samples of `metric` in a text exposition: labels and value of each line.
fn samples(exposition: &str, metric: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => {
                let (labels, value) = rest.split_once("} ").unwrap();
                (labels, value)
            }
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        let labels = labels
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap();
                (name.to_owned(), value.trim_matches('"').to_owned())
            })
            .collect();
        let value = value.split_whitespace().next().unwrap().parse().unwrap();
        out.push((labels, value));
    }
    out
}

/// The sum of the samples of `metric` whose labels include all of `want`.
fn total(exposition: &str, metric: &str, want: &[(&str, &str)]) -> f64 {
    samples(exposition, metric)
        .into_iter()
        .filter(|(labels, _)| {
            want.iter()
                .all(|(name, value)| labels.get(*name).map(String::as_str) == Some(*value))
        })
        .map(|(_, value)| value)
        .sum()
}

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
    let requests = "kubelet_auth_proxy_requests_total";
    assert_eq!(
        total(
            &text,
            requests,
            &[
                ("code", "200"),
                ("decision", "allowed"),
                ("subresource", "pods")
            ]
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        total(
            &text,
            requests,
            &[
                ("code", "200"),
                ("decision", "allowed"),
                ("subresource", "stats")
            ]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        total(
            &text,
            requests,
            &[("code", "401"), ("decision", "unauthenticated")]
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        total(
            &text,
            requests,
            &[("code", "301"), ("decision", "redirected")]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(total(&text, requests, &[]), 7.0, "{text}");

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
    h.shutdown().await;
}
