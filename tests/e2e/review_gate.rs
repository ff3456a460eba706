//! The promise of one gate for what authentication costs the API server, as properties over
//! every class of token known: whatever one source sends, the TokenReviews it costs stay within
//! the budget of failures (`src/authn/failure_budget.rs`): forgeries of any size and spelling
//! cost none, a refused token replayed costs one; and whatever up to a node's worth of other
//! sources flood, a clean source's fresh valid token is reviewed and served. A new class of token
//! is one line in [`CLASSES`]; a new flood, one number in [`FLOODERS`].
//!
//! Classes only the real API server tells apart (a deleted service account's token, another
//! audience's, a real token spelled with unused bits set) are run against it too
//! (`real_apiserver_tokens.rs`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::StatusCode;
use serde_json::{Value, json};

use kubelet_auth_proxy::authn::failure_budget::{OVERALL_LIMITS, SOURCE_LIMITS};

use crate::support::apiserver::issuer::{ISSUER, service_account_claims};
use crate::support::apiserver::{ApiServer, Kind, TokenUser};
use crate::support::client::bearer;
use crate::support::harness::{Harness, ProxySpec};

/// Distinct tokens of a class sent from one source.
const DISTINCT: usize = 40;
/// Times the first token of a class is sent again afterwards.
const REPLAYS: usize = 20;

/// What the tokens of a class may cost the API server, sent from one source.
#[derive(Debug, Clone, Copy)]
enum Cost {
    /// Nothing: refused on the node.
    Nothing,
    /// At most the source's budget of failures, its burst and what its refill brought.
    SourceBudget,
    /// At most the node's budget of failures (verified service-account tokens are not held by
    /// their source's).
    NodeBudget,
}

/// A class of token: its name, how its `i`th token is made (and what the stand-in API server
/// is told of it), and what it may cost.
type Class = (&'static str, fn(&ApiServer, usize) -> String, Cost);

/// Every class of failing token known, one source sending each.
const CLASSES: &[Class] = &[
    ("random", |_, i| format!("random-{i}"), Cost::SourceBudget),
    (
        "refused with a reason",
        |api, i| {
            let token = format!("refused-{i}");
            api.reject_token(&token, "invalid bearer token");
            token
        },
        Cost::SourceBudget,
    ),
    (
        "forged signature",
        |api, i| forged(api, i, 0),
        Cost::Nothing,
    ),
    (
        "forged, over 16 KiB",
        |api, i| forged(api, i, 20_000),
        Cost::Nothing,
    ),
    (
        "forged, unused bits set",
        |api, i| with_unused_bits(&forged(api, i, 0)),
        Cost::Nothing,
    ),
    (
        "forged, other algorithm",
        |_, i| {
            let encode = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
            let claims = service_account_claims("flood", &format!("hs-{i}"));
            format!(
                "{}.{}.{}",
                encode(&json!({"alg": "HS256"})),
                encode(&claims),
                URL_SAFE_NO_PAD.encode([7u8; 32])
            )
        },
        Cost::Nothing,
    ),
    (
        "expired",
        |api, i| {
            let mut claims = service_account_claims("flood", &format!("expired-{i}"));
            claims["exp"] = json!(claims["iat"].as_u64().unwrap() - 3600);
            api.sign_token(&claims, None)
        },
        Cost::Nothing,
    ),
    (
        "another audience, checked on the node",
        |api, i| {
            let mut claims = service_account_claims("flood", &format!("aud-{i}"));
            claims["aud"] = json!(["https://other.example"]);
            api.sign_token(&claims, None)
        },
        Cost::Nothing,
    ),
    (
        "verified, refused by the API server (deleted service account)",
        |api, i| {
            let token = api.sign_token(
                &service_account_claims("flood", &format!("deleted-{i}")),
                None,
            );
            api.reject_token(&token, "service account flood/deleted has been deleted");
            token
        },
        Cost::NodeBudget,
    ),
    (
        "verified, rejected quietly",
        |api, i| {
            let token = api.sign_token(&service_account_claims("flood", &format!("q-{i}")), None);
            api.reject_token(&token, "");
            token
        },
        Cost::NodeBudget,
    ),
];

/// A token naming the issuer with a signature of random bytes, its claims `padding` bytes longer.
fn forged(api: &ApiServer, i: usize, padding: usize) -> String {
    let valid = api.sign_token(
        &json!({
            "pad": "x".repeat(padding),
            "iss": ISSUER,
            "sub": format!("system:serviceaccount:flood:forged-{i}"),
            "aud": [ISSUER],
            "exp": service_account_claims("flood", "x")["exp"],
        }),
        None,
    );
    let (head, _) = valid.rsplit_once('.').unwrap();
    format!("{head}.{}", URL_SAFE_NO_PAD.encode([i as u8; 256]))
}

/// `token` with the unused low bits of its signature's last character set: the same token for
/// Go's decoder.
fn with_unused_bits(token: &str) -> String {
    // A 256-byte signature ends in one byte: two characters, the last with 4 unused bits.
    let (head, signature) = token.rsplit_once('.').unwrap();
    let mut signature = signature.to_owned();
    let last = signature.pop().unwrap();
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let value = alphabet.find(last).unwrap();
    signature.push(alphabet.as_bytes()[value | 0b1111] as char);
    format!("{head}.{signature}")
}

fn source(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A proxy reviewing tokens with `api`, checking service-account tokens for `ISSUER`'s audience
/// on the node, allowing whoever is authenticated.
async fn proxy(api: &ApiServer) -> Harness {
    let h = ProxySpec::always_allow(&["--authentication-token-webhook", "--api-audiences", ISSUER])
        .apiserver(api)
        .start()
        .await;
    h.wait_for_issuer_keys().await;
    h
}

#[tokio::test]
async fn every_class_of_token_costs_at_most_its_budget() {
    for (name, make, cost) in CLASSES {
        let api = ApiServer::start().await;
        let h = proxy(&api).await;
        let tokens: Vec<String> = (0..DISTINCT).map(|i| make(&api, i)).collect();
        // HTTP/1.1, whose header limit (hyper's read buffer, 400 KB) is the larger: HTTP/2's
        // is 16 KiB.
        let client = h
            .http1_client(crate::support::client::Identity::None)
            .connecting_from(source(7));
        let started = Instant::now();
        let mut requests = tokio::task::JoinSet::new();
        for token in &tokens {
            let (client, token) = (client.clone(), token.clone());
            requests.spawn(async move { client.send(bearer("/pods", &token)).await.status });
            if requests.len() == 8 {
                assert_eq!(
                    requests.join_next().await.unwrap().unwrap(),
                    StatusCode::UNAUTHORIZED,
                    "{name}"
                );
            }
        }
        for status in requests.join_all().await {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}");
        }
        let refill = started.elapsed().as_secs_f64();
        let bound = match cost {
            Cost::Nothing => 0.0,
            Cost::SourceBudget => SOURCE_LIMITS.burst + (SOURCE_LIMITS.rate * refill).ceil(),
            Cost::NodeBudget => OVERALL_LIMITS.burst + (OVERALL_LIMITS.rate * refill).ceil(),
        };
        let reviews = api.arrivals(Kind::TokenReview);
        assert!(
            reviews as f64 <= bound,
            "{name}: {reviews} reviews, bound {bound}"
        );
        if !matches!(cost, Cost::Nothing) {
            assert!(reviews > 0, "{name}: some were reviewed");
        }
        // The first token again and again: its answer is cached, refused or not.
        for _ in 0..REPLAYS {
            let reply = client.send(bearer("/pods", &tokens[0])).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{name}");
        }
        assert_eq!(
            api.arrivals(Kind::TokenReview),
            reviews,
            "{name}: a replayed token costs nothing more"
        );
    }
}

/// Numbers of flooding sources: a few pods, a node's budget's worth, a node full of pods.
const FLOODERS: &[u8] = &[5, 20, 110];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_source_is_served_whatever_a_node_of_sources_floods() {
    for &flooders in FLOODERS {
        let api = ApiServer::start().await;
        let h = proxy(&api).await;
        let flooding = Arc::new(AtomicBool::new(true));
        let answered = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut floods = tokio::task::JoinSet::new();
        for last in 1..=flooders {
            let client = h.anonymous().connecting_from(source(last));
            let (flooding, answered) = (Arc::clone(&flooding), Arc::clone(&answered));
            floods.spawn(async move {
                let mut sent = 0usize;
                let Ok(mut connection) = client.connect().await else {
                    return 0;
                };
                while flooding.load(Ordering::Relaxed) {
                    let token = format!("flood-{last}-{sent}");
                    match connection.send(bearer("/pods", &token)).await {
                        Ok(response) => assert_eq!(response.status(), StatusCode::UNAUTHORIZED),
                        Err(_) => break,
                    }
                    if sent == 0 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    sent += 1;
                }
                sent
            });
        }
        // Until every flooder has had a token refused, so that none is in good standing (the
        // first token of each fresh source may wait for the refill like a clean one), and the
        // node's budget is spent.
        crate::support::eventually("every flooder refused once", || async {
            let skipped = h
                .metric(
                    "kubelet_auth_proxy_token_reviews_skipped_total",
                    &[("budget", "overall")],
                )
                .await;
            (answered.load(Ordering::Relaxed) == usize::from(flooders) && skipped > 0.0)
                .then_some(())
        })
        .await;
        for clean in 0..2 {
            let token = format!("clean-{clean}");
            api.add_token(&token, TokenUser::new(&format!("clean-user-{clean}")));
            let client = h.anonymous().connecting_from(source(200 + clean));
            let reply = client.send(bearer("/pods", &token)).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{flooders} flooders: clean source {clean}"
            );
        }
        flooding.store(false, Ordering::Relaxed);
        let sent: usize = floods.join_all().await.into_iter().sum();
        let failed = api.arrivals(Kind::TokenReview) - 2;
        let refill = (OVERALL_LIMITS.rate * started.elapsed().as_secs_f64()).ceil();
        let bound = OVERALL_LIMITS.burst + refill;
        assert!(
            failed as f64 <= bound,
            "{flooders} flooders sent {sent}: {failed} reviews, bound {bound}"
        );
    }
}
