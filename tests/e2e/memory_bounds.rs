//! Distinct tokens keep the proxy's memory bounded: its review caches are capped (16,384 tokens,
//! 8,192 authorization decisions), so an attacker minting new tokens fills them and no more.
//!
//! A million tokens end to end would take minutes; the bound is shown in two parts instead. Here,
//! the real binary is sent tens of thousands of distinct tokens, pipelined over many connections,
//! with the stand-in API server answering at once: tokens of ever new users (kept by both caches,
//! each user also making a SubjectAccessReview), service-account tokens the node verifies.
//! Rejected tokens cannot fill the caches: every review passes the budget of failures
//! (failure_budget.rs), so at most its 20 at once and one every 2 s are reviewed and cached;
//! the rest are refused without a review. A first round overflows both caps; the resident memory it leaves is the
//! plateau; further rounds, each again more distinct tokens than the token cache holds, must not
//! raise it by more than a bound smaller than what keeping their entries would cost. The exact
//! entry count is checked in `src/apiserver/cache.rs` (`a_million_keys_never_exceed_the_cap`),
//! which pushes a million keys through the same cache type.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;

use crate::support::apiserver::issuer::service_account_claims;
use crate::support::apiserver::{ApiServer, Flavour, Kind, TokenUser, Verdict};
use crate::support::client::{Client, Identity, Reply, empty, request};
use crate::support::eventually;
use crate::support::pki::CertSpec;
use crate::support::standalone::Standalone;

/// Connections the tokens are sent over, each HTTP/2, one request at a time.
const CONNECTIONS: usize = 32;
/// The longest one round may take on a busy two-core machine.
const ROUND_BOUND: Duration = Duration::from_secs(120);

/// Sends `GET /pods` with the tokens `make(first..first + count)` over [`CONNECTIONS`]
/// connections; returns how many were answered `401` and `200`.
async fn round(
    client: &Client,
    first: usize,
    count: usize,
    tokens: &Arc<Vec<String>>,
) -> (usize, usize) {
    let next = Arc::new(AtomicUsize::new(first));
    let end = first + count;
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let (client, next, tokens) = (client.clone(), Arc::clone(&next), Arc::clone(tokens));
        senders.spawn(async move {
            let mut conn = client.connect().await.unwrap();
            let (mut refused, mut served) = (0, 0);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return (refused, served);
                }
                let req = request("GET", "/pods")
                    .header("authorization", format!("Bearer {}", tokens[i]))
                    .body(empty())
                    .unwrap();
                let reply = Reply::read(conn.send(req).await.unwrap()).await.unwrap();
                match reply.status {
                    StatusCode::UNAUTHORIZED => refused += 1,
                    StatusCode::OK => served += 1,
                    other => panic!("token {i}: {other} {}", reply.text()),
                }
            }
        });
    }
    let totals = tokio::time::timeout(ROUND_BOUND, async {
        let mut totals = (0, 0);
        while let Some(done) = senders.join_next().await {
            let (refused, served) = done.unwrap();
            totals.0 += refused;
            totals.1 += served;
        }
        totals
    })
    .await;
    totals.unwrap_or_else(|_| panic!("{count} tokens not sent within {ROUND_BOUND:?}"))
}

/// Each token a new user's (`good-<i>`): service-account tokens of those names, signed by the
/// stand-in's issuer.
fn new_users(api: &ApiServer, first: usize, count: usize) -> Arc<Vec<String>> {
    let tokens = (0..first + count)
        .map(|i| {
            if i < first {
                return String::new();
            }
            api.sign_token(&service_account_claims("flood", &format!("good-{i}")), None)
        })
        .collect();
    Arc::new(tokens)
}

/// The service account a token names, from its (unverified) claims.
fn account(token: &str) -> Option<String> {
    use base64::Engine as _;
    let claims = token.split('.').nth(1)?;
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims)
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&claims).ok()?;
    claims["sub"].as_str().map(str::to_owned)
}

/// The binary reviewing with a stand-in that answers the account `good-<n>` as user `user-<n>`
/// (allowed) and every other token with a quiet rejection; it holds the issuer's keys.
async fn flooded_proxy() -> (ApiServer, Standalone) {
    let api = ApiServer::start().await;
    api.set_token_rule(|token| {
        match account(token)
            .as_deref()
            .and_then(|account| account.strip_prefix("system:serviceaccount:flood:good-"))
        {
            Some(n) => Ok(TokenUser::new(&format!("user-{n}"))),
            // Not authenticated, without an error: the answer the token cache keeps (T2).
            None => Err(String::new()),
        }
    });
    api.set_rules(|_| Verdict::allow());
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let proxy = Standalone::start(
        &[
            "--authentication-token-webhook",
            "--authorization-mode=Webhook",
            &kubeconfig,
        ],
        &[],
        "json",
    )
    .await;
    eventually("the issuer's keys fetched", || async {
        (proxy
            .metric("kubelet_auth_proxy_service_account_keys", &[])
            .await
            > 0.0)
            .then_some(())
    })
    .await;
    (api, proxy)
}

/// Sends `rounds` rounds of `per_round` new distinct tokens and returns the resident memory
/// (KiB) after each; checks every answer and that a certificate user is served throughout.
async fn flood(proxy: &Standalone, api: &ApiServer, rounds: usize, per_round: usize) -> Vec<u64> {
    let client = proxy.client(Identity::None);
    let alice = proxy.client(Identity::of(&proxy.ca.issue(&CertSpec::client("alice"))));
    let mut rss = Vec::new();
    for r in 0..rounds {
        let tokens = new_users(api, r * per_round, per_round);
        let (refused, served) = round(&client, r * per_round, per_round, &tokens).await;
        assert_eq!(served, per_round, "round {r}: new users served");
        assert_eq!(refused, 0, "round {r}: nothing refused");
        assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
        rss.push(proxy.usage().rss_kib);
    }
    assert_eq!(api.arrivals(Kind::TokenReview), rounds * per_round);
    println!("resident memory after each round of {per_round} tokens (KiB): {rss:?}");
    rss
}

/// What CI can afford on a two-core machine (about 500 tokens a second through a debug build):
/// twelve thousand distinct tokens of new users, each answered as it must be
/// while a certificate user keeps being served, and memory growing by less than 16 MiB after
/// the first round; the caps themselves are shown by the cache's unit test and, end to end, by
/// the full-scale test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_tokens_leaves_memory_bounded() {
    const BOUND_KIB: u64 = 16 * 1024;
    let (api, proxy) = flooded_proxy().await;
    let rss = flood(&proxy, &api, 3, 4_000).await;
    assert!(
        rss[2] <= rss[0] + BOUND_KIB,
        "resident memory grew from {} to {} KiB",
        rss[0],
        rss[2]
    );
}

/// Full scale: four rounds of 20,000 distinct tokens (80,000: the token cache's cap overflowed
/// almost five times, the authorization cache's three times). Once both caches are full (after
/// the second round) the memory plateaus: the last two rounds, 40,000 more tokens whose entries
/// would take about 30 MiB if they were kept (the first round's 20,000 took 18 MiB on top of the
/// start), may not raise it by more than 8 MiB (measured: 3 MiB, allocator noise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about three minutes on a two-core machine; run with --ignored"]
async fn distinct_tokens_overflowing_both_caps_leave_memory_flat() {
    const PLATEAU_SLACK_KIB: u64 = 8 * 1024;
    let (api, proxy) = flooded_proxy().await;
    let rss = flood(&proxy, &api, 4, 20_000).await;
    assert!(
        rss[3] <= rss[1] + PLATEAU_SLACK_KIB,
        "resident memory kept growing after the caches were full: {rss:?} KiB"
    );
}
