//! The client of the stream cases: one kubelet-like transfer (a log read, a followed log, exec
//! output, port-forward data either way) over TLS with the bench client certificate, timed from
//! sending the request to the last byte. HTTP/1.1 is written and read by hand, so that the
//! client's own cost is small and the same for every target, and its socket reads are counted
//! (see [`counting`]) to show how finely the target cut the stream.
//!
//! Prints one tab-separated line: `ok`, payload bytes, seconds, socket reads with data, bytes
//! they returned, and for `follow` the p50, p99 and largest line latency in µs (`-` otherwise).
//! Any other outcome (status, a byte count other than asked) is an error, exit status 1.

mod counting;
mod http1;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::frames::{
    CHANNEL_PF_DATA, CHANNEL_STDOUT, Deframer, FRAME_DATA, Framing, SPDY_FIN, SPDY_STREAM,
    WS_BINARY, spdy_data, websocket_accept, ws_frame,
};
use counting::CountingStream;
use http1::{BodyFraming, Head, head_end};

/// The size of the client's reads, as curl's.
const READ_BUFFER: usize = 64 * 1024;
/// A read that waits longer than this fails the transfer rather than hanging the run.
const STALL: Duration = Duration::from_secs(60);
/// The WebSocket key of every upgrade (a fixed nonce is fine for a benchmark).
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// The mask of the client's WebSocket frames (RFC 6455 wants one; its value does not matter).
const WS_MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// Options of `bench_helper stream`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target, `https://127.0.0.1:PORT`.
    #[arg(long)]
    url: String,
    /// The bench PKI directory: ca.crt, client.crt, client.key.
    #[arg(long)]
    pki: PathBuf,
    #[arg(long, value_enum)]
    case: Case,
    /// Payload bytes to transfer (every case but `follow`).
    #[arg(long, default_value_t = 1 << 20)]
    bytes: u64,
    /// Lines of a followed log.
    #[arg(long, default_value_t = 200)]
    lines: u64,
    /// Milliseconds between the lines of a followed log.
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
}

/// The transfers, each as the kubelet serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Case {
    /// A log read: one chunk per line.
    Log,
    /// A followed log: a line every --interval-ms, latencies measured.
    Follow,
    /// Exec stdout over WebSocket (v5/v4.channel.k8s.io).
    ExecWs,
    /// Exec stdout over SPDY/3.1.
    ExecSpdy,
    /// Port-forward, kubelet to client, over WebSocket.
    PfWsDown,
    /// Port-forward, client to kubelet, over WebSocket.
    PfWsUp,
    /// Port-forward, kubelet to client, over SPDY/3.1.
    PfSpdyDown,
    /// Port-forward, client to kubelet, over SPDY/3.1.
    PfSpdyUp,
}

/// What one transfer measured.
#[derive(Debug, Default)]
struct Outcome {
    bytes: u64,
    seconds: f64,
    /// Latencies of a followed log's lines, µs.
    latencies: Vec<f64>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let addr: SocketAddr = args
        .url
        .strip_prefix("https://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .with_context(|| format!("--url must be https://IP:PORT, not {}", args.url))?;
    let mut tls = connect(addr, &args.pki).await?;
    let before = tls.get_ref().0.counts;
    let outcome = match args.case {
        Case::Log | Case::Follow => read_log(&mut tls, &args, addr).await?,
        _ => upgraded(&mut tls, &args, addr).await?,
    };
    let after = tls.get_ref().0.counts;
    let mut lat = outcome.latencies;
    lat.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        let i = ((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len().max(1)) - 1;
        lat.get(i).map_or("-".to_owned(), |v| format!("{v:.0}"))
    };
    println!(
        "ok\t{}\t{:.6}\t{}\t{}\t{}\t{}\t{}",
        outcome.bytes,
        outcome.seconds,
        after.reads - before.reads,
        after.bytes - before.bytes,
        pick(0.5),
        pick(0.99),
        pick(1.0),
    );
    Ok(())
}

/// A TLS connection with the bench client certificate, ALPN http/1.1.
async fn connect(
    addr: SocketAddr,
    pki: &std::path::Path,
) -> anyhow::Result<TlsStream<CountingStream>> {
    let read_certs = |name: &str| {
        let path = pki.join(name);
        kubelet_auth_proxy::tls::read_certs(&path)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading {}", path.display()))
    };
    let mut roots = RootCertStore::empty();
    for cert in read_certs("ca.crt")? {
        roots.add(cert).context("adding the bench CA")?;
    }
    let key_path = pki.join("client.key");
    let key = kubelet_auth_proxy::tls::read_key(&key_path)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("reading {}", key_path.display()))?;
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(read_certs("client.crt")?, key)
        .context("client certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    tcp.set_nodelay(true).ok();
    let connector = TlsConnector::from(Arc::new(config));
    connector
        .connect(
            ServerName::IpAddress(addr.ip().into()),
            CountingStream::new(tcp),
        )
        .await
        .context("TLS handshake")
}

/// Sends a request head; returns when it is flushed.
async fn send_head(
    tls: &mut TlsStream<CountingStream>,
    method: &str,
    path: &str,
    addr: SocketAddr,
    extra: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: bench_helper\r\n");
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes())
        .await
        .context("sending the request")?;
    tls.flush().await.context("sending the request")
}

/// One read of up to the buffer's size, bounded by [`STALL`].
async fn read_some(io: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> anyhow::Result<usize> {
    tokio::time::timeout(STALL, io.read(buf))
        .await
        .context("no data for a minute")?
        .context("reading")
}

/// Reads until the response head is complete; returns it and the body bytes read with it.
async fn read_head(
    tls: &mut TlsStream<CountingStream>,
    buf: &mut [u8],
) -> anyhow::Result<(Head, Vec<u8>)> {
    let mut got = Vec::new();
    loop {
        let n = read_some(tls, buf).await?;
        anyhow::ensure!(n > 0, "closed before the response head");
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = head_end(&got) {
            let head = Head::parse(&got[..end - 4])?;
            return Ok((head, got[end..].to_vec()));
        }
        anyhow::ensure!(got.len() < 64 * 1024, "response head over 64 KiB");
    }
}

/// Reads a log (`log`) or a followed log (`follow`) and checks its size.
async fn read_log(
    tls: &mut TlsStream<CountingStream>,
    args: &Args,
    addr: SocketAddr,
) -> anyhow::Result<Outcome> {
    let base = "/containerLogs/default/web-0/web";
    let path = match args.case {
        Case::Follow => format!(
            "{base}?follow=true&intervalMs={}&lines={}",
            args.interval_ms, args.lines
        ),
        _ => format!("{base}?limitBytes={}", args.bytes),
    };
    let start = Instant::now();
    send_head(tls, "GET", &path, addr, &[]).await?;
    let mut buf = vec![0; READ_BUFFER];
    let (head, first) = read_head(tls, &mut buf).await?;
    anyhow::ensure!(head.status == 200, "HTTP {}", head.status);
    let mut body = head.body()?;
    let mut outcome = Outcome::default();
    let mut lines = LineLatencies::default();
    let follow = args.case == Case::Follow;
    let mut take = |bytes: &[u8], outcome: &mut Outcome, body: &mut BodyFraming| {
        let now = follow.then(now_ns);
        body.feed(bytes, &mut |payload| {
            outcome.bytes += payload.len() as u64;
            if let Some(now) = now {
                lines.feed(payload, now);
            }
        })
    };
    take(&first, &mut outcome, &mut body)?;
    while !body.done() {
        let n = read_some(tls, &mut buf).await?;
        if n == 0 {
            anyhow::ensure!(
                matches!(body, BodyFraming::UntilClose),
                "closed before the end of the body"
            );
            break;
        }
        take(&buf[..n], &mut outcome, &mut body)?;
    }
    outcome.seconds = start.elapsed().as_secs_f64();
    if follow {
        anyhow::ensure!(
            lines.latencies.len() as u64 == args.lines && lines.bad == 0,
            "{} lines with a timestamp and {} without, asked for {}",
            lines.latencies.len(),
            lines.bad,
            args.lines
        );
        outcome.latencies = lines.latencies;
    } else {
        anyhow::ensure!(
            outcome.bytes == args.bytes,
            "received {} bytes, asked for {}",
            outcome.bytes,
            args.bytes
        );
    }
    Ok(outcome)
}

/// Splits a followed log into lines and measures each: receive time less the send time the
/// line starts with.
#[derive(Debug, Default)]
struct LineLatencies {
    partial: Vec<u8>,
    latencies: Vec<f64>,
    /// Lines that did not start with a timestamp.
    bad: u64,
}

impl LineLatencies {
    fn feed(&mut self, mut bytes: &[u8], now_ns: u128) {
        while let Some(i) = bytes.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&bytes[..i]);
            bytes = &bytes[i + 1..];
            let sent = std::str::from_utf8(&self.partial)
                .ok()
                .and_then(|l| l.split(' ').next())
                .and_then(|t| t.parse::<u128>().ok());
            match sent {
                Some(sent) => self
                    .latencies
                    .push(now_ns.saturating_sub(sent) as f64 / 1e3),
                None => self.bad += 1,
            }
            self.partial.clear();
        }
        self.partial.extend_from_slice(bytes);
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Exec or port-forward: the upgrade, then data received (exec, `down`) or sent (`up`) until
/// the stand-in's last frame.
async fn upgraded(
    tls: &mut TlsStream<CountingStream>,
    args: &Args,
    addr: SocketAddr,
) -> anyhow::Result<Outcome> {
    let (framing, exec, up) = match args.case {
        Case::ExecWs => (Framing::WebSocket, true, false),
        Case::ExecSpdy => (Framing::Spdy, true, false),
        Case::PfWsDown => (Framing::WebSocket, false, false),
        Case::PfWsUp => (Framing::WebSocket, false, true),
        Case::PfSpdyDown => (Framing::Spdy, false, false),
        Case::PfSpdyUp => (Framing::Spdy, false, true),
        Case::Log | Case::Follow => anyhow::bail!("not an upgrade: {:?}", args.case),
    };
    let bytes = args.bytes;
    let path = if exec {
        format!("/exec/default/web-0/web?command=cat&command=/data&stdout=true&bytes={bytes}")
    } else {
        let direction = if up { "up" } else { "down" };
        format!("/portForward/default/web-0?ports=80&bytes={bytes}&direction={direction}")
    };
    // As kubectl: WebSocket upgrades are GETs (RFC 6455), SPDY ones POSTs.
    let (method, headers): (&str, Vec<(&str, &str)>) = match framing {
        Framing::WebSocket => (
            "GET",
            vec![
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", WS_KEY),
                (
                    "Sec-WebSocket-Protocol",
                    if exec {
                        "v5.channel.k8s.io, v4.channel.k8s.io"
                    } else {
                        "v4.channel.k8s.io, portforward.k8s.io"
                    },
                ),
            ],
        ),
        Framing::Spdy => (
            "POST",
            vec![
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                (
                    "X-Stream-Protocol-Version",
                    if exec {
                        "v4.channel.k8s.io"
                    } else {
                        "portforward.k8s.io"
                    },
                ),
                ("Content-Length", "0"),
            ],
        ),
    };
    let start = Instant::now();
    send_head(tls, method, &path, addr, &headers).await?;
    let mut buf = vec![0; READ_BUFFER];
    let (head, first) = read_head(tls, &mut buf).await?;
    anyhow::ensure!(head.status == 101, "HTTP {}", head.status);
    if framing == Framing::WebSocket {
        let expected = websocket_accept(WS_KEY.as_bytes());
        anyhow::ensure!(
            head.get("sec-websocket-accept") == Some(expected.as_str()),
            "wrong Sec-WebSocket-Accept: {:?}",
            head.get("sec-websocket-accept")
        );
    }
    let channel = if exec {
        CHANNEL_STDOUT
    } else {
        CHANNEL_PF_DATA
    };
    let mut deframer = Deframer::new(framing, channel, !exec);
    deframer.feed(&first);
    if up {
        send_up(tls, framing, bytes).await?;
    }
    while !deframer.ended {
        let n = read_some(tls, &mut buf).await?;
        anyhow::ensure!(n > 0, "closed before the last frame");
        deframer.feed(&buf[..n]);
    }
    let seconds = start.elapsed().as_secs_f64();
    let received = if up { bytes } else { deframer.data };
    anyhow::ensure!(
        up || received == bytes,
        "received {received} bytes, asked for {bytes}"
    );
    Ok(Outcome {
        bytes: received,
        seconds,
        latencies: Vec::new(),
    })
}

/// Sends `bytes` of port-forward data in frames of at most 32 KiB, each one write and flush as
/// kubectl's copy does; WebSocket frames masked, as a client's must be.
async fn send_up(
    tls: &mut TlsStream<CountingStream>,
    framing: Framing,
    bytes: u64,
) -> anyhow::Result<()> {
    static DATA: [u8; FRAME_DATA] = [b'y'; FRAME_DATA];
    let frame = |data: &[u8]| match framing {
        Framing::WebSocket => ws_frame(WS_BINARY, &[CHANNEL_PF_DATA], data, Some(WS_MASK)),
        Framing::Spdy => spdy_data(SPDY_STREAM, 0, data),
    };
    let full = frame(&DATA);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(FRAME_DATA as u64) as usize;
        left -= n as u64;
        let partial;
        let wire = if n == FRAME_DATA {
            &full
        } else {
            partial = frame(&DATA[..n]);
            &partial
        };
        tls.write_all(wire).await.context("sending data")?;
        tls.flush().await.context("sending data")?;
    }
    if framing == Framing::Spdy {
        // The client's half of the stream ends too, as a SPDY client's does.
        let fin = spdy_data(SPDY_STREAM, SPDY_FIN, &[]);
        tls.write_all(&fin).await.context("sending FIN")?;
        tls.flush().await.context("sending FIN")?;
    }
    Ok(())
}
