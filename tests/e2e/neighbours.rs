//! Failing neighbours under live traffic: the kubelet restarting, the API server down, slow,
//! failing, throttling or answering too much, the certificates rotated, and ten thousand
//! connections come and gone. Background traffic over keep-alive connections runs while the
//! neighbour fails; every answer is tallied by phase, and the proxy must answer each request
//! within a bounded time, fail closed while the neighbour is away, recover when it is back, and
//! (measured from outside, in `/proc/<pid>`) keep no descriptor, thread or memory it took.

use std::time::Duration;

use http::StatusCode;

use crate::support::apiserver::{ApiServer, Fault, Kind, Target, TokenUser, Verdict};
use crate::support::client::{Body, Client, Identity, bearer, empty, request};
use crate::support::harness::{Harness, ProxySpec};
use crate::support::load::Load;
use crate::support::pki::{Authority, CertSpec};
use crate::support::procfs::{self, Usage};
use crate::support::standalone::Standalone;
use crate::support::traffic::{Traffic, Worker, unexpected};
use crate::support::{eventually, within};

/// How long the proxy may take to hand back what a finished scenario used (idle tokio blocking
/// threads linger 10 s before they exit).
const SETTLE: Duration = Duration::from_secs(20);
/// The most a phase may take to show the answers it waits for.
const PHASE: Duration = Duration::from_secs(30);

const CONNECTIONS_OPEN: &str = "kubelet_auth_proxy_connections_open";
const STREAMS_OPEN: &str = "kubelet_auth_proxy_upgraded_streams_open";

fn get(path: &str) -> http::Request<Body> {
    request("GET", path).body(empty()).unwrap()
}

/// Asserts that `worker` saw only answers starting with one of `allowed` in `phase` (requests
/// that straddled two phases aside), and at least one of them.
fn assert_only(
    traffic: &crate::support::traffic::Tally,
    worker: &'static str,
    phase: usize,
    allowed: &[&str],
) {
    let seen = traffic.get(&(worker, phase)).cloned().unwrap_or_default();
    let mut allowed = allowed.to_vec();
    allowed.push("straddled");
    let odd = unexpected(&seen, &allowed);
    assert!(
        odd.is_empty(),
        "{worker}, phase {phase}: unexpected answers {odd:?}; all: {seen:?}"
    );
    assert!(
        seen.iter().any(|(what, _)| what != "straddled"),
        "{worker}, phase {phase}: no answer at all"
    );
}

/// Waits until the proxy has no client connection nor upgraded stream open.
async fn connections_closed(proxy: &Standalone) {
    eventually("the proxy's connections and streams are closed", || async {
        let connections = proxy.metric(CONNECTIONS_OPEN, &[]).await;
        let streams = proxy.metric(STREAMS_OPEN, &[]).await;
        (connections == 0.0 && streams == 0.0).then_some(())
    })
    .await;
}

/// The usage once the descriptor count has held still for half a second (a connection just
/// closed by a peer, e.g. the admin request that checked the metrics, takes a moment to go).
async fn steady(proxy: &Standalone) -> Usage {
    within("the descriptor count holds still", async {
        let mut last = proxy.usage();
        let mut still = 0;
        while still < 5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = proxy.usage();
            still = if now.fds == last.fds { still + 1 } else { 0 };
            last = now;
        }
        last
    })
    .await
}

/// Waits until the proxy holds exactly the descriptors of `baseline` and no more threads.
async fn back_to_baseline(proxy: &Standalone, baseline: Usage) -> Usage {
    procfs::settles(
        proxy.process().pid(),
        &format!("descriptors and threads back to {baseline:?}"),
        SETTLE,
        |now| now.fds == baseline.fds && now.threads <= baseline.threads,
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// The kubelet restarting
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn kubelet_restart_under_live_traffic_is_502_then_recovers_and_leaks_nothing() {
    let mut proxy = Standalone::start(&["--authorization-mode=AlwaysAllow"], &[], "json").await;
    connections_closed(&proxy).await;
    let baseline = steady(&proxy).await;
    let alice = proxy.ca.issue(&CertSpec::client("alice"));
    let h2 = proxy.client(Identity::of(&alice));
    let http1 = proxy.http1_client(Identity::of(&alice));
    let workers = vec![
        Worker::new("h2 a", h2.clone(), |_| get("/pods")),
        Worker::new("h2 b", h2, |n| get(&format!("/echo?n={n}"))),
        Worker::new("http/1.1", http1, |_| get("/pods")),
    ];
    let names: Vec<&'static str> = vec!["h2 a", "h2 b", "http/1.1"];
    let traffic = Traffic::start(workers, Duration::from_secs(15));
    for name in &names {
        traffic.wait_for(name, 0, "200", 5, PHASE).await;
    }

    // Phases 1 and 3 are the moments the kubelet goes and comes back: a request answered then
    // may see either side, so only the phases around them are checked.
    traffic.set_phase(1);
    proxy.stop_kubelet().await;
    traffic.set_phase(2);
    const DOWN: &str = "502 Bad Gateway: kubelet unavailable: upstream";
    for name in &names {
        traffic.wait_for(name, 2, DOWN, 3, PHASE).await;
    }
    // Refusals and the admin endpoints are unaffected meanwhile.
    assert_eq!(
        proxy.client(Identity::None).get("/pods").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(proxy.admin_get("/healthz").await.status, StatusCode::OK);

    traffic.set_phase(3);
    proxy.restart_kubelet().await;
    traffic.set_phase(4);
    for name in &names {
        traffic.wait_for(name, 4, "200", 5, PHASE).await;
    }
    let tally = traffic.stop().await;
    println!("kubelet restart: {tally:#?}");
    for name in names.iter().copied() {
        assert_only(&tally, name, 0, &["200"]);
        assert_only(&tally, name, 2, &[DOWN]);
        assert_only(&tally, name, 4, &["200"]);
    }

    // Nothing left behind: no client connection, no stream; with the new kubelet up, at most one
    // idle pooled connection per worker; with it gone too, exactly the descriptors of the start.
    connections_closed(&proxy).await;
    procfs::settles(
        proxy.process().pid(),
        "only pooled connections to the new kubelet beyond the baseline",
        SETTLE,
        |now| now.fds <= baseline.fds + names.len(),
    )
    .await;
    proxy.stop_kubelet().await;
    let after = back_to_baseline(&proxy, baseline).await;
    println!("kubelet restart: baseline {baseline:?}, after {after:?}");
}

// ---------------------------------------------------------------------------------------------
// The API server failing
// ---------------------------------------------------------------------------------------------

/// The retry budget of one review (5 attempts of at most `--apiserver-request-timeout=1s`,
/// sleeps of at most 4.875 s between them), with room for a loaded machine.
const RETRY_BUDGET: Duration = Duration::from_secs(15);
const UNAUTHORIZED: &str = "401 Unauthorized";
const AUTHORIZATION_ERROR: &str = "500 Authorization error (user=fresh-";

/// The stand-in and a proxy asking it for both reviews, with traffic in three workers: a token
/// reviewed before the fault and a certificate user authorized before it (both cached, as the
/// kubelet's caches would hold them), and a new token (and so a new user) per request.
async fn api_scenario() -> (ApiServer, Harness, Traffic) {
    let api = ApiServer::start().await;
    api.add_token("tok-cached", TokenUser::new("cached"));
    // tok-fresh-<n> is user fresh-<n>: every request needs both a TokenReview and a SAR.
    api.set_token_rule(|token| match token.strip_prefix("tok-fresh-") {
        Some(n) => Ok(TokenUser::new(&format!("fresh-{n}"))),
        None => Err("invalid bearer token".to_owned()),
    });
    api.set_rules(|_| Verdict::allow());
    let h = ProxySpec::new(&[
        "--authentication-token-webhook",
        "--authorization-mode=Webhook",
        "--apiserver-request-timeout=1s",
    ])
    .apiserver(&api)
    .start()
    .await;
    let alice = h.user("alice", &[]);
    let anonymous = h.anonymous();
    assert_eq!(alice.get("/pods").await.status, StatusCode::OK);
    assert_eq!(
        anonymous.send(bearer("/pods", "tok-cached")).await.status,
        StatusCode::OK
    );
    let traffic = Traffic::start(
        vec![
            Worker::new("cached token", anonymous.clone(), |_| {
                bearer("/pods", "tok-cached")
            }),
            Worker::new("cached certificate", alice, |_| get("/pods")),
            Worker::new("fresh token", anonymous, |n| {
                bearer("/pods", &format!("tok-fresh-{n}-{}", std::process::id()))
            }),
        ],
        RETRY_BUDGET,
    );
    // Phase 0 lasts until every worker has been answered: a worker whose first request needed
    // a new upstream connection (a TLS handshake) is not left without an answer in it.
    traffic.wait_for("fresh token", 0, "200", 3, PHASE).await;
    traffic.wait_for("cached token", 0, "200", 1, PHASE).await;
    traffic
        .wait_for("cached certificate", 0, "200", 1, PHASE)
        .await;
    (api, h, traffic)
}

/// Checks the tally of an API server scenario: every phase, cached identities and decisions
/// served; new tokens served outside the faults (even phases) and answered `during` in the odd
/// phases `faults` lists; nothing overdue and no transport error anywhere.
fn assert_api_tally(tally: &crate::support::traffic::Tally, faults: &[(usize, &str)]) {
    let last = faults.iter().map(|(phase, _)| phase + 1).max().unwrap();
    for phase in 0..=last {
        assert_only(tally, "cached token", phase, &["200"]);
        assert_only(tally, "cached certificate", phase, &["200"]);
        let expected = faults
            .iter()
            .find(|(p, _)| *p == phase)
            .map_or("200", |(_, during)| *during);
        assert_only(tally, "fresh token", phase, &[expected]);
    }
}

#[tokio::test]
async fn api_server_down_under_live_traffic_fails_closed_and_recovers() {
    let (mut api, h, traffic) = api_scenario().await;
    api.stop().await;
    traffic.set_phase(1);
    for (worker, answer, n) in [
        ("fresh token", UNAUTHORIZED, 3),
        ("cached token", "200", 1),
        ("cached certificate", "200", 1),
    ] {
        traffic.wait_for(worker, 1, answer, n, PHASE).await;
    }
    api.restart().await;
    traffic.set_phase(2);
    for (worker, n) in [
        ("fresh token", 3),
        ("cached token", 1),
        ("cached certificate", 1),
    ] {
        traffic.wait_for(worker, 2, "200", n, PHASE).await;
    }
    let tally = traffic.stop().await;
    println!("API server down: {tally:#?}");
    assert_api_tally(&tally, &[(1, UNAUTHORIZED)]);
    h.shutdown().await;
}

/// Runs each fault in its own phase (odd), with a recovery phase after it (even): `during` is
/// what a new token gets while the fault lasts.
async fn api_faults_under_traffic(faults: &[(Target, Fault, &'static str)]) {
    let (api, h, traffic) = api_scenario().await;
    let mut phases = Vec::new();
    for (i, (target, fault, during)) in faults.iter().enumerate() {
        let phase = 2 * i + 1;
        api.inject(*target, fault.clone(), 1_000_000);
        traffic.set_phase(phase);
        // Each phase lasts until every worker has been answered in it: a fault that fails fast
        // would otherwise end the phase before the cached workers' next answers.
        for (worker, answer, n) in [
            ("fresh token", *during, 1),
            ("cached token", "200", 1),
            ("cached certificate", "200", 1),
        ] {
            traffic.wait_for(worker, phase, answer, n, PHASE).await;
        }
        api.clear_faults();
        traffic.set_phase(phase + 1);
        for (worker, n) in [
            ("fresh token", 2),
            ("cached token", 1),
            ("cached certificate", 1),
        ] {
            traffic.wait_for(worker, phase + 1, "200", n, PHASE).await;
        }
        phases.push((phase, *during));
    }
    let tally = traffic.stop().await;
    println!("API server faults: {tally:#?}");
    assert_api_tally(&tally, &phases);
    h.shutdown().await;
}

#[tokio::test]
async fn api_server_slow_or_oversized_under_live_traffic_fails_closed_and_recovers() {
    api_faults_under_traffic(&[
        // Beyond the 1 s timeout: not retried (a client-side timeout), 401.
        (
            Target::Both,
            Fault::Slow(Duration::from_secs(3)),
            UNAUTHORIZED,
        ),
        // Just over the 1 MiB cap: the read stops at the cap, 401.
        (
            Target::Both,
            Fault::Oversized {
                bytes: (1 << 20) + (1 << 19),
            },
            UNAUTHORIZED,
        ),
        // The SAR too large: the token is reviewed, the authorization fails, 500.
        (
            Target::Only(Kind::SubjectAccessReview),
            Fault::Oversized {
                bytes: (1 << 20) + (1 << 19),
            },
            AUTHORIZATION_ERROR,
        ),
    ])
    .await;
}

#[tokio::test]
async fn api_server_5xx_or_429_under_live_traffic_fails_closed_after_the_retries() {
    api_faults_under_traffic(&[
        // Retried five times, then 401: the whole budget, no longer.
        (Target::Both, Fault::InternalError, UNAUTHORIZED),
        (
            Target::Only(Kind::SubjectAccessReview),
            Fault::TooManyRequests {
                retry_after_seconds: 1,
            },
            AUTHORIZATION_ERROR,
        ),
    ])
    .await;
}

// ---------------------------------------------------------------------------------------------
// Certificate rotation
// ---------------------------------------------------------------------------------------------

/// Waits until new connections of `client` are served `expected`.
async fn serving(client: &Client, expected: &rustls::pki_types::CertificateDer<'static>) {
    eventually(
        "new connections get the rotated serving certificate",
        || async {
            let conn = client.connect().await.unwrap();
            (conn.peer_certificate() == expected).then_some(())
        },
    )
    .await;
}

/// An operator's whole rotation, under load from clients of the old and then the new client CA:
/// the serving certificate and key swapped (as a Secret update), the new client CA added next to
/// the old one, clients moved to it, the old one retired. No request of either load may fail.
#[tokio::test]
async fn certificate_rotation_under_live_traffic_fails_no_request() {
    let mut h = ProxySpec::always_allow(&[]).serving_volume().start().await;
    let next_ca = Authority::root("next client CA");
    let old_client = Identity::of(&h.ca.issue(&CertSpec::client("old-client")));
    let new_client = Identity::of(&next_ca.issue(&CertSpec::client("new-client")));
    let old_load = Load::start(h.ca.cert(), h.addr(), &old_client, "/pods", "PodList");
    old_load.advance(20).await;

    let rotated = h.ca.issue(&CertSpec::server().common_name("rotated"));
    h.serving_volume().update(&[
        ("tls.crt", rotated.chain_pem()),
        ("tls.key", rotated.key_pem()),
    ]);
    let probe = h.user("probe", &[]);
    serving(&probe, rotated.leaf()).await;
    old_load.advance(20).await;

    std::fs::write(h.client_ca_file(), h.ca.pem() + &next_ca.pem()).unwrap();
    let newcomer = h.client(new_client.clone());
    eventually("a client of the added CA is accepted", || async {
        (newcomer.get("/pods").await.status == StatusCode::OK).then_some(())
    })
    .await;
    let new_load = Load::start(h.ca.cert(), h.addr(), &new_client, "/pods", "PodList");
    new_load.advance(20).await;
    old_load.advance(20).await;
    old_load
        .stop()
        .await
        .assert_no_failures("clients of the old CA, through the serving certificate rotation");

    std::fs::write(h.client_ca_file(), next_ca.pem()).unwrap();
    let leaver = h.client(old_client);
    eventually("a client of the retired CA is refused", || async {
        (leaver.get("/pods").await.status == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    new_load.advance(20).await;
    new_load
        .stop()
        .await
        .assert_no_failures("clients of the new CA, through the old CA's retirement");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Ten thousand connections
// ---------------------------------------------------------------------------------------------

/// Concurrent connection makers.
const MAKERS: usize = 50;
/// The longest the connections may take: ten thousand handshakes of a debug build on a busy
/// two-core machine take about 40 s.
const CONNECTIONS_BOUND: Duration = Duration::from_secs(150);

/// Opens `per_maker` connections in each of [`MAKERS`] tasks, one after another, rotating three
/// kinds: a TLS handshake only (HTTP/2 offered, nothing sent), an anonymous HTTP/2 request
/// refused by the proxy (401), and an HTTP/1.1 request forwarded to the kubelet (200). Returns
/// how many connections were made.
async fn open_and_close(proxy: &Standalone, per_maker: usize) -> usize {
    let anonymous = proxy.client(Identity::None);
    let alice = proxy.http1_client(Identity::of(&proxy.ca.issue(&CertSpec::client("alice"))));
    let mut makers = tokio::task::JoinSet::new();
    for maker in 0..MAKERS {
        let (anonymous, alice) = (anonymous.clone(), alice.clone());
        makers.spawn(async move {
            for i in 0..per_maker {
                match (maker + i) % 3 {
                    0 => drop(anonymous.connect().await.unwrap()),
                    1 => {
                        let reply = anonymous.get("/healthz").await;
                        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
                    }
                    _ => {
                        let reply = alice.get("/healthz").await;
                        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
                    }
                }
            }
        });
    }
    let drained = tokio::time::timeout(CONNECTIONS_BOUND, async {
        while let Some(done) = makers.join_next().await {
            done.unwrap();
        }
    });
    assert!(
        drained.await.is_ok(),
        "{} connections not made within {CONNECTIONS_BOUND:?}",
        MAKERS * per_maker
    );
    MAKERS * per_maker
}

/// Ten thousand connections opened and closed leave the descriptors exactly as they were and
/// the resident memory within 8 MiB of where it was. The baseline is taken after a warm-up of
/// the same shape, so that what the allocator and the TLS session cache keep for reuse is in it.
/// 8 MiB over 10,000 connections is under 840 bytes each: a leak of a connection's buffers (tens
/// of KiB) or of its task would far exceed it, while glibc's per-thread arenas, which keep freed
/// memory for reuse instead of returning it, stay within it. The kubelet is stopped before the
/// descriptors are counted, both times, so that the forwarder's idle pool (which keeps up to one
/// connection per concurrent request for 90 s, on purpose) is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_leave_descriptors_and_memory_at_baseline() {
    const GENEROUS_RSS_KIB: u64 = 8 * 1024;
    let mut proxy = Standalone::start(&["--authorization-mode=AlwaysAllow"], &[], "json").await;
    open_and_close(&proxy, 20).await;
    proxy.stop_kubelet().await;
    connections_closed(&proxy).await;
    let baseline = steady(&proxy).await;
    proxy.restart_kubelet().await;

    let made = open_and_close(&proxy, 200).await;
    assert_eq!(made, 10_000);
    proxy.stop_kubelet().await;
    connections_closed(&proxy).await;
    let after = back_to_baseline(&proxy, baseline).await;
    println!("10,000 connections: baseline {baseline:?}, after {after:?}");
    assert!(
        after.rss_kib <= baseline.rss_kib + GENEROUS_RSS_KIB,
        "resident memory grew from {} KiB to {} KiB",
        baseline.rss_kib,
        after.rss_kib
    );
    assert!(
        proxy
            .metric("kubelet_auth_proxy_requests_total", &[("code", "401")])
            .await
            >= 3000.0
    );
}
