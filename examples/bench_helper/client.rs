//! Load that oha cannot generate: thousands of idle TLS connections held open (for the proxy's
//! memory per connection), cold bursts where every request starts at the same instant on a
//! connection opened beforehand, each with its own bearer token if asked, and floods of tokens
//! never sent before (random, or JWTs forged for the cluster's issuer).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http::header::{AUTHORIZATION, HOST};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

use crate::standin::{BURST_ONE_TOKEN, BURST_TOKEN_PREFIX};

/// Bounds opening one connection (TCP, TLS handshake, HTTP handshake).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds one request, response body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections being opened at once.
const OPENING_AT_ONCE: usize = 64;

/// Where and how to connect.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The proxy's address.
    #[arg(long)]
    addr: SocketAddr,
    /// PEM bundle of the CA that signed the proxy's serving certificate.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate to present (PEM); none when omitted.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Path and query requested.
    #[arg(long, default_value = "/healthz")]
    path: String,
}

/// Options of `bench_helper idle`.
#[derive(Debug, clap::Args)]
pub struct IdleArgs {
    #[command(flatten)]
    target: Target,
    /// Connections to open.
    #[arg(long)]
    count: usize,
    /// Longest time the connections are held; SIGTERM or SIGINT closes them earlier.
    #[arg(long, default_value_t = 300)]
    hold_secs: u64,
}

/// Which bearer tokens a burst carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Tokens {
    /// No token: the requests rely on the client certificate (a baseline without API calls).
    None,
    /// The same token, unknown to the proxy, on every request.
    One,
    /// A different token on every request (`burst-<i>`).
    Distinct,
}

/// Options of `bench_helper burst`.
#[derive(Debug, clap::Args)]
pub struct BurstArgs {
    #[command(flatten)]
    target: Target,
    /// Requests fired at once, each on its own connection.
    #[arg(long, default_value_t = 500)]
    count: usize,
    /// The bearer tokens of the requests.
    #[arg(long, value_enum)]
    tokens: Tokens,
}

/// What a flood's tokens are; each request carries one never sent before, but for `replay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FloodTokens {
    /// 32 random bytes, base64url.
    Random,
    /// A JWT claiming `--issuer`, current and for its audience, naming `--kid`, with a random
    /// signature: what an attacker without the issuer's key can make.
    ForgedJwt,
    /// A forged JWT as above with 20 KB more of claims.
    OversizedForgedJwt,
    /// A forged JWT as above whose claims are spelled with their unused low bits set.
    NonCanonicalForgedJwt,
    /// The token in `--token-file`, sent again and again: a real token the API server refuses
    /// (a deleted service account's, or another audience's).
    Replay,
}

/// Options of `bench_helper flood`.
#[derive(Debug, clap::Args)]
pub struct FloodArgs {
    #[command(flatten)]
    target: Target,
    /// Concurrent clients, each on its own connection.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// How long the flood lasts.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The tokens sent.
    #[arg(long, value_enum)]
    tokens: FloodTokens,
    /// The issuer the forged JWTs claim.
    #[arg(long, default_value = "https://kubernetes.default.svc.cluster.local")]
    issuer: String,
    /// The key id the forged JWTs name (the issuer's real one makes a bad-signature forgery).
    #[arg(long, default_value = "")]
    kid: String,
    /// Client addresses the workers connect from, in turn: 127.0.0.1 up to 127.0.0.<n> (all
    /// loopback on Linux); 1 leaves the choice to the system.
    #[arg(long, default_value_t = 1)]
    sources: u8,
    /// The token `replay` sends.
    #[arg(long, required_if_eq("tokens", "replay"))]
    token_file: Option<PathBuf>,
    /// Every this many milliseconds, a clean source (127.0.0.250, sending nothing else) sends a
    /// token never sent before that the API server accepts: `<--probe-prefix><i>` (the stand-in
    /// knows `burst-0` … `burst-<n>`); its statuses and times are printed. 0: no probe.
    #[arg(long, default_value_t = 0)]
    probe_every_ms: u64,
    /// The prefix of the probe's tokens.
    #[arg(long, default_value = BURST_TOKEN_PREFIX)]
    probe_prefix: String,
    /// Seconds of flooding before the first probe.
    #[arg(long, default_value_t = 5)]
    probe_after: u64,
}

/// The clean source of `flood --probe-every-ms`.
const PROBE_SOURCE: [u8; 4] = [127, 0, 0, 250];

/// Options of `bench_helper silent`.
#[derive(Debug, clap::Args)]
pub struct SilentArgs {
    #[command(flatten)]
    target: Target,
    /// Silent connections to open.
    #[arg(long)]
    count: usize,
    /// The proxy's process ID, to read its open descriptors and resident memory.
    #[arg(long)]
    pid: Option<u32>,
}

/// Options of `bench_helper stalled`.
#[derive(Debug, clap::Args)]
pub struct StalledArgs {
    #[command(flatten)]
    target: Target,
    /// HTTP/2 connections to open.
    #[arg(long, default_value_t = 10)]
    connections: usize,
    /// Streams opened on each, never read.
    #[arg(long, default_value_t = 100)]
    streams: usize,
    /// The proxy's process ID, to read its open descriptors and resident memory.
    #[arg(long)]
    pid: Option<u32>,
    /// How long to keep the streams open after printing, for other clients to try meanwhile.
    #[arg(long, default_value_t = 0)]
    hold_secs: u64,
}

/// A new HTTP/1.1 connection over TLS to `addr`, verified as `name`, opened within `timeout`
/// (TCP, TLS and HTTP handshakes); its connection task runs until the sender is dropped.
pub async fn open_http1(
    tls: &TlsConnector,
    addr: SocketAddr,
    name: ServerName<'static>,
    timeout: Duration,
) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    open_http1_from(tls, None, addr, name, timeout).await
}

/// [`open_http1`] from the local address `source` when given (any of 127/8 on Linux's loopback),
/// so the server sees another client address.
pub async fn open_http1_from(
    tls: &TlsConnector,
    source: Option<std::net::IpAddr>,
    addr: SocketAddr,
    name: ServerName<'static>,
    timeout: Duration,
) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let opening = async {
        let tcp = crate::support::client::connect_from(source, addr).await?;
        tcp.set_nodelay(true)?;
        let tls = tls.connect(name, tcp).await?;
        let (sender, conn) = http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        anyhow::Ok(sender)
    };
    tokio::time::timeout(timeout, opening)
        .await
        .with_context(|| format!("connecting to {addr} timed out"))?
        .with_context(|| format!("connecting to {addr}"))
}

/// Opens client connections to one address.
struct Connector {
    addr: SocketAddr,
    tls: TlsConnector,
    server_name: ServerName<'static>,
}

impl Connector {
    fn new(target: &Target) -> anyhow::Result<Connector> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&target.ca)? {
            roots.add(cert)?;
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let config = match (&target.cert, &target.key) {
            (Some(cert), Some(key)) => builder.with_client_auth_cert(
                read_certs(cert)?,
                kubelet_auth_proxy::tls::read_key(key).map_err(anyhow::Error::msg)?,
            )?,
            _ => builder.with_no_client_auth(),
        };
        Ok(Connector {
            addr: target.addr,
            tls: TlsConnector::from(Arc::new(config)),
            server_name: ServerName::IpAddress(target.addr.ip().into()),
        })
    }

    /// A new HTTP/1.1 connection over TLS; its connection task runs until the sender is dropped.
    async fn open(&self) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
        self.open_from(None).await
    }

    /// [`open`](Connector::open) from the local address `source`.
    async fn open_from(
        &self,
        source: Option<std::net::IpAddr>,
    ) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
        open_http1_from(
            &self.tls,
            source,
            self.addr,
            self.server_name.clone(),
            OPEN_TIMEOUT,
        )
        .await
    }

    /// What a well-behaved client meets: `GET path` on a new connection, as the `probe` figure
    /// of a run (the status, or the error, and the milliseconds it took).
    async fn probe(&self, path: &str) -> serde_json::Value {
        let started = Instant::now();
        let status = match self.open().await {
            Ok(mut sender) => get(&mut sender, path, None)
                .await
                .map(|s| s.as_u16().to_string())
                .unwrap_or_else(|e| format!("error: {e:#}")),
            Err(e) => format!("error: {e:#}"),
        };
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        serde_json::json!({ "status": status, "ms": ms })
    }

    /// A TLS connection on which nothing is sent.
    async fn open_tls(&self) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let opening = async {
            let tcp = TcpStream::connect(self.addr).await?;
            anyhow::Ok(self.tls.connect(self.server_name.clone(), tcp).await?)
        };
        tokio::time::timeout(OPEN_TIMEOUT, opening)
            .await
            .context("opening a connection timed out")?
    }

    /// Opens `count` connections, at most [`OPENING_AT_ONCE`] at a time, and sends one request
    /// on each when `path` is given. Returns the connections and the failures.
    async fn open_many(
        self: &Arc<Self>,
        count: usize,
        path: Option<&str>,
    ) -> (Vec<SendRequest<Empty<Bytes>>>, Vec<anyhow::Error>) {
        let slots = Arc::new(Semaphore::new(OPENING_AT_ONCE));
        let mut opening = JoinSet::new();
        for _ in 0..count {
            let (connector, slots) = (Arc::clone(self), Arc::clone(&slots));
            let path = path.map(str::to_owned);
            opening.spawn(async move {
                // The semaphore is never closed.
                let _slot = slots.acquire_owned().await?;
                let mut sender = connector.open().await?;
                if let Some(path) = path {
                    let status = get(&mut sender, &path, None).await?;
                    anyhow::ensure!(status.is_success(), "{path} answered {status}");
                }
                anyhow::Ok(sender)
            });
        }
        let (mut open, mut failed) = (Vec::with_capacity(count), Vec::new());
        while let Some(joined) = opening.join_next().await {
            match joined.map_err(anyhow::Error::from).and_then(|r| r) {
                Ok(sender) => open.push(sender),
                Err(e) => failed.push(e),
            }
        }
        (open, failed)
    }
}

fn read_certs(
    path: &std::path::Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    kubelet_auth_proxy::tls::read_certs(path).map_err(anyhow::Error::msg)
}

/// Sends `GET path` (with a bearer token when given) and reads the whole answer.
async fn get(
    sender: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<StatusCode> {
    let exchange = async {
        sender.ready().await?;
        let mut request = Request::get(path).header(HOST, "127.0.0.1");
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = sender.send_request(request.body(Empty::new())?).await?;
        let status = response.status();
        response.into_body().collect().await?;
        anyhow::Ok(status)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .context("request timed out")?
}

/// Opens the connections, sends one request on each (as a kept-alive client connection has),
/// prints `ready opened=<n> failed=<m>` and holds them until a signal or the hold time is up.
pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let connector = Arc::new(Connector::new(&args.target)?);
    let (open, failed) = connector
        .open_many(args.count, Some(&args.target.path))
        .await;
    println!("ready opened={} failed={}", open.len(), failed.len());
    if let Some(e) = failed.first() {
        println!("first-error {e:#}");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(args.hold_secs)) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(open);
    Ok(())
}

/// Opens one connection per request, then releases every request at the same instant and prints
/// one JSON line: status counts, failures, and latency percentiles in milliseconds.
pub async fn burst(args: BurstArgs) -> anyhow::Result<()> {
    let connector = Arc::new(Connector::new(&args.target)?);
    let (open, failed) = connector.open_many(args.count, None).await;
    let (go, ready) = watch::channel(false);
    let mut requests = JoinSet::new();
    for (i, mut sender) in open.into_iter().enumerate() {
        let mut ready = ready.clone();
        let path = args.target.path.clone();
        let token = match args.tokens {
            Tokens::None => None,
            Tokens::One => Some(BURST_ONE_TOKEN.to_owned()),
            Tokens::Distinct => Some(format!("{BURST_TOKEN_PREFIX}{i}")),
        };
        requests.spawn(async move {
            // The sender lives until every task has finished.
            let _ = ready.wait_for(|go| *go).await;
            let started = Instant::now();
            let status = get(&mut sender, &path, token.as_deref()).await;
            (status, started.elapsed())
        });
    }
    // Let every task reach the gate before it opens.
    tokio::time::sleep(Duration::from_millis(200)).await;
    go.send_replace(true);
    let mut statuses = BTreeMap::<String, usize>::new();
    let mut latencies = Vec::with_capacity(args.count);
    let mut errors = failed.len();
    let mut first_error = failed.first().map(|e| format!("{e:#}"));
    while let Some(joined) = requests.join_next().await {
        match joined {
            Ok((Ok(status), elapsed)) => {
                *statuses.entry(status.as_u16().to_string()).or_default() += 1;
                latencies.push(elapsed);
            }
            Ok((Err(e), _)) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    latencies.sort_unstable();
    let ms = |q: f64| percentile(&latencies, q).map(|d| d.as_secs_f64() * 1e3);
    let summary = serde_json::json!({
        "requests": args.count,
        "statuses": statuses,
        "errors": errors,
        "firstError": first_error,
        "p50Ms": ms(0.50),
        "p99Ms": ms(0.99),
        "maxMs": ms(1.0),
    });
    println!("{summary}");
    Ok(())
}

/// The nearest-rank percentile `q` (0 < q ≤ 1) of sorted values.
fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&values, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&values, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&[], 0.99), None);
    }
}

/// Opens `count` TLS connections that send nothing, then prints one JSON line: how many opened,
/// how long after its handshake each was closed by the proxy (percentiles, seconds), how long a
/// well-behaved client took to be answered while they were open, and, given the proxy's PID, its
/// open descriptors and resident memory with every silent connection open and after they closed.
pub async fn silent(args: SilentArgs) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let connector = Arc::new(Connector::new(&args.target)?);
    let slots = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut connections = JoinSet::new();
    for _ in 0..args.count {
        let (connector, slots, opened) = (
            Arc::clone(&connector),
            Arc::clone(&slots),
            opened_tx.clone(),
        );
        connections.spawn(async move {
            let slot = slots.acquire_owned().await?;
            let mut tls = connector.open_tls().await?;
            drop(slot);
            let _ = opened.send(());
            let handshaken = Instant::now();
            let mut buffer = [0u8; 1024];
            // Until the proxy closes (EOF or an error).
            while let Ok(n) = tls.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
            }
            anyhow::Ok(handshaken.elapsed())
        });
    }
    drop(opened_tx);
    let started = Instant::now();
    let mut opened = 0usize;
    while opened < args.count && opened_rx.recv().await.is_some() {
        opened += 1;
    }
    let all_open = started.elapsed();
    let at_peak = args.pid.map(process_figures);
    // A well-behaved client while the silent ones are open (or being closed).
    let probe = connector.probe(&args.target.path).await;
    let mut closed_after = Vec::with_capacity(args.count);
    let mut failed = 0usize;
    while let Some(joined) = connections.join_next().await {
        match joined.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok(elapsed) => closed_after.push(elapsed.as_secs_f64()),
            Err(_) => failed += 1,
        }
    }
    closed_after.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if closed_after.is_empty() {
            return 0.0;
        }
        let i = ((closed_after.len() as f64 - 1.0) * p).round() as usize;
        closed_after[i]
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = args.pid.map(process_figures);
    let line = serde_json::json!({
        "opened": opened,
        "failed": failed,
        "seconds_to_open_all": all_open.as_secs_f64(),
        "closed_by_proxy_after_seconds": {
            "p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)
        },
        "probe": probe,
        "proxy_at_peak": at_peak,
        "proxy_after": after,
    });
    println!("{line}");
    Ok(())
}

/// Open descriptors and `VmRSS` (KiB) of a process, from `/proc`.
fn process_figures(pid: u32) -> serde_json::Value {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    serde_json::json!({ "descriptors": fds, "rss_kib": rss_kib })
}

/// Opens `connections` HTTP/2 connections with a zero flow-control window and `streams` requests
/// on each, none of whose bodies is ever read, then prints one JSON line: the statuses the proxy
/// answered, its open descriptors and memory while they are held, and how one more request of the
/// same user fared meanwhile; then holds them `--hold-secs` for other clients to try.
pub async fn stalled(args: StalledArgs) -> anyhow::Result<()> {
    let connector = Connector::new(&args.target)?;
    let mut statuses = BTreeMap::<String, usize>::new();
    let mut held = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..args.connections {
        let mut tls_config = ClientConfig::clone(connector.tls.config());
        tls_config.alpn_protocols = vec![b"h2".to_vec()];
        let tls = TlsConnector::from(Arc::new(tls_config))
            .connect(
                connector.server_name.clone(),
                TcpStream::connect(connector.addr).await?,
            )
            .await?;
        let (mut sender, connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tls)
            .await?;
        tokio::spawn(connection);
        for _ in 0..args.streams {
            let request = Request::get(format!("https://127.0.0.1{}", args.target.path)).body(())?;
            sender = sender.ready().await?;
            let (response, _) = sender.send_request(request, true)?;
            let status = match tokio::time::timeout(REQUEST_TIMEOUT, response).await {
                Ok(Ok(response)) => {
                    let status = response.status().as_u16().to_string();
                    held.push(response);
                    status
                }
                Ok(Err(e)) => format!("reset: {e}"),
                Err(_) => "no answer".to_owned(),
            };
            *statuses.entry(status).or_default() += 1;
        }
        senders.push(sender);
    }
    let at_peak = args.pid.map(process_figures);
    let probe = connector.probe(&args.target.path).await;
    let line = serde_json::json!({
        "streams": args.connections * args.streams,
        "statuses": statuses,
        "probe": probe,
        "proxy_while_held": at_peak,
    });
    println!("{line}");
    tokio::time::sleep(Duration::from_secs(args.hold_secs)).await;
    drop((held, senders));
    Ok(())
}

/// A token never sent before, of `kind`.
fn flood_token(kind: FloodTokens, issuer: &str, kid: &str, replay: &str) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::rand::{SecureRandom, SystemRandom};
    let random = |len: usize| {
        let mut bytes = vec![0u8; len];
        // The system's randomness does not fail on Linux; a zeroed token is still a token.
        let _ = SystemRandom::new().fill(&mut bytes);
        URL_SAFE_NO_PAD.encode(bytes)
    };
    match kind {
        FloodTokens::Random => random(32),
        FloodTokens::Replay => replay.to_owned(),
        FloodTokens::ForgedJwt
        | FloodTokens::OversizedForgedJwt
        | FloodTokens::NonCanonicalForgedJwt => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let header = serde_json::json!({"alg": "RS256", "kid": kid});
            let padding = if kind == FloodTokens::OversizedForgedJwt {
                "x".repeat(20_000)
            } else {
                String::new()
            };
            let claims = serde_json::json!({
                "iss": issuer, "aud": [issuer], "iat": now, "nbf": now, "exp": now + 3600,
                "sub": format!("system:serviceaccount:default:{}", random(6)), "pad": padding,
            });
            let encode = |value: &serde_json::Value| URL_SAFE_NO_PAD.encode(value.to_string());
            let mut payload = encode(&claims);
            if kind == FloodTokens::NonCanonicalForgedJwt {
                payload = with_unused_bits(&claims.to_string());
            }
            format!("{}.{payload}.{}", encode(&header), random(256))
        }
    }
}

/// `json` encoded as base64url with the unused low bits of its last character set (spaces added
/// after the JSON, which it allows, until the encoding has such bits): the same bytes for Go's
/// decoder, another spelling of them.
fn with_unused_bits(json: &str) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut json = json.to_owned();
    let mut encoded = URL_SAFE_NO_PAD.encode(&json);
    while encoded.len().is_multiple_of(4) {
        json.push(' ');
        encoded = URL_SAFE_NO_PAD.encode(&json);
    }
    let unused = if encoded.len() % 4 == 2 { 0b1111 } else { 0b11 };
    let last = encoded.pop().map_or(0, |c| {
        ALPHABET.iter().position(|&a| a == c as u8).unwrap_or(0)
    });
    encoded.push(ALPHABET[last | unused] as char);
    encoded
}

/// Sends requests from `--workers` clients for `--seconds`, each with a token never sent before,
/// and prints one JSON line: requests, statuses, failures, and the rate.
pub async fn flood(args: FloodArgs) -> anyhow::Result<()> {
    let connector = Arc::new(Connector::new(&args.target)?);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
    let replay: Arc<str> = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --token-file {}", path.display()))?
            .trim()
            .into(),
        None => "".into(),
    };
    let probe = (args.probe_every_ms > 0).then(|| {
        tokio::spawn(probe_clean_source(
            Arc::clone(&connector),
            args.target.path.clone(),
            args.probe_prefix.clone(),
            Duration::from_secs(args.probe_after),
            Duration::from_millis(args.probe_every_ms),
            deadline,
        ))
    });
    let mut workers = JoinSet::new();
    for worker in 0..args.workers {
        let connector = Arc::clone(&connector);
        let source = (args.sources > 1).then(|| {
            let last = 1 + (worker % usize::from(args.sources)) as u8;
            std::net::IpAddr::from([127, 0, 0, last])
        });
        let (path, issuer, kid, kind, replay) = (
            args.target.path.clone(),
            args.issuer.clone(),
            args.kid.clone(),
            args.tokens,
            Arc::clone(&replay),
        );
        workers.spawn(async move {
            let mut statuses = BTreeMap::<String, usize>::new();
            let mut errors = 0usize;
            let mut sender = None;
            while tokio::time::Instant::now() < deadline {
                if sender.is_none() {
                    match connector.open_from(source).await {
                        Ok(opened) => sender = Some(opened),
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
                let token = flood_token(kind, &issuer, &kid, &replay);
                let Some(open) = sender.as_mut() else {
                    continue;
                };
                match get(open, &path, Some(&token)).await {
                    Ok(status) => *statuses.entry(status.as_u16().to_string()).or_default() += 1,
                    Err(_) => {
                        errors += 1;
                        sender = None;
                    }
                }
            }
            (statuses, errors)
        });
    }
    let mut statuses = BTreeMap::<String, usize>::new();
    let mut errors = 0;
    while let Some(joined) = workers.join_next().await {
        let (counted, failed) = joined?;
        for (status, n) in counted {
            *statuses.entry(status).or_default() += n;
        }
        errors += failed;
    }
    let requests: usize = statuses.values().sum();
    let probes = match probe {
        Some(probe) => probe.await?,
        None => serde_json::Value::Null,
    };
    println!(
        "{}",
        serde_json::json!({
            "requests": requests,
            "perSecond": requests as f64 / args.seconds as f64,
            "statuses": statuses,
            "errors": errors,
            "probes": probes,
        })
    );
    Ok(())
}

/// From `after` until `deadline`, every `every`, sends one token never sent before from the
/// clean source on a connection of its own, and says how each was answered and how long it
/// took: statuses, and the median and slowest times of those served.
async fn probe_clean_source(
    connector: Arc<Connector>,
    path: String,
    prefix: String,
    after: Duration,
    every: Duration,
    deadline: tokio::time::Instant,
) -> serde_json::Value {
    tokio::time::sleep(after).await;
    let source = Some(std::net::IpAddr::from(PROBE_SOURCE));
    let mut statuses = BTreeMap::<String, usize>::new();
    let mut served = Vec::new();
    let mut sent = 0;
    while tokio::time::Instant::now() + every < deadline {
        let started = Instant::now();
        let status = match connector.open_from(source).await {
            Ok(mut open) => get(&mut open, &path, Some(&format!("{prefix}{sent}")))
                .await
                .map_or_else(|_| "error".to_owned(), |s| s.as_u16().to_string()),
            Err(_) => "error".to_owned(),
        };
        let took = started.elapsed();
        if status == "200" {
            served.push(took.as_secs_f64() * 1000.0);
        }
        *statuses.entry(status).or_default() += 1;
        sent += 1;
        tokio::time::sleep(every.saturating_sub(took)).await;
    }
    served.sort_by(f64::total_cmp);
    serde_json::json!({
        "sent": sent,
        "statuses": statuses,
        "servedMedianMs": served.get(served.len() / 2),
        "servedMaxMs": served.last(),
    })
}
