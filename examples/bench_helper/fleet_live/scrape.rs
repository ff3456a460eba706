//! The clients of the live fleet, as a scraper sends them: each on one kept-alive TLS connection
//! opened before its first request (so no handshake is timed), with a bearer token, either on a
//! fixed schedule (Prometheus: every interval at its own phase, whatever the answers took) or
//! again a pause after each answer (a client retrying). Every request's send time, latency and
//! status are kept for the situations to read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::Request;
use http::header::{AUTHORIZATION, HOST};
use http_body_util::{BodyExt as _, Empty};
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

/// Bounds opening one connection (TCP, TLS, HTTP handshakes).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds one request, body included; longer than any review deadline of the proxy.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens TLS connections to the proxies, trusting the run's CA.
pub struct Dialer {
    tls: TlsConnector,
}

impl Dialer {
    /// Trusts `ca` (the CA that signed the proxies' serving certificate).
    pub fn new(ca: &CertificateDer<'static>) -> anyhow::Result<Dialer> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone()).context("the run's CA certificate")?;
        let config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Dialer {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }

    async fn open(&self, addr: SocketAddr) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
        let name = ServerName::IpAddress(addr.ip().into());
        crate::client::open_http1(&self.tls, addr, name, OPEN_TIMEOUT).await
    }
}

/// When a client sends its next request.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// At `first + k × interval`; a slot that passed while a request was out is skipped.
    Every(Duration),
    /// This long after each answer.
    After(Duration),
}

/// One client: where, what, with which token, and when.
#[derive(Debug, Clone)]
pub struct Scraper {
    /// The proxy.
    pub addr: SocketAddr,
    /// Path requested.
    pub path: String,
    /// Bearer token sent.
    pub token: String,
    /// The first request's time.
    pub first: Instant,
    /// When the next ones go.
    pub pace: Pace,
    /// No request is sent at or after this time.
    pub until: Instant,
}

/// One request sent.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent.
    pub sent: Instant,
    /// How long until its whole answer was read.
    pub latency: Duration,
    /// The status answered, or why there was none.
    pub outcome: Result<u16, String>,
}

impl Sample {
    /// Whether the proxy answered 200.
    pub fn ok(&self) -> bool {
        self.outcome == Ok(200)
    }
}

/// Runs every scraper to its end; their samples, in the scrapers' order.
pub async fn run_all(dialer: &Arc<Dialer>, scrapers: Vec<Scraper>) -> Vec<Vec<Sample>> {
    let count = scrapers.len();
    let mut running = JoinSet::new();
    for (index, scraper) in scrapers.into_iter().enumerate() {
        let dialer = Arc::clone(dialer);
        running.spawn(async move { (index, run(&dialer, scraper).await) });
    }
    let mut samples = vec![Vec::new(); count];
    while let Some(joined) = running.join_next().await {
        match joined {
            Ok((index, taken)) => samples[index] = taken,
            // A scraper task cannot panic short of a bug in hyper; its samples are lost and the
            // situation then reports fewer requests than sent.
            Err(e) => eprintln!("fleet-live: a client task failed: {e}"),
        }
    }
    samples
}

/// Runs one scraper: a connection opened now, then requests on its pace until its end. A failed
/// connection is reopened for the next request.
async fn run(dialer: &Dialer, scraper: Scraper) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut sender = dialer.open(scraper.addr).await;
    let mut next = scraper.first;
    while next < scraper.until {
        tokio::time::sleep_until(next.into()).await;
        let sent = Instant::now();
        let outcome = match &mut sender {
            Ok(open) => get(open, &scraper.path, &scraper.token)
                .await
                .map_err(|e| format!("{e:#}")),
            Err(e) => Err(format!("{e:#}")),
        };
        let latency = sent.elapsed();
        if outcome.is_err() {
            sender = dialer.open(scraper.addr).await;
        }
        samples.push(Sample {
            sent,
            latency,
            outcome,
        });
        next = match scraper.pace {
            Pace::After(pause) => Instant::now() + pause,
            Pace::Every(interval) => {
                let mut slot = next + interval;
                while slot < Instant::now() {
                    slot += interval;
                }
                slot
            }
        };
    }
    samples
}

/// Sends `GET path` with the bearer token and reads the whole answer; its status.
async fn get(
    sender: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    token: &str,
) -> anyhow::Result<u16> {
    let exchange = async {
        sender.ready().await?;
        let request = Request::get(path)
            .header(HOST, "127.0.0.1")
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .body(Empty::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        anyhow::Ok(status)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .context("request timed out")?
}
