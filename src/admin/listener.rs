//! The admin listener: `/healthz` (the process serves), `/readyz` (it accepts kubelet API traffic)
//! and `/metrics` (the one registry every layer registered its metrics in), in plain HTTP, meant
//! for loopback and node-local probes.

use std::borrow::Cow;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use prometheus_client::registry::Registry;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/readyz` answers from.
#[derive(Clone)]
pub struct Readiness {
    /// Set once every `--listen-address` is bound; until then `/readyz` answers 503 (the
    /// address is still held, by the kubelet during a rollout).
    pub listening: Arc<AtomicBool>,
    /// What `/readyz` says until then: set as the server learns who holds the addresses
    /// (`crate::server::standby`).
    pub waiting: Arc<ArcSwap<Waiting>>,
    /// Cancelled when shutdown begins: from then on `/readyz` answers 503, so load balancers and
    /// probes stop sending traffic while requests finish.
    pub draining: CancellationToken,
    /// What else holds readiness back until it is ready, if anything: the `RBAC` authorizer
    /// until its first complete list (for at most a bounded wait), so a rollout does not replace
    /// a synced proxy with one that has no opinion yet.
    pub hold: Option<Hold>,
}

/// Whether waiting for an address another process holds counts as ready.
#[derive(Debug, Clone, Default)]
pub enum Waiting {
    /// Not ready: nothing says the holder will let go.
    #[default]
    Held,
    /// Ready: the holder will let go once this process is ready (a previous version of the proxy
    /// during a surge rollout, which deletes it only then).
    ForTakeover,
    /// Not ready, for this reason (who holds which address).
    Blocked(Arc<str>),
}

/// Something that holds readiness back, and what `/readyz` says while it does.
#[derive(Clone)]
pub struct Hold {
    /// `/readyz`'s answer while it holds.
    pub reason: Arc<str>,
    /// Whether it still holds.
    pub holds: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Readiness {
    /// Why the proxy is not ready, if it is not.
    fn not_ready(&self) -> Option<Cow<'_, str>> {
        if self.draining.is_cancelled() {
            return Some(Cow::Borrowed("shutting down"));
        }
        if !self.listening.load(Ordering::Acquire) {
            match &**self.waiting.load() {
                Waiting::Held => {
                    return Some(Cow::Borrowed(
                        "waiting for --listen-address: another process holds it",
                    ));
                }
                Waiting::Blocked(reason) => return Some(Cow::Owned(reason.to_string())),
                Waiting::ForTakeover => {}
            }
        }
        self.hold
            .as_ref()
            .filter(|hold| (hold.holds)())
            .map(|hold| Cow::Borrowed(&*hold.reason))
    }
}

/// Serves the admin endpoints until the task is aborted, which the server does once its
/// connections have drained.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, readiness: Readiness) {
    let http = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => serve_connection(tcp, &http, &registry, &readiness),
            Err(e) => accept_failed(&e).await,
        }
    }
}

/// [`serve`] on the unix socket of `--admin-socket`, which only this process answers.
async fn serve_unix(listener: UnixListener, registry: Arc<Registry>, readiness: Readiness) {
    let http = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => serve_connection(stream, &http, &registry, &readiness),
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
    registry: &Arc<Registry>,
    readiness: &Readiness,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let registry = Arc::clone(registry);
    let http = Arc::clone(http);
    let readiness = readiness.clone();
    tokio::spawn(async move {
        let service = service_fn(move |req| {
            let response = respond(&req, &registry, readiness.not_ready().as_deref());
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
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
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

/// The admin endpoints on `--admin-socket`: where, what they answer from, and the task serving.
pub struct AdminSocket {
    path: PathBuf,
    registry: Arc<Registry>,
    readiness: Readiness,
    task: JoinHandle<()>,
}

impl AdminSocket {
    /// Binds `path` (see `bind_unix`) and serves the admin endpoints there.
    pub fn serve(
        path: PathBuf,
        registry: Arc<Registry>,
        readiness: Readiness,
    ) -> std::io::Result<AdminSocket> {
        let listener = bind_unix(&path)?;
        let task = tokio::spawn(serve_unix(
            listener,
            Arc::clone(&registry),
            readiness.clone(),
        ));
        Ok(AdminSocket {
            path,
            registry,
            readiness,
            task,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Replaces whatever is at the path with a socket of this process again.
    pub fn rebind(&mut self) -> std::io::Result<()> {
        let listener = bind_unix(&self.path)?;
        self.task.abort();
        self.task = tokio::spawn(serve_unix(
            listener,
            Arc::clone(&self.registry),
            self.readiness.clone(),
        ));
        Ok(())
    }
}

fn respond(
    req: &Request<Incoming>,
    registry: &Registry,
    not_ready: Option<&str>,
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
        (&Method::GET | &Method::HEAD, "/metrics") => (
            StatusCode::OK,
            OPENMETRICS,
            crate::base::metrics::encode(registry),
        ),
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
