//! The five situations of issue 19's table, each with its own stand-in API server and proxies.
//! Client phases are fixed, so a rerun sends the same requests at the same offsets; what varies
//! is the proxies' own random first lifetimes (drawn by each process) and the machine's timing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::apiserver::{ApiServer, Kind};

use super::figures::{self, Span};
use super::scrape::{self, Pace, Sample, Scraper};
use super::{Outcome, Stage, answer_normally, answer_too_many_requests};

/// How long the API server answers reviews in the ordinary case.
const REVIEW_DELAY: Duration = Duration::from_millis(5);
/// Time for the clients to open their connections before the situation's start.
const LEAD: Duration = Duration::from_millis(500);
/// The scrape interval of every scraper.
const SCRAPE: Duration = Duration::from_secs(1);
/// The 429 period of situations 2 and 3.
const THROTTLED: Duration = Duration::from_secs(6);
/// The `Retry-After` of its 429s, in seconds.
const RETRY_AFTER_SECONDS: u32 = 2;
/// Arrivals closer than this count as "at the same instant".
const SAME_INSTANT: Duration = Duration::from_millis(10);
/// The kubelet's four metrics endpoints, as Prometheus scrapes them.
const METRICS_PATHS: [&str; 4] = [
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/probes",
    "/metrics/resource",
];

/// Every review call logged by `api` from `origin` on, as offsets from it.
fn spans(api: &ApiServer, origin: Instant) -> Vec<Span> {
    api.calls()
        .iter()
        .filter_map(|call| {
            Some(Span {
                arrived: call.arrived.checked_duration_since(origin)?,
                answered: call.answered.checked_duration_since(origin)?,
            })
        })
        .collect()
}

/// The address of the one proxy of a situation.
fn only(proxies: &[super::node::Proxy]) -> anyhow::Result<std::net::SocketAddr> {
    match proxies {
        [proxy] => Ok(proxy.addr()),
        _ => anyhow::bail!("expected one proxy, started {}", proxies.len()),
    }
}

/// How many requests were not answered 200, and the first reason.
fn failures(samples: &[Sample]) -> (usize, Option<String>) {
    let failed: Vec<&Sample> = samples.iter().filter(|s| !s.ok()).collect();
    let first = failed.first().map(|s| match &s.outcome {
        Ok(status) => format!("status {status}"),
        Err(e) => e.clone(),
    });
    (failed.len(), first)
}

fn failure_note(samples: &[Sample]) -> String {
    match failures(samples) {
        (0, _) => String::new(),
        (n, first) => format!(
            "; {n} of {} requests failed (first: {})",
            samples.len(),
            first.unwrap_or_default()
        ),
    }
}

/// 1. One proxy, four endpoints scraped once a second with one token: reviews in 30 s against
///    the ideal, every key once per TTL.
pub async fn steady(stage: &Stage) -> anyhow::Result<Outcome> {
    const RUN: Duration = Duration::from_secs(30);
    let api = stage.api_server(REVIEW_DELAY).await;
    let proxies = stage.proxies(&api, "steady", 1).await?;
    let addr = only(&proxies)?;
    let origin = Instant::now() + LEAD;
    let scrapers = METRICS_PATHS
        .iter()
        .enumerate()
        .map(|(i, path)| Scraper {
            addr,
            path: (*path).to_owned(),
            token: "prometheus".to_owned(),
            first: origin + SCRAPE * i as u32 / METRICS_PATHS.len() as u32,
            pace: Pace::Every(SCRAPE),
            until: origin + RUN,
        })
        .collect();
    let samples: Vec<Sample> = scrape::run_all(stage.dialer(), scrapers).await.concat();
    let reviews = figures::within(&spans(&api, origin), Duration::ZERO, RUN).len();
    // The keys, read from what was reviewed: distinct tokens, distinct access specs.
    let tokens: BTreeSet<String> = api
        .token_reviews()
        .iter()
        .filter_map(|spec| spec["token"].as_str().map(str::to_owned))
        .collect();
    let accesses: BTreeSet<String> = api.access_reviews().iter().map(|s| s.to_string()).collect();
    let ideal = tokens.len() as f64 * RUN.as_secs_f64() / stage.token_ttl.as_secs_f64()
        + accesses.len() as f64 * RUN.as_secs_f64() / stage.authorized_ttl.as_secs_f64();
    let bound = ideal * 1.25;
    Ok(Outcome {
        number: 1,
        situation: "steady scraping: 4 endpoints once a second, one token, 30 s",
        measured: format!(
            "{reviews} reviews ({} TokenReview, {} SubjectAccessReview) in 30 s; ideal {ideal:.1} \
             ({} token, {} access key){}",
            api.arrivals(Kind::TokenReview),
            api.arrivals(Kind::SubjectAccessReview),
            tokens.len(),
            accesses.len(),
            failure_note(&samples)
        ),
        before: "17 reviews against an ideal of 17.5",
        target: format!("≤ {bound:.1} (ideal + ¼), every request answered"),
        met: (reviews as f64) <= bound && failures(&samples).0 == 0,
    })
}

/// The calls of a 429 period: how many arrived in it, the closest two, the most in flight, and
/// how long after it ended the first request was answered 200.
struct Throttled {
    calls: usize,
    closest: Option<Duration>,
    in_flight: usize,
    back_after: Option<Duration>,
}

/// Answers 429 (`Retry-After: 2`) from `origin` for [`THROTTLED`], then normally, while
/// `scrapers` run (they should run on past the end, to see service come back).
async fn throttle(
    stage: &Stage,
    api: &ApiServer,
    origin: Instant,
    scrapers: Vec<Scraper>,
) -> (Throttled, Vec<Sample>) {
    let faults = async {
        tokio::time::sleep_until(origin.into()).await;
        answer_too_many_requests(api, RETRY_AFTER_SECONDS);
        tokio::time::sleep_until((origin + THROTTLED).into()).await;
        answer_normally(api, REVIEW_DELAY);
    };
    let ((), samples) = tokio::join!(faults, scrape::run_all(stage.dialer(), scrapers));
    let samples = samples.concat();
    let inside = figures::within(&spans(api, origin), Duration::ZERO, THROTTLED);
    let end = origin + THROTTLED;
    let back_after = samples
        .iter()
        .filter(|s| s.ok() && s.sent + s.latency >= end)
        .map(|s| (s.sent + s.latency) - end)
        .min();
    let throttled = Throttled {
        calls: inside.len(),
        closest: figures::closest_arrivals(&inside),
        in_flight: figures::max_in_flight(&inside),
        back_after,
    };
    (throttled, samples)
}

/// The most calls a 429 period of P seconds with `Retry-After: R` allows: P/R + 1.
fn allowed_calls() -> usize {
    (THROTTLED.as_secs() / u64::from(RETRY_AFTER_SECONDS)) as usize + 1
}

fn describe(t: &Throttled) -> String {
    format!(
        "{} calls in 6 s, closest two {} apart, {} in flight at most; first 200 {} after the 429s stopped",
        t.calls,
        t.closest.map_or("-".to_owned(), figures::ms),
        t.in_flight,
        t.back_after
            .map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
    )
}

/// 2. The API server answers 429 with `Retry-After: 2` for 6 s while four clients, each with a
///    new token of its own, ask four times a second: calls in those 6 s, and the closest two.
pub async fn retry_after(stage: &Stage) -> anyhow::Result<Outcome> {
    let api = stage.api_server(REVIEW_DELAY).await;
    let proxies = stage.proxies(&api, "retry-after", 1).await?;
    let addr = only(&proxies)?;
    let origin = Instant::now() + LEAD;
    let interval = Duration::from_millis(250);
    let scrapers = (0..4u32)
        .map(|i| Scraper {
            addr,
            path: "/metrics".to_owned(),
            token: format!("client-{i}"),
            first: origin + interval * i / 4,
            pace: Pace::Every(interval),
            until: origin + THROTTLED + Duration::from_secs(3),
        })
        .collect();
    let (t, _) = throttle(stage, &api, origin, scrapers).await;
    let apart = t.closest.is_none_or(|d| d >= SAME_INSTANT);
    Ok(Outcome {
        number: 2,
        situation: "429 with `Retry-After: 2` for 6 s; 4 keys asked 4×/s",
        measured: describe(&t),
        before: "8 calls per key, two at the same instant",
        target: format!(
            "≤ {} calls for all keys together (P/R + 1), none within {} of another",
            allowed_calls(),
            figures::ms(SAME_INSTANT)
        ),
        met: t.calls <= allowed_calls() && apart,
    })
}

/// 3. Fifty clients on one new token during the same 429s, each asking again 100 ms after each
///    answer: calls in 6 s and the most in flight.
pub async fn one_new_token(stage: &Stage) -> anyhow::Result<Outcome> {
    let api = stage.api_server(REVIEW_DELAY).await;
    let proxies = stage.proxies(&api, "one-token", 1).await?;
    let addr = only(&proxies)?;
    let origin = Instant::now() + LEAD;
    let scrapers = (0..50)
        .map(|_| Scraper {
            addr,
            path: "/metrics".to_owned(),
            token: "new-token".to_owned(),
            first: origin,
            pace: Pace::After(Duration::from_millis(100)),
            until: origin + THROTTLED + Duration::from_secs(3),
        })
        .collect();
    let (t, _) = throttle(stage, &api, origin, scrapers).await;
    Ok(Outcome {
        number: 3,
        situation: "50 clients on one new token during the same 429s",
        measured: describe(&t),
        before: "7 calls in 6 s, 1 in flight",
        target: format!("≤ {} calls, 1 in flight", allowed_calls()),
        met: t.calls <= allowed_calls() && t.in_flight <= 1,
    })
}

/// 4. Twenty proxies started at one moment, each scraped once a second at its own phase with
///    one token: reviews per second; peak and mean per second from three TTLs on.
pub async fn started_together(stage: &Stage) -> anyhow::Result<Outcome> {
    const PROXIES: u32 = 20;
    const MEASURED: Duration = Duration::from_secs(30);
    let settle = stage.token_ttl.max(stage.authorized_ttl) * 3;
    let run = settle + MEASURED;
    let api = stage.api_server(REVIEW_DELAY).await;
    let proxies = stage.proxies(&api, "fleet", PROXIES as usize).await?;
    let origin = Instant::now() + LEAD;
    let scrapers = proxies
        .iter()
        .zip(0u32..)
        .map(|(proxy, i)| Scraper {
            addr: proxy.addr(),
            path: "/metrics".to_owned(),
            token: "prometheus".to_owned(),
            first: origin + SCRAPE * i / PROXIES,
            pace: Pace::Every(SCRAPE),
            until: origin + run,
        })
        .collect();
    let samples: Vec<Sample> = scrape::run_all(stage.dialer(), scrapers).await.concat();
    let seconds = usize::try_from(run.as_secs()).unwrap_or(usize::MAX);
    let per_second = figures::per_window(&spans(&api, origin), SCRAPE, seconds);
    let from = usize::try_from(settle.as_secs())
        .unwrap_or(seconds)
        .min(seconds);
    let (peak, mean) = figures::peak_and_mean(&per_second[from..]);
    let (first_peak, _) = figures::peak_and_mean(&per_second[..from]);
    let ratio = if mean > 0.0 { peak as f64 / mean } else { 0.0 };
    eprintln!("fleet-live: reviews per second: {per_second:?}");
    Ok(Outcome {
        number: 4,
        situation: "20 proxies started at one moment, each scraped once a second at its own phase",
        measured: format!(
            "first {}s: peak {first_peak}/s; from {}s on: peak {peak}/s, mean {mean:.1}/s, \
             peak {ratio:.2}× the mean{}",
            settle.as_secs(),
            settle.as_secs(),
            failure_note(&samples)
        ),
        before: "60 in one second, then none for five, every TTL; peak 3.2× the mean after three TTLs",
        target: "peak ≤ 2× the mean from the third TTL on".to_owned(),
        met: ratio <= 2.0 && mean > 0.0,
    })
}

/// 5. One key asked 20 times a second (20 connections, each once a second at its own phase),
///    reviews taking 200 ms, for 30 s after a first request fills the caches: request latency.
pub async fn hot_key(stage: &Stage) -> anyhow::Result<Outcome> {
    const CONNECTIONS: u32 = 20;
    const RUN: Duration = Duration::from_secs(30);
    const SLOW_REVIEW: Duration = Duration::from_millis(200);
    let api = stage.api_server(SLOW_REVIEW).await;
    let proxies = stage.proxies(&api, "hot-key", 1).await?;
    let addr = only(&proxies)?;
    let scraper = |first: Instant, pace, until| Scraper {
        addr,
        path: "/metrics".to_owned(),
        token: "hot-token".to_owned(),
        first,
        pace,
        until,
    };
    // The key's first request waits for both reviews (400 ms); it is not part of the figures.
    let now = Instant::now();
    let warm = scrape::run_all(
        stage.dialer(),
        vec![scraper(
            now,
            Pace::Every(RUN),
            now + Duration::from_millis(1),
        )],
    )
    .await
    .concat();
    anyhow::ensure!(
        warm.iter().all(Sample::ok),
        "the first request failed{}",
        failure_note(&warm)
    );
    let origin = Instant::now() + LEAD;
    let scrapers = (0..CONNECTIONS)
        .map(|i| {
            scraper(
                origin + SCRAPE * i / CONNECTIONS,
                Pace::Every(SCRAPE),
                origin + RUN,
            )
        })
        .collect();
    let samples: Vec<Sample> = scrape::run_all(stage.dialer(), scrapers).await.concat();
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let (p50, p99, max) = (
        figures::percentile(&latencies, 0.50).unwrap_or_default(),
        figures::percentile(&latencies, 0.99).unwrap_or_default(),
        figures::percentile(&latencies, 1.0).unwrap_or_default(),
    );
    let reviews = figures::within(&spans(&api, origin), Duration::ZERO, RUN).len();
    // A request that waited for a review took at least half of one; anything shorter is the
    // machine's own noise.
    let waited: Vec<String> = samples
        .iter()
        .filter(|s| s.latency >= SLOW_REVIEW / 2)
        .map(|s| {
            format!(
                "{} at {:.2} s",
                figures::ms(s.latency),
                s.sent.saturating_duration_since(origin).as_secs_f64()
            )
        })
        .collect();
    let waited_note = match waited.len() {
        0 => "none waited ≥ 100 ms".to_owned(),
        n => format!("{n} waited ≥ 100 ms ({})", waited.join(", ")),
    };
    Ok(Outcome {
        number: 5,
        situation: "one key asked 20×/s, reviews taking 200 ms, 30 s",
        measured: format!(
            "{} requests: p50 {}, p99 {}, max {}; {waited_note}; {reviews} reviews{}",
            samples.len(),
            figures::ms(p50),
            figures::ms(p99),
            figures::ms(max),
            failure_note(&samples)
        ),
        before: "p50 1 ms, p99 404 ms",
        target: "p99 within 5 ms of p50".to_owned(),
        met: p99.saturating_sub(p50) <= Duration::from_millis(5)
            && failures(&samples).0 == 0
            && !samples.is_empty(),
    })
}
