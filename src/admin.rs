//! The admin listener: `/healthz` (the process serves), `/readyz` (it accepts kubelet API traffic)
//! and `/metrics`, in plain HTTP, meant for loopback and node-local probes.

use std::convert::Infallible;
use std::sync::Arc;

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

/// Serves the admin endpoints until the task is aborted, which the server does once its
/// connections have drained. `draining` is cancelled when shutdown begins: from then on `/readyz`
/// answers 503, so load balancers and probes stop sending traffic while requests finish.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, draining: CancellationToken) {
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
        let draining = draining.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics, draining.is_cancelled());
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
    shutting_down: bool,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz") => {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned())
        }
        (&Method::GET | &Method::HEAD, "/readyz") if shutting_down => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            "shutting down".to_owned(),
        ),
        (&Method::GET | &Method::HEAD, "/readyz") => {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned())
        }
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
