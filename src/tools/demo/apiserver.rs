//! A stand-in API server for the demo, so that the tour shows the token path too: bearer tokens
//! checked with TokenReview (`--authentication-token-webhook`) and requests no local rule
//! decides sent to SubjectAccessReview (the `Webhook` authorizer). It speaks the real wire format
//! (`authentication.k8s.io/v1` and `authorization.k8s.io/v1` JSON over HTTPS, the caller
//! authenticated by its client certificate) with a fixed answer table: one valid token, one rule.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// The one bearer token TokenReview accepts: a service account token of Grafana's.
pub const GRAFANA_TOKEN: &str = "demo-token-grafana";
/// Who that token belongs to.
pub const GRAFANA: &str = "system:serviceaccount:monitoring:grafana";
/// Largest review read.
const MAX_BODY: usize = 64 * 1024;
/// Bounds a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many reviews were answered, by kind.
#[derive(Debug, Default)]
pub struct Counts {
    /// TokenReviews.
    pub token_reviews: AtomicU64,
    /// SubjectAccessReviews.
    pub access_reviews: AtomicU64,
}

/// A running stand-in API server; it stops when dropped.
pub struct StandInApiServer {
    addr: SocketAddr,
    counts: Arc<Counts>,
    stop: watch::Sender<bool>,
    _accept: JoinHandle<()>,
}

impl StandInApiServer {
    /// Starts on `127.0.0.1:<free port>` with `tls`, which should require client certificates.
    pub async fn start(tls: Arc<rustls::ServerConfig>) -> io::Result<StandInApiServer> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let (stop, stop_rx) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(tls),
            Arc::clone(&counts),
            stop_rx,
        ));
        Ok(StandInApiServer {
            addr,
            counts,
            stop,
            _accept: accept,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it has answered so far.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

impl Drop for StandInApiServer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Serves TLS connections on `listener` until `stop`.
async fn accept_loop(
    listener: TcpListener,
    tls: TlsAcceptor,
    counts: Arc<Counts>,
    stop: watch::Receiver<bool>,
) {
    super::accept::until_stopped(listener, stop, |tcp| {
        let (tls, counts) = (tls.clone(), Arc::clone(&counts));
        async move {
            let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await
            else {
                return;
            };
            let service = service_fn(move |req| {
                let counts = Arc::clone(&counts);
                async move { Ok::<_, Infallible>(answer(req, &counts).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    })
    .await;
}

async fn answer(req: Request<Incoming>, counts: &Counts) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if req.method() != Method::POST {
        return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
    }
    let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
        return status(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge");
    };
    let body = body.to_bytes();
    let answer = match path.as_str() {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            counts.token_reviews.fetch_add(1, Ordering::Relaxed);
            serde_json::from_slice::<TokenReview>(&body).map(token_review)
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
            counts.access_reviews.fetch_add(1, Ordering::Relaxed);
            serde_json::from_slice::<SubjectAccessReview>(&body).map(access_review)
        }
        _ => return status(StatusCode::NOT_FOUND, "NotFound"),
    };
    match answer {
        Ok(json) => {
            let mut response = Response::new(Full::new(Bytes::from(json)));
            *response.status_mut() = StatusCode::CREATED;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(_) => status(StatusCode::BAD_REQUEST, "BadRequest"),
    }
}

/// Authenticates [`GRAFANA_TOKEN`] as Grafana's service account; any other token is not valid.
fn token_review(mut review: TokenReview) -> Vec<u8> {
    let valid = review.spec.token == GRAFANA_TOKEN;
    review.status = Some(if valid {
        TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some(GRAFANA.to_owned()),
                uid: Some("5b1f3a52-demo-grafana".to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    "system:serviceaccounts:monitoring".to_owned(),
                    "system:authenticated".to_owned(),
                ]),
                extra: None,
            }),
            ..TokenReviewStatus::default()
        }
    } else {
        TokenReviewStatus {
            authenticated: Some(false),
            error: Some("invalid bearer token".to_owned()),
            ..TokenReviewStatus::default()
        }
    });
    serde_json::to_vec(&review).unwrap_or_default()
}

/// The cluster's RBAC as far as the demo goes: Grafana's service account may `get`
/// `nodes/metrics` and `nodes/stats`; nothing else is decided here (no opinion).
fn access_review(mut review: SubjectAccessReview) -> Vec<u8> {
    let attributes = review.spec.resource_attributes.as_ref();
    let field =
        |get: fn(&k8s_openapi::api::authorization::v1::ResourceAttributes) -> &Option<String>| {
            attributes
                .and_then(|a| get(a).as_deref())
                .unwrap_or_default()
        };
    let allowed = review.spec.user.as_deref() == Some(GRAFANA)
        && field(|a| &a.verb) == "get"
        && field(|a| &a.resource) == "nodes"
        && ["metrics", "stats"].contains(&field(|a| &a.subresource));
    review.status = Some(SubjectAccessReviewStatus {
        allowed,
        reason: allowed.then(|| {
            "RBAC: allowed by ClusterRoleBinding \"grafana-kubelet-metrics\" of ClusterRole \
             \"kubelet-metrics-reader\" to ServiceAccount \"grafana/monitoring\""
                .to_owned()
        }),
        ..SubjectAccessReviewStatus::default()
    });
    serde_json::to_vec(&review).unwrap_or_default()
}

fn status(code: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
