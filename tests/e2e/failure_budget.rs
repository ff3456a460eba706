//! Tokens the node cannot check cost the API server a bounded number of reviews: a source whose
//! tokens keep failing gets 401 without a TokenReview once its budget is spent, counted in a
//! metric and summarized in the audit log, while another source's valid token, a verified
//! service-account token and any cached token are still served; valid tokens sent at once wait
//! for the places reviews in flight hold rather than being refused; many sources together are
//! held by the node's overall budget.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use http::StatusCode;
use serde_json::Value;

use kubelet_auth_proxy::authn::failure_budget::{OVERALL_LIMITS, SOURCE_LIMITS};

use crate::support::TempDir;
use crate::support::apiserver::issuer::service_account_claims;
use crate::support::apiserver::{ApiServer, Kind, TokenUser};
use crate::support::client::Client;
use crate::support::harness::{Harness, ProxySpec};

const SKIPPED: &str = "kubelet_auth_proxy_token_reviews_skipped_total";

fn source(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// `count` requests with tokens nobody issued, eight at a time, from `client`: each a 401.
async fn random_tokens(client: &Client, count: usize, tag: &str) {
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..count {
        let client = client.clone();
        let token = format!("random-{tag}-{i}");
        requests.spawn(async move { client.get_with_token("/pods", &token).await.status });
        if requests.len() == 8 {
            let status = requests.join_next().await.unwrap().unwrap();
            assert_eq!(status, StatusCode::UNAUTHORIZED);
        }
    }
    for status in requests.join_all().await {
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
}

async fn metric(h: &Harness, budget: &str) -> f64 {
    h.metric(SKIPPED, &[("budget", budget)]).await
}

/// The audit events of the log file in `dir`.
fn events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.log"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test]
async fn a_flooding_source_costs_its_budget_and_valid_tokens_are_still_served() {
    let api = ApiServer::start().await;
    let dir = TempDir::new("failure-budget");
    let log = dir.path().join("audit.log");
    let h = ProxySpec::always_allow(&[
        "--authentication-token-webhook",
        &format!("--audit-log-path={}", log.display()),
    ])
    .apiserver(&api)
    .start()
    .await;
    let flooder = h.anonymous();
    let burst = SOURCE_LIMITS.burst as usize;

    random_tokens(&flooder, 200, "a").await;
    let reviews = api.arrivals(Kind::TokenReview);
    // The burst, and at most what the refill brought while the test ran.
    assert!((burst..=burst + 1).contains(&reviews), "{reviews} reviews");
    assert_eq!(metric(&h, "source").await as usize, 200 - reviews);
    assert_eq!(metric(&h, "overall").await, 0.0);

    // Another source's valid token is reviewed and served.
    api.add_token("alice-token", TokenUser::new("alice"));
    let neighbour = h.anonymous().connecting_from(source(2));
    let reply = neighbour.get_with_token("/pods", "alice-token").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(api.arrivals(Kind::TokenReview), reviews + 1);
    // Cached now, so the flooding source is served with it too, without a review.
    let reply = flooder.get_with_token("/pods", "alice-token").await;
    assert_eq!(reply.status, StatusCode::OK);
    // A service-account token the node verified is not a forgery: reviewed whatever the
    // source's budget.
    let claims = service_account_claims("monitoring", "prometheus");
    let prometheus = api.sign_token(&claims, None);
    api.add_token(
        &prometheus,
        TokenUser::new("system:serviceaccount:monitoring:prometheus"),
    );
    h.wait_for_issuer_keys().await;
    let reply = flooder.get_with_token("/pods", &prometheus).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(api.arrivals(Kind::TokenReview), reviews + 2);
    // An opaque token from the flooding source is not reviewed while its budget is spent.
    api.add_token("bob-token", TokenUser::new("bob"));
    let reply = flooder.get_with_token("/pods", "bob-token").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.arrivals(Kind::TokenReview), reviews + 2);

    // The refusals are summarized, per source, in the audit log (at shutdown at the latest).
    let skipped = metric(&h, "source").await as u64;
    h.shutdown().await;
    let summaries: Vec<Value> = events(dir.path())
        .into_iter()
        .filter(|e| {
            e["annotations"]
                .get("kubelet-auth-proxy.io/reviews-skipped")
                .is_some()
        })
        .collect();
    assert!(!summaries.is_empty(), "no summary event");
    let mut reported = 0;
    for summary in &summaries {
        assert_eq!(summary["sourceIPs"], serde_json::json!(["127.0.0.1"]));
        assert_eq!(summary["responseStatus"]["code"], 401);
        let annotations = &summary["annotations"];
        assert_eq!(
            annotations["kubelet-auth-proxy.io/reviews-skipped-reason"],
            "source_budget"
        );
        reported += annotations["kubelet-auth-proxy.io/reviews-skipped"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(reported, skipped, "every refusal is in a summary");
}

#[tokio::test]
async fn valid_tokens_never_spend_a_budget_and_many_sources_share_the_nodes() {
    let api = ApiServer::start().await;
    let h = ProxySpec::always_allow(&["--authentication-token-webhook"])
        .apiserver(&api)
        .start()
        .await;
    let client = h.anonymous().connecting_from(source(3));
    // Many more valid tokens than the burst, all from one source: each reviewed and served.
    for i in 0..3 * SOURCE_LIMITS.burst as usize {
        let token = format!("valid-{i}");
        api.add_token(&token, TokenUser::new(&format!("user-{i}")));
        let reply = client.get_with_token("/pods", &token).await;
        assert_eq!(reply.status, StatusCode::OK, "token {i}");
    }
    // As many again at once: beyond the places the budget has, they wait for reviews in flight
    // to settle, and are served.
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..3 * SOURCE_LIMITS.burst as usize {
        let token = format!("valid-at-once-{i}");
        api.add_token(&token, TokenUser::new(&format!("user-at-once-{i}")));
        let client = client.clone();
        requests.spawn(async move { client.get_with_token("/pods", &token).await.status });
    }
    for status in requests.join_all().await {
        assert_eq!(status, StatusCode::OK);
    }
    let valid = api.arrivals(Kind::TokenReview);
    assert_eq!(valid, 6 * SOURCE_LIMITS.burst as usize);
    assert_eq!(metric(&h, "source").await, 0.0);

    // Twenty sources at once, each within its own burst: together held by the node's budget,
    // its burst and what its refill brought meanwhile (sources in good standing wait for it).
    let started = std::time::Instant::now();
    let mut sources = tokio::task::JoinSet::new();
    for last in 10..30 {
        let client = h.anonymous().connecting_from(source(last));
        sources.spawn(async move { random_tokens(&client, 4, &last.to_string()).await });
    }
    sources.join_all().await;
    let failed = api.arrivals(Kind::TokenReview) - valid;
    let refilled = OVERALL_LIMITS.rate * started.elapsed().as_secs_f64();
    let bound = OVERALL_LIMITS.burst + refilled.ceil();
    assert!(
        (OVERALL_LIMITS.burst - 1.0..=bound).contains(&(failed as f64)),
        "{failed} reviews, bound {bound}"
    );
    assert_eq!(metric(&h, "overall").await as usize, 80 - failed);
}
