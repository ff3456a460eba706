//! The admin listener: `/healthz` (the process serves), `/readyz` (it accepts kubelet API traffic)
//! and `/metrics`, in plain HTTP, meant for loopback and node-local probes.

use std::convert::Infallible;
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
use tokio::net::TcpListener;
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
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Typically EMFILE; back off briefly instead of spinning.
                debug!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let http = Arc::clone(&http);
        let readiness = readiness.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics, readiness.not_ready());
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = http.serve_connection(TokioIo::new(tcp), service).await {
                debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
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
