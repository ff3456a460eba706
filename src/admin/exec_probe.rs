//! `kubelet-auth-proxy admin-probe`: one GET to the admin endpoints of one process, through its
//! `--admin-socket`, for a Kubernetes `exec` probe. On a host-network node two proxies share the
//! admin port during a surge rollout, so an `httpGet` probe may be answered by the old pod's
//! process; the unix socket, in the pod's own volume, reaches only this pod's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// The whole probe's bound: a kubelet probe times out after a second by default.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why the probe got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminProbeError {
    /// The socket could not be reached: the proxy is not running, not yet listening, or
    /// `--admin-socket` names another path than the proxy's.
    #[error("--admin-socket {}: cannot connect: {source}; is the proxy running with the same --admin-socket?", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error("--admin-socket {}: {source}", path.display())]
    Http {
        /// The socket.
        path: PathBuf,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// `target` is not a path.
    #[error("{0:?}: not a path such as /readyz")]
    Target(String),
    /// No answer within five seconds.
    #[error("--admin-socket {}: no answer within {TIMEOUT:?}", .0.display())]
    Timeout(PathBuf),
}

/// GETs `target` (`/readyz`, `/healthz`, `/metrics`) from the proxy at `socket`: its status and
/// body.
pub async fn get(socket: &Path, target: &str) -> Result<(StatusCode, String), AdminProbeError> {
    tokio::time::timeout(TIMEOUT, exchange(socket, target))
        .await
        .map_err(|_| AdminProbeError::Timeout(socket.to_owned()))?
}

async fn exchange(socket: &Path, target: &str) -> Result<(StatusCode, String), AdminProbeError> {
    let request = Request::get(target)
        .header(http::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|_| AdminProbeError::Target(target.to_owned()))?;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| AdminProbeError::Connect {
            path: socket.to_owned(),
            source,
        })?;
    let http = |source| AdminProbeError::Http {
        path: socket.to_owned(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    tokio::spawn(connection);
    let response = sender.send_request(request).await.map_err(http)?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(http)?;
    Ok((
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    ))
}
