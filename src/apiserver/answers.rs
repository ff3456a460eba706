//! The API server's answers read: a review's status decoded, an error answer or a transport
//! failure classified (its cause, whether to retry, how long the API server asked to be left
//! alone), every text kept short for logs.

use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use serde::de::DeserializeOwned;

use super::metrics::ReviewKind;
use super::{ApiCallError, AttemptError};

/// A transport error: retried only when the connection was reset or lost mid-exchange, as Go's
/// `IsConnectionReset` / `IsHTTP2ConnectionLost`; refused connections, TLS and DNS errors are not.
pub(super) fn transport_error(error: kube::Error) -> AttemptError {
    let mut retry = false;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            retry |= matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            );
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            retry |= hyper.is_incomplete_message();
        }
        source = e.source();
    }
    AttemptError {
        error: ApiCallError::Transport(short(&error.to_string())),
        retry,
        hold: None,
    }
}

/// The subset of a `Status` body the retry decision reads.
#[derive(serde::Deserialize, Default)]
struct StatusBody {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Option<StatusDetails>,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StatusDetails {
    #[serde(default)]
    retry_after_seconds: u64,
}

/// The status of a successful TokenReview answer's body. Public so the decoding of what an API
/// server (or whatever answers in its place) sends can be exercised on its own, as the fuzzer does.
pub fn decode_token_review(body: &[u8]) -> Result<TokenReviewStatus, ApiCallError> {
    decode::<TokenReview>(ReviewKind::TokenReview, body)?
        .status
        .ok_or_else(|| ApiCallError::InvalidResponse("TokenReview without status".into()))
}

/// The status of a successful SubjectAccessReview answer's body; public for the same reason as
/// [`decode_token_review`].
pub fn decode_subject_access_review(
    body: &[u8],
) -> Result<SubjectAccessReviewStatus, ApiCallError> {
    decode::<SubjectAccessReview>(ReviewKind::SubjectAccessReview, body)?
        .status
        .ok_or_else(|| ApiCallError::InvalidResponse("SubjectAccessReview without status".into()))
}

fn decode<T: DeserializeOwned>(kind: ReviewKind, body: &[u8]) -> Result<T, ApiCallError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiCallError::InvalidResponse(format!("decoding {}: {e}", kind.as_str())))
}

/// How an error answer (`status`, its `Retry-After` seconds and `body`) is reported, and whether
/// it is retried. Public so the parsing of hostile error bodies can be exercised on its own.
pub fn classify_error_answer(
    status: StatusCode,
    retry_after: u64,
    body: &[u8],
) -> (ApiCallError, bool) {
    let AttemptError { error, retry, .. } = status_error(status, retry_after, body);
    (error, retry)
}

/// An HTTP error answer, classified as client-go and `DefaultShouldRetry` would: retried for
/// `InternalError` (any 5xx without a more specific reason), `Timeout` (504), `TooManyRequests`
/// (429), `ServerTimeout`, or any answer asking for a delay (`Retry-After`,
/// `details.retryAfterSeconds`). A 503 without a delay, and every 4xx but 429, is final.
pub(super) fn status_error(status: StatusCode, retry_after: u64, body: &[u8]) -> AttemptError {
    let parsed: StatusBody = serde_json::from_slice(body).unwrap_or_default();
    let code = status.as_u16();
    let reason = if parsed.reason.is_empty() {
        match code {
            429 => "TooManyRequests".to_owned(),
            503 => "ServiceUnavailable".to_owned(),
            504 => "Timeout".to_owned(),
            c if c >= 500 => "InternalError".to_owned(),
            _ => status
                .canonical_reason()
                .unwrap_or("Unknown")
                .replace(' ', ""),
        }
    } else {
        parsed.reason
    };
    let requested = retry_after.max(parsed.details.map_or(0, |d| d.retry_after_seconds));
    let delay_requested = requested > 0;
    // client-go waits the Retry-After of a 429 or a 5xx (`checkWait`); here the whole client does.
    let hold =
        (delay_requested && (code == 429 || code >= 500)).then(|| Duration::from_secs(requested));
    let retry = matches!(
        reason.as_str(),
        "InternalError" | "Timeout" | "TooManyRequests" | "ServerTimeout"
    ) || code == 429
        || delay_requested;
    let message = if parsed.message.is_empty() {
        short(&String::from_utf8_lossy(body))
    } else {
        short(&parsed.message)
    };
    AttemptError {
        error: ApiCallError::Status {
            code,
            reason,
            message,
        },
        retry,
        hold,
    }
}

/// At most 200 characters of a message, on one line.
fn short(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    one_line.trim().to_owned()
}
