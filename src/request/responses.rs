//! The one place that decides what a refused request looks like on the wire. Status codes and
//! bodies are byte-for-byte the kubelet's (kubernetes v1.33 `pkg/kubelet/server/server.go`
//! `InstallAuthFilter`), so clients and alerts written against the kubelet keep working.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use http::{Method, Response, StatusCode};
use http_body_util::{Either, Full};

use crate::authn::User;
use crate::authz::RESOURCE;
use crate::authz::attributes::Subresources;
use crate::forward::UpstreamBody;

/// A response body: the kubelet's, streamed through, or one of ours.
pub type ResponseBody = Either<UpstreamBody, Full<Bytes>>;

const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const TEXT_HTML: HeaderValue = HeaderValue::from_static("text/html; charset=utf-8");

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut response = Response::new(Either::Right(Full::new(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
    response
}

/// 401 `Unauthorized`, the same for a missing and for a bad credential; no `WWW-Authenticate`.
pub fn unauthorized() -> Response<ResponseBody> {
    text(StatusCode::UNAUTHORIZED, "Unauthorized")
}

/// 403 with the kubelet 1.32+ body, trailing newline included:
/// `Forbidden (user=U, verb=V, resource=nodes, subresource(s)=[pods proxy])`.
pub fn forbidden(user: &User, verb: &str, subresources: &Subresources) -> Response<ResponseBody> {
    text(
        StatusCode::FORBIDDEN,
        format!(
            "Forbidden (user={}, verb={verb}, resource={RESOURCE}, subresource(s)={subresources})\n",
            user.name
        ),
    )
}

/// 500 when an authorizer could not decide (the API server unreachable after retries, an
/// unusable answer): the kubelet's body, singular `subresource=` of the attribute that failed.
pub fn authorization_error(user: &User, verb: &str, subresource: &str) -> Response<ResponseBody> {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "Authorization error (user={}, verb={verb}, resource={RESOURCE}, subresource={subresource})",
            user.name
        ),
    )
}

/// 500 for a failure of the proxy itself (not of an authorizer), with a short reason.
pub fn internal_error(reason: &str) -> Response<ResponseBody> {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Internal Server Error: {reason}\n"),
    )
}

/// 301 to the cleaned path, as Go's ServeMux answers an unclean path before any authentication:
/// `Location` is the clean path plus the original query; GET gets Go's small HTML body.
pub fn redirect(method: &Method, location: &str) -> Response<ResponseBody> {
    let body = if method == Method::GET {
        format!(
            "<a href=\"{}\">Moved Permanently</a>.\n\n",
            html_escape(location)
        )
    } else {
        String::new()
    };
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    match HeaderValue::from_str(location) {
        Ok(value) => {
            response.headers_mut().insert(LOCATION, value);
        }
        // The location is built from an already valid request target, so this cannot happen; if
        // it ever did, refusing is the safe answer.
        Err(_) => return bad_request("path cannot be redirected"),
    }
    if method == Method::GET || method == Method::HEAD {
        response.headers_mut().insert(CONTENT_TYPE, TEXT_HTML);
    }
    response
}

/// 400 for a request path that is neither canonical nor cleanable.
pub fn bad_request(reason: &str) -> Response<ResponseBody> {
    text(StatusCode::BAD_REQUEST, format!("Bad Request: {reason}\n"))
}

/// 502 when the kubelet cannot be reached or fails mid-request; `reason` is short and holds no
/// secret.
pub fn bad_gateway(reason: &str) -> Response<ResponseBody> {
    text(
        StatusCode::BAD_GATEWAY,
        format!("Bad Gateway: kubelet unavailable: {reason}\n"),
    )
}

/// 429 for a request of a user that already has its share of requests in flight to the kubelet;
/// `Retry-After: 1`, as kube-apiserver's priority and fairness answers.
pub fn too_many_requests(reason: &str) -> Response<ResponseBody> {
    retry_in_a_second(StatusCode::TOO_MANY_REQUESTS, reason)
}

/// 429 with `Retry-After` the whole seconds of `after` (at least 1), for a refusal that lasts.
pub fn too_many_requests_after(reason: &str, after: Duration) -> Response<ResponseBody> {
    let mut response = too_many_requests(reason);
    let seconds = after.as_secs_f64().ceil().max(1.0) as u64;
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// 503 when every place for requests to the kubelet stayed taken; `Retry-After: 1`.
pub fn service_unavailable(reason: &str) -> Response<ResponseBody> {
    retry_in_a_second(StatusCode::SERVICE_UNAVAILABLE, reason)
}

/// `status` with the body `<its reason phrase>: <reason>` and `Retry-After: 1`.
fn retry_in_a_second(status: StatusCode, reason: &str) -> Response<ResponseBody> {
    let phrase = status.canonical_reason().unwrap_or_default();
    let mut response = text(status, format!("{phrase}: {reason}\n"));
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Go's `htmlEscape` for the redirect body.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
