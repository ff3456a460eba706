//! The admin listener: `/healthz` (the process serves), `/readyz` (it accepts kubelet API traffic)
//! and `/metrics`, in plain HTTP, meant for loopback and node-local probes.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::metrics::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/readyz` answers from.
#[derive(Clone)]
pub struct Readiness {
    /// Set once every `--listen-address` is bound; until then `/readyz` answers 503 (the
    /// address is still held, by the kubelet during a rollout).
    pub listening: Arc<AtomicBool>,
    /// Cancelled when shutdown begins: from then on `/readyz` answers 503, so load balancers and
    /// probes stop sending traffic while requests finish.
    pub draining: CancellationToken,
}

impl Readiness {
    /// Why the proxy is not ready, if it is not.
    fn not_ready(&self) -> Option<&'static str> {
        if self.draining.is_cancelled() {
            Some("shutting down")
        } else if !self.listening.load(Ordering::Acquire) {
            Some("waiting for --listen-address: another process holds it")
        } else {
            None
        }
    }
}

/// Serves the admin endpoints until the task is aborted, which the server does once its
/// connections have drained.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, readiness: Readiness) {
    let http = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => serve_connection(tcp, &http, &metrics, &readiness),
            Err(e) => accept_failed(&e).await,
        }
    }
}

/// [`serve`] on the unix socket of `--admin-socket`, which only this process answers.
pub async fn serve_unix(listener: UnixListener, metrics: Arc<Metrics>, readiness: Readiness) {
    let http = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => serve_connection(stream, &http, &metrics, &readiness),
            Err(e) => accept_failed(&e).await,
        }
    }
}

/// Typically EMFILE; backs off briefly instead of spinning.
async fn accept_failed(error: &std::io::Error) {
    debug!(%error, "admin accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

fn serve_connection<IO>(
    io: IO,
    http: &Arc<auto::Builder<TokioExecutor>>,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let metrics = Arc::clone(metrics);
    let http = Arc::clone(http);
    let readiness = readiness.clone();
    tokio::spawn(async move {
        let service = service_fn(move |req| {
            let response = respond(&req, &metrics, readiness.not_ready());
            async move { Ok::<_, Infallible>(response) }
        });
        if let Err(e) = http.serve_connection(TokioIo::new(io), service).await {
            debug!(error = %e, "admin connection ended with an error");
        }
    });
}

/// Binds the unix socket at `path`, replacing a socket left there (by a process that ended, or
/// by the one this process replaces, which keeps serving its open connections); anything else at
/// the path is an error, never removed.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "something other than a socket is there",
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

fn respond(
    req: &Request<Incoming>,
    metrics: &Metrics,
    not_ready: Option<&'static str>,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned())
        }
        (&Method::GET | &Method::HEAD, "/readyz") => match not_ready {
            Some(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                reason.to_owned(),
            ),
            None => (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned()),
        },
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, OPENMETRICS, metrics.encode())
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
