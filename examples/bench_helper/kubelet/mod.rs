//! A kubelet-like upstream for the stream cases of `bench/run`: it writes container logs,
//! exec output and port-forward data the way a real kubelet does (a log line per write and
//! flush, exec and port-forward frames of at most 32 KiB each written and flushed alone), so
//! that a proxy is measured under the kubelet's write pattern rather than a file server's.
//!
//! HTTPS with client certificates required (signed by the bench CA), HTTP/1.1 only. Endpoints:
//!
//! - `GET /containerLogs/{ns}/{pod}/{container}?limitBytes=N`: N bytes of log lines, chunked;
//! - `GET /containerLogs/…?follow=true&intervalMs=M&lines=K`: K lines, one every M ms, each
//!   starting with the time it was sent (ns since the UNIX epoch);
//! - `/exec/{ns}/{pod}/{container}?…&bytes=N` upgraded to WebSocket (channel protocols) or
//!   SPDY/3.1: N bytes of stdout, then (WebSocket) the status on channel 3 and a close frame;
//! - `/portForward/{ns}/{pod}?ports=P&bytes=N&direction=down|up`, WebSocket or SPDY/3.1: N
//!   bytes sent (`down`) or received and then acknowledged with a small last frame (`up`).
//!
//! It runs until stdin closes, as `bench_helper apiserver` does.

mod logs;
mod prefixed;
mod upgrade;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::frames::{Framing, websocket_accept};
use logs::{FollowBody, LinePool};
use prefixed::Prefixed;
use upgrade::{Kind, Session};

/// Options of `bench_helper kubelet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to serve on.
    #[arg(long)]
    listen: SocketAddr,
    /// The bench PKI directory (`bench_helper pki`): upstream.crt/key, ca.crt.
    #[arg(long)]
    pki: PathBuf,
}

/// The WebSocket subprotocols the stand-in accepts, the first offered one wins.
const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "portforward.k8s.io",
];
/// The longest request head the stand-in reads itself.
const MAX_HEAD: usize = 16 * 1024;
/// Bounds a TLS handshake, so that a stalled client holds nothing for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Body = UnsyncBoxBody<Bytes, Infallible>;

pub async fn run(args: Args) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(&args)?));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let pool = LinePool::new();
    // stdin blocks, so it is watched on a thread of its own; its end ends the stand-in.
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0; 256];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed.send(());
    });
    let serving = async {
        loop {
            let (tcp, _) = listener.accept().await.context("accepting")?;
            tcp.set_nodelay(true).ok();
            let (acceptor, pool) = (acceptor.clone(), pool.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                else {
                    return;
                };
                if let Err(e) = serve(tls, pool).await {
                    eprintln!("kubelet stand-in: connection: {e:#}");
                }
            });
        }
    };
    tokio::select! {
        result = serving => result,
        _ = stdin_closed => Ok(()),
    }
}

/// Serves one connection: a log read (not followed) as the kubelet writes it
/// ([`logs::write_chunked`]), anything else with hyper.
async fn serve(mut tls: TlsStream<TcpStream>, pool: LinePool) -> anyhow::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let log_bytes = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(_) = request.parse(&head)? {
            break log_read(&request);
        }
        if head.len() > MAX_HEAD {
            anyhow::bail!("request head over {MAX_HEAD} bytes");
        }
        if tls.read_buf(&mut head).await? == 0 {
            return Ok(());
        }
    };
    if let Some(bytes) = log_bytes {
        return Ok(logs::write_chunked(tls, &pool, bytes).await?);
    }
    let service = service_fn(move |req| {
        let pool = pool.clone();
        async move { Ok::<_, Infallible>(respond(req, pool)) }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(Prefixed::new(head, tls)), service)
        .with_upgrades()
        .await?;
    Ok(())
}

/// The bytes asked for if `request` reads a log without following it.
fn log_read(request: &httparse::Request<'_, '_>) -> Option<u64> {
    let (path, query) = request.path?.split_once('?').unwrap_or((request.path?, ""));
    let query = self::query(query);
    let reads_log = request.method == Some("GET")
        && path.starts_with("/containerLogs/")
        && query.get("follow").is_none_or(|v| *v != "true");
    reads_log.then(|| {
        query
            .get("limitBytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 20)
    })
}

/// Serves upstream.crt/key, requires a client certificate signed by ca.crt, speaks HTTP/1.1.
fn server_config(args: &Args) -> anyhow::Result<ServerConfig> {
    let read_certs = |name: &str| {
        let path = args.pki.join(name);
        kubelet_auth_proxy::tls::read_certs(&path)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("reading {}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs("ca.crt")? {
        roots.add(cert).context("adding the bench CA")?;
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .context("client certificate verifier")?;
    let key_path = args.pki.join("upstream.key");
    let key = kubelet_auth_proxy::tls::read_key(&key_path)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("reading {}", key_path.display()))?;
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(read_certs("upstream.crt")?, key)
        .context("serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Routes one request.
fn respond(mut req: Request<Incoming>, pool: LinePool) -> Response<Body> {
    let query = query(req.uri().query().unwrap_or(""));
    let number = |key: &str, default: u64| {
        query
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let path = req.uri().path();
    if path.starts_with("/containerLogs/") {
        // Only followed logs come here: `serve` answers the others.
        let interval = Duration::from_millis(number("intervalMs", 10));
        let body = FollowBody::new(pool, number("lines", 100) as usize, interval).boxed_unsync();
        let mut response = Response::new(body);
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return response;
    }
    let port = number("ports", 80) as u16;
    let kind = if path.starts_with("/exec/") {
        Kind::Exec
    } else if path.starts_with("/portForward/") {
        if query.get("direction").is_some_and(|d| *d == "up") {
            Kind::ForwardUp { port }
        } else {
            Kind::ForwardDown { port }
        }
    } else {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    };
    let upgrade = req.headers().get(UPGRADE).map(HeaderValue::as_bytes);
    let framing = match upgrade {
        Some(u) if u.eq_ignore_ascii_case(b"websocket") => Framing::WebSocket,
        Some(u) if u.eq_ignore_ascii_case(b"SPDY/3.1") => Framing::Spdy,
        _ => {
            return plain(
                StatusCode::BAD_REQUEST,
                "upgrade to websocket or SPDY/3.1\n",
            );
        }
    };
    let mut response = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    match framing {
        Framing::WebSocket => {
            headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
            let offered = req
                .headers()
                .get_all("sec-websocket-protocol")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(',').map(str::trim))
                .find_map(|p| WS_PROTOCOLS.iter().find(|known| **known == p));
            if let Some(protocol) = offered {
                headers.insert("sec-websocket-protocol", HeaderValue::from_static(protocol));
            }
            let key = req.headers().get("sec-websocket-key");
            if let Some(accept) =
                key.and_then(|k| HeaderValue::from_str(&websocket_accept(k.as_bytes())).ok())
            {
                headers.insert("sec-websocket-accept", accept);
            }
        }
        Framing::Spdy => {
            headers.insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            let version = match kind {
                Kind::Exec => "v4.channel.k8s.io",
                _ => "portforward.k8s.io",
            };
            headers.insert(
                "x-stream-protocol-version",
                HeaderValue::from_static(version),
            );
        }
    }
    let session = Session {
        framing,
        kind,
        bytes: number("bytes", 1 << 20),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let result = match on_upgrade.await {
            Ok(upgraded) => session.run(upgraded).await,
            Err(e) => Err(anyhow::Error::from(e).context("upgrading")),
        };
        if let Err(e) = result {
            eprintln!("kubelet stand-in: {session:?}: {e:#}");
        }
    });
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed_unsync());
    *response.status_mut() = status;
    response
}

/// The query's parameters; the benchmark's values need no percent-decoding.
fn query(query: &str) -> HashMap<&str, &str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .collect()
}
