//! The demo's tour: a fixed list of requests made as different identities, each with the status
//! the proxy should answer and a line on why, checked against what it really answers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::DemoError;

/// One caller of the tour: a name for the table and the TLS client it connects with.
pub struct Caller {
    /// How the table names the caller.
    pub label: &'static str,
    /// TLS client settings, with the caller's certificate if it has one.
    pub tls: Arc<ClientConfig>,
    /// A bearer token the caller sends, if it has one.
    pub token: Option<&'static str>,
}

/// One request of the tour and what should come of it.
pub struct Step {
    /// Index into the callers.
    pub caller: usize,
    /// HTTP method.
    pub method: Method,
    /// Request target (path and query), sent as is.
    pub target: &'static str,
    /// Whether to ask for a WebSocket upgrade, as `kubectl exec` does.
    pub websocket: bool,
    /// The status the proxy should answer.
    pub expect: StatusCode,
    /// Why.
    pub why: &'static str,
}

/// What the proxy answered.
pub struct Answer {
    /// The status code.
    pub status: StatusCode,
    /// The first line of the body, for refusals (the kubelet-format message).
    pub first_line: String,
}

/// Sends one request over a fresh TLS connection (so each caller's certificate is used) and reads
/// the status and, unless it is an upgrade, the body.
pub async fn send(proxy: SocketAddr, caller: &Caller, step: &Step) -> Result<Answer, DemoError> {
    let tcp = TcpStream::connect(proxy).await?;
    let tls = TlsConnector::from(Arc::clone(&caller.tls))
        .connect(ServerName::from(proxy.ip()), tcp)
        .await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(DemoError::Http)?;
    tokio::spawn(connection.with_upgrades());
    let mut request = Request::builder()
        .method(step.method.clone())
        .uri(step.target)
        .header(http::header::HOST, proxy.to_string());
    if let Some(token) = caller.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if step.websocket {
        request = request
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| DemoError::Request(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(DemoError::Http)?;
    let status = response.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Answer {
            status,
            first_line: String::new(),
        });
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(DemoError::Http)?
        .to_bytes();
    let first_line = String::from_utf8_lossy(&body)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok(Answer { status, first_line })
}

/// The tour. Caller indices: 0 cluster admin, 1 metrics scraper, 2 this node, 3 another node,
/// 4 anonymous, 5 a stranger's certificate, 6 a service account's bearer token, 7 a forged one.
pub fn steps() -> Vec<Step> {
    let step = |caller, method, target, websocket, expect, why| Step {
        caller,
        method,
        target,
        websocket,
        expect,
        why,
    };
    vec![
        step(
            0,
            Method::GET,
            "/pods",
            false,
            StatusCode::OK,
            "cluster-admins may do anything: allowed on nodes/pods",
        ),
        step(
            0,
            Method::GET,
            "/exec/default/web/app?command=date&stdout=1",
            true,
            StatusCode::SWITCHING_PROTOCOLS,
            "exec is authorized as `create nodes/proxy`, which cluster-admins have",
        ),
        step(
            1,
            Method::GET,
            "/metrics/cadvisor",
            false,
            StatusCode::OK,
            "prometheus has get on nodes/metrics",
        ),
        step(
            1,
            Method::GET,
            "/stats/summary",
            false,
            StatusCode::OK,
            "prometheus has get on nodes/stats",
        ),
        step(
            1,
            Method::GET,
            "/pods",
            false,
            StatusCode::FORBIDDEN,
            "nodes/pods and the nodes/proxy fallback are both missing",
        ),
        step(
            1,
            Method::GET,
            "/exec/default/web/app?command=sh",
            true,
            StatusCode::FORBIDDEN,
            "a WebSocket exec is a GET, but the proxy asks for `create`",
        ),
        step(
            2,
            Method::GET,
            "/healthz",
            false,
            StatusCode::OK,
            "nodes may check their own kubelet's health",
        ),
        step(
            2,
            Method::GET,
            "/metrics",
            false,
            StatusCode::FORBIDDEN,
            "nodes have no nodes/metrics permission",
        ),
        step(
            3,
            Method::GET,
            "/healthz",
            false,
            StatusCode::FORBIDDEN,
            "the Node authorizer holds node identities to their own node",
        ),
        step(
            4,
            Method::GET,
            "/healthz",
            false,
            StatusCode::OK,
            "anonymous health probes are allowed by the policy",
        ),
        step(
            4,
            Method::GET,
            "/pods",
            false,
            StatusCode::FORBIDDEN,
            "anonymous may not list pods",
        ),
        step(
            5,
            Method::GET,
            "/healthz",
            false,
            StatusCode::UNAUTHORIZED,
            "a certificate from an unknown CA is an error, never anonymous",
        ),
        step(
            4,
            Method::GET,
            "/stats/../exec/default/web/app",
            false,
            StatusCode::MOVED_PERMANENTLY,
            "unclean paths are redirected, never authorized as written",
        ),
        step(
            6,
            Method::GET,
            "/metrics/resource",
            false,
            StatusCode::OK,
            "TokenReview names grafana's service account; SubjectAccessReview allows it",
        ),
        step(
            6,
            Method::GET,
            "/metrics/resource",
            false,
            StatusCode::OK,
            "the same again: both answers come from the proxy's caches, no API call",
        ),
        step(
            6,
            Method::GET,
            "/pods",
            false,
            StatusCode::FORBIDDEN,
            "no local rule and no RBAC rule grant nodes/pods to the service account",
        ),
        step(
            7,
            Method::GET,
            "/metrics",
            false,
            StatusCode::UNAUTHORIZED,
            "TokenReview says the token is not valid",
        ),
    ]
}
