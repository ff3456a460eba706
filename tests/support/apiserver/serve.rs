//! The stand-in API server's plumbing: the TLS listener and its connections, routing, faults and
//! holds, and answers as kube-apiserver writes them (`201 Created` echoing the `spec`, `Status`
//! objects for every error, bodies too large to hold). RBAC lists and watches are routed to
//! `rbac`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kubelet_auth_proxy::tools::demo::accept::until_stopped;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use x509_parser::prelude::FromDer;

use super::access::review_access;
use super::issuer;
use super::rbac::{self, Cut};
use super::tokens::review_token;
use super::{
    ACCESS_REVIEWS_PATH, Call, Caller, Fault, HANDSHAKE_TIMEOUT, Kind, MAX_REQUEST_BODY,
    PADDING_CHUNK, PROXY_IDENTITY, Running, SELF_ACCESS_REVIEWS_PATH, Shared, TOKEN_REVIEWS_PATH,
};

pub(super) fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::TokenReview => "TokenReview",
        Kind::SubjectAccessReview => "SubjectAccessReview",
    }
}

pub(super) fn spawn(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) -> Running {
    let (stop, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, acceptor, shared, stop_rx));
    Running { stop, accept }
}

/// Accepts connections until told to stop, then aborts its connections and waits for them to
/// be gone, so a stopped stand-in holds no socket open.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    until_stopped(listener, stop, |tcp| {
        serve(tcp, acceptor.clone(), shared.clone())
    })
    .await;
}

async fn serve(tcp: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first());
    let certificate = leaf.and_then(|leaf| common_name(leaf));
    let serial = leaf.map(|leaf| crate::support::pki::serial_of(leaf));
    let service = service_fn(move |req| {
        let shared = shared.clone();
        let (certificate, serial) = (certificate.clone(), serial.clone());
        async move { Ok::<_, Infallible>(handle(req, &shared, certificate, serial).await) }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// The subject's CN of a certificate rustls already verified.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// Every answer's body; only a watch the test cuts ends in an error.
pub(super) type ResponseBody = BoxBody<Bytes, Cut>;

async fn handle(
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    certificate: Option<String>,
    serial: Option<String>,
) -> Response<ResponseBody> {
    if let Some(route) = rbac::route(req.uri().path()) {
        if req.method() != Method::GET {
            return method_not_allowed(req.method());
        }
        let caller = caller_of(&req, shared, certificate);
        return rbac::serve(req.uri(), route, caller, shared).await;
    }
    if matches!(req.uri().path(), issuer::DISCOVERY_PATH | issuer::JWKS_PATH) {
        let caller = caller_of(&req, shared, certificate);
        return serve_issuer(&req, shared, caller);
    }
    let kind = match req.uri().path() {
        SELF_ACCESS_REVIEWS_PATH => return self_review(req, shared, certificate).await,
        TOKEN_REVIEWS_PATH => Kind::TokenReview,
        ACCESS_REVIEWS_PATH => Kind::SubjectAccessReview,
        _ => {
            return status_response(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
                None,
            );
        }
    };
    if req.method() != Method::POST {
        return method_not_allowed(req.method());
    }
    let hold = {
        let mut state = shared.lock();
        *state.arrivals.entry(kind_name(kind)).or_default() += 1;
        state
            .hold
            .as_ref()
            .filter(|(target, _)| target.matches(kind))
            .map(|(_, rx)| rx.clone())
    };
    let caller = caller_of(&req, shared, certificate);
    let arrived = std::time::Instant::now();
    let response = answer(req, kind, caller.is_some(), shared, hold).await;
    shared.lock().calls.push(Call {
        kind,
        caller,
        serial,
        status: response.status().as_u16(),
        arrived,
        answered: std::time::Instant::now(),
    });
    response
}

/// The issuer's discovery document or keys, counted; 403 when the test forbids discovery.
fn serve_issuer(
    req: &Request<Incoming>,
    shared: &Shared,
    caller: Option<Caller>,
) -> Response<ResponseBody> {
    if req.method() != Method::GET {
        return method_not_allowed(req.method());
    }
    let mut state = shared.lock();
    let jwks = req.uri().path() == issuer::JWKS_PATH;
    if jwks {
        state.issuer.jwks_fetches += 1;
    } else {
        state.issuer.discovery_fetches += 1;
    }
    // As kube-apiserver: the keys only as a JWK set.
    let accepts_jwk_set = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(issuer::JWKS_MEDIA_TYPE));
    // Whoever asks must be authenticated (anonymous callers are not bound to the discovery
    // role).
    if caller.is_none() {
        return status_response(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    }
    if jwks && !accepts_jwk_set {
        return status_response(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            &format!(
                "406: Not Acceptable  Available representations: {}",
                issuer::JWKS_MEDIA_TYPE
            ),
            None,
        );
    }
    if state.issuer.forbidden {
        return status_response(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("forbidden: cannot get path \"{}\"", req.uri().path()),
            None,
        );
    }
    let document = if jwks {
        state.issuer.jwks()
    } else {
        state.issuer.discovery("https://127.0.0.1")
    };
    json_response(StatusCode::OK, &document)
}

/// How a call authenticated: its verified client certificate, else the caller token.
fn caller_of(
    req: &Request<Incoming>,
    shared: &Shared,
    certificate: Option<String>,
) -> Option<Caller> {
    certificate.map(Caller::Certificate).or_else(|| {
        let expected = format!("Bearer {}", shared.caller_token);
        let presented = req.headers().get(AUTHORIZATION)?;
        (presented.as_bytes() == expected.as_bytes()).then_some(Caller::Token)
    })
}

fn method_not_allowed(method: &Method) -> Response<ResponseBody> {
    status_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        &format!("the server does not allow this method on the requested resource ({method})"),
        None,
    )
}

/// A SelfSubjectAccessReview: may the caller itself `create` the resource asked about?
async fn self_review(
    req: Request<Incoming>,
    shared: &Shared,
    certificate: Option<String>,
) -> Response<ResponseBody> {
    let token = format!("Bearer {}", shared.caller_token);
    let by_token = req
        .headers()
        .get(AUTHORIZATION)
        .is_some_and(|presented| presented.as_bytes() == token.as_bytes());
    if req.method() != Method::POST || (certificate.is_none() && !by_token) {
        return status_response(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    }
    let Ok(body) = Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    else {
        return status_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            "the request body is too large",
            None,
        );
    };
    let review: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    let attributes = &review["spec"]["resourceAttributes"];
    let field = |name: &str| attributes[name].as_str().unwrap_or_default().to_owned();
    let allowed = match field("verb").as_str() {
        "create" => shared
            .lock()
            .caller_may_create
            .contains(&(field("group"), field("resource"))),
        "list" | "watch" => {
            field("group") == "rbac.authorization.k8s.io"
                && [
                    "clusterroles",
                    "clusterrolebindings",
                    "roles",
                    "rolebindings",
                ]
                .contains(&field("resource").as_str())
                && shared.lock().caller_may_read_rbac
        }
        _ => false,
    };
    let status = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"kubelet-auth-proxy:auth-delegator\""})
    } else {
        json!({"allowed": false})
    };
    json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": review["spec"],
            "status": status,
        }),
    )
}

async fn answer(
    req: Request<Incoming>,
    kind: Kind,
    authenticated: bool,
    shared: &Shared,
    hold: Option<watch::Receiver<bool>>,
) -> Response<ResponseBody> {
    if !authenticated {
        return status_response(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
            None,
        );
    }
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return status_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                "the request body is too large",
                None,
            );
        }
    };
    // Every review received is recorded, whatever it is answered with.
    if let Some(spec) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|review| review.get("spec").cloned())
    {
        let mut state = shared.lock();
        match kind {
            Kind::TokenReview => state.token_reviews.push(spec),
            Kind::SubjectAccessReview => state.access_reviews.push(spec),
        }
    }
    if let Some(mut open) = hold {
        let _ = open.wait_for(|open| *open).await;
    }
    let fault = shared.lock().take_fault(kind);
    if let Some(Fault::Slow(delay)) = &fault {
        tokio::time::sleep(*delay).await;
    }
    match fault {
        Some(Fault::InternalError) => {
            return status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: injected by the stand-in",
                Some(json!({"causes": [{"message": "injected by the stand-in"}]})),
            );
        }
        Some(Fault::TooManyRequests {
            retry_after_seconds,
        }) => {
            let mut response = status_response(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Too many requests, please try again later.",
                Some(json!({"retryAfterSeconds": retry_after_seconds})),
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, retry_after_seconds.into());
            return response;
        }
        Some(Fault::ServiceUnavailable) => {
            return status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
                None,
            );
        }
        Some(Fault::Forbidden) => {
            let (resource, group) = match kind {
                Kind::TokenReview => ("tokenreviews", "authentication.k8s.io"),
                Kind::SubjectAccessReview => ("subjectaccessreviews", "authorization.k8s.io"),
            };
            return status_response(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{resource}.{group} is forbidden: User \"{PROXY_IDENTITY}\" cannot create \
                     resource \"{resource}\" in API group \"{group}\" at the cluster scope"
                ),
                Some(json!({"group": group, "kind": resource})),
            );
        }
        Some(Fault::MalformedJson) => {
            return json_bytes(
                StatusCode::CREATED,
                Bytes::from_static(b"{\"kind\":\"TokenReview\",\"apiVersion\":\"authen"),
            );
        }
        _ => {}
    }
    let (status, review) = match kind {
        Kind::TokenReview => review_token(&body, shared),
        Kind::SubjectAccessReview => review_access(&body, shared),
    };
    match fault {
        Some(Fault::Oversized { bytes }) if status == StatusCode::CREATED => {
            oversized(status, review, bytes)
        }
        _ => json_response(status, &review),
    }
}

/// Decodes a review body as the API server's decoder does: JSON, and when `kind`/`apiVersion`
/// are given they must be the endpoint's.
pub(super) fn decode(
    body: &[u8],
    kind: &str,
    api_version: &str,
) -> Result<Value, (StatusCode, Value)> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("the object provided is unrecognized: {e}"),
            None,
        )
    })?;
    if !value.is_object() {
        return Err(status_json(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the object provided is not an object",
            None,
        ));
    }
    for (field, expected) in [("kind", kind), ("apiVersion", api_version)] {
        if let Some(given) = value.get(field)
            && given != expected
        {
            return Err(status_json(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("{field} {given} does not match the expected {expected}"),
                None,
            ));
        }
    }
    Ok(value)
}

/// A `Status` object as the API server writes it for an error.
pub(super) fn status_json(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> (StatusCode, Value) {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    (code, status)
}

fn status_response(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Response<ResponseBody> {
    let (code, status) = status_json(code, reason, message, details);
    json_response(code, &status)
}

pub(super) fn json_response(code: StatusCode, value: &Value) -> Response<ResponseBody> {
    json_bytes(code, Bytes::from(serde_json::to_vec(value).unwrap()))
}

fn json_bytes(code: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

/// The review with a `metadata.annotations` entry long enough to make the body about `bytes`
/// long, streamed chunk by chunk so the stand-in never holds it whole.
fn oversized(code: StatusCode, mut review: Value, bytes: usize) -> Response<ResponseBody> {
    const MARKER: &str = "@@padding@@";
    review["metadata"] = json!({"annotations": {"padding": MARKER}});
    let text = serde_json::to_string(&review).unwrap();
    let (before, after) = text.split_once(MARKER).unwrap();
    let padding = bytes.saturating_sub(text.len() - MARKER.len());
    let body = Padded {
        prefix: Some(Bytes::from(before.to_owned())),
        remaining: padding,
        suffix: Some(Bytes::from(after.to_owned())),
    };
    let mut response = Response::new(body.map_err(|never| match never {}).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

/// A body made of a prefix, `remaining` bytes of `a`, and a suffix.
struct Padded {
    prefix: Option<Bytes>,
    remaining: usize,
    suffix: Option<Bytes>,
}

impl http_body::Body for Padded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        static CHUNK: [u8; PADDING_CHUNK] = [b'a'; PADDING_CHUNK];
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if self.remaining > 0 {
            let n = self.remaining.min(PADDING_CHUNK);
            self.remaining -= n;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..n])))));
        }
        Poll::Ready(self.suffix.take().map(|suffix| Ok(Frame::data(suffix))))
    }
}
