//! The Kubernetes API server client for TokenReview and SubjectAccessReview, with the kubelet's
//! retry rules (k8s.io/apiserver v0.33 `pkg/util/webhook/webhook.go`
//! `DefaultRetryBackoffWithInitialDelay`, `WithExponentialBackoff`, `DefaultShouldRetry`): at most
//! 5 attempts, backoff 0.5 s × 1.5ⁿ with 0–20 % jitter, and only errors that `DefaultShouldRetry`
//! calls transient are retried. Every attempt has a timeout and a cap on the response size, so a
//! slow or hostile API server costs a bounded wait.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metrics::{ApiCallLabels, Metrics, ReviewKind};

mod gate;

use gate::ReviewGate;
pub use gate::{Refused, WAITING_PER_PERMIT};

/// Largest API server answer read; TokenReview and SubjectAccessReview answers are a few KiB.
const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Attempts per review, as `DefaultAuthWebhookRetryBackoff` (Steps: 5).
const MAX_ATTEMPTS: u32 = 5;
/// First backoff step (Duration: 500 ms), multiplied by 1.5 each step.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The client could not be built from the kubeconfig or the in-cluster service account. Each
/// variant keeps kube's error as its source, so the cause (a missing file, a bad certificate in
/// the kubeconfig, no service account token) stays distinguishable.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    /// The kubeconfig could not be read or used.
    #[error("{0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// No kubeconfig was given and the in-cluster configuration is not available.
    #[error("no --kubeconfig given and not running in a cluster ({0})")]
    InCluster(#[source] kube::config::InClusterError),
    /// The HTTP client could not be built.
    #[error("building the API server client: {0}")]
    Client(#[source] kube::Error),
}

/// How to reach the API server, read from a kubeconfig or the in-cluster service account: the
/// files are read here, and nothing is connected or started.
#[derive(Clone)]
pub struct ApiServerSettings {
    kubeconfig: Option<std::path::PathBuf>,
    config: kube::Config,
    timeout: Duration,
}

impl ApiServerSettings {
    /// Reads `kubeconfig` (or the in-cluster configuration when `None`); every attempt is bounded
    /// by `timeout`.
    pub async fn read(
        kubeconfig: Option<&Path>,
        timeout: Duration,
    ) -> Result<ApiServerSettings, ApiClientError> {
        let mut config = match kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path).map_err(ApiClientError::Kubeconfig)?;
                kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .map_err(ApiClientError::Kubeconfig)?
            }
            None => kube::Config::incluster().map_err(ApiClientError::InCluster)?,
        };
        // kube's own retry layer would re-send 429/503/504 answers inside each of our attempts,
        // multiplying calls and retrying what the kubelet treats as final; ours is the only one.
        config.default_retry = false;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        Ok(ApiServerSettings {
            kubeconfig: kubeconfig.map(Path::to_owned),
            config,
            timeout,
        })
    }

    /// What a client is shared by: TokenReview and the webhooks with the same kubeconfig (`None`
    /// for in-cluster) and timeout use one client, its connection pool and its review bounds.
    pub fn sharing_key(&self) -> (Option<&Path>, Duration) {
        (self.kubeconfig.as_deref(), self.timeout)
    }
}

/// One review call failed (after the retries it deserved). The text names the cause, never the
/// token or any request field.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiCallError {
    /// No HTTP answer: connection refused or reset, TLS failure, DNS failure.
    #[error("API server unreachable: {0}")]
    Transport(String),
    /// The attempt took longer than `--apiserver-request-timeout`.
    #[error("API server did not answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error status.
    #[error("API server answered {code} {reason}: {message}")]
    Status {
        /// HTTP status code.
        code: u16,
        /// The Status reason (`InternalError`, `TooManyRequests`, …), or the code's text.
        reason: String,
        /// The Status message, shortened.
        message: String,
    },
    /// The answer could not be used: too large, not JSON, or not a review.
    #[error("invalid API server answer: {0}")]
    InvalidResponse(String),
    /// Never sent: too many reviews of its kind were in flight.
    #[error(transparent)]
    Busy(#[from] Refused),
}

/// What one attempt produced, with what the retry decision needs.
struct AttemptError {
    error: ApiCallError,
    /// `DefaultShouldRetry`'s verdict.
    retry: bool,
}

/// A client of the API server's review endpoints. Cheap to share: one pooled connection set.
#[derive(Clone)]
pub struct ApiServerClient {
    client: kube::Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// TokenReviews in flight, then SubjectAccessReviews.
    gates: Arc<[ReviewGate; 2]>,
}

impl std::fmt::Debug for ApiServerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ApiServerClient {
    /// Builds the client and the gates on reviews in flight (`max_inflight` of each kind); no
    /// connection is opened until the first review.
    pub fn new(
        settings: ApiServerSettings,
        max_inflight: usize,
        metrics: Arc<Metrics>,
    ) -> Result<ApiServerClient, ApiClientError> {
        let ApiServerSettings {
            config, timeout, ..
        } = settings;
        let client = kube::Client::try_from(config).map_err(ApiClientError::Client)?;
        let gate = |kind| ReviewGate::new(kind, max_inflight, timeout, Arc::clone(&metrics));
        let gates = Arc::new([
            gate(ReviewKind::TokenReview),
            gate(ReviewKind::SubjectAccessReview),
        ]);
        Ok(ApiServerClient {
            client,
            timeout,
            metrics,
            gates,
        })
    }

    /// Creates a TokenReview (`authentication.k8s.io/v1`) and returns its status.
    pub async fn token_review(
        &self,
        spec: TokenReviewSpec,
    ) -> Result<TokenReviewStatus, ApiCallError> {
        let review = TokenReview {
            spec,
            ..TokenReview::default()
        };
        let body = self
            .create(
                ReviewKind::TokenReview,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                &review,
            )
            .await?;
        decode_token_review(&body)
    }

    /// Creates a SubjectAccessReview (`authorization.k8s.io/v1`) and returns its status.
    pub async fn subject_access_review(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> Result<SubjectAccessReviewStatus, ApiCallError> {
        let review = SubjectAccessReview {
            spec,
            ..SubjectAccessReview::default()
        };
        let body = self
            .create(
                ReviewKind::SubjectAccessReview,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &review,
            )
            .await?;
        decode_subject_access_review(&body)
    }

    /// POSTs `object` to `path` with the kubelet's retries, returning the body of the successful
    /// answer or the last attempt's error.
    async fn create<T: Serialize>(
        &self,
        kind: ReviewKind,
        path: &'static str,
        object: &T,
    ) -> Result<Bytes, ApiCallError> {
        let body = Bytes::from(
            serde_json::to_vec(object)
                .map_err(|e| ApiCallError::InvalidResponse(format!("encoding request: {e}")))?,
        );
        let gate = match kind {
            ReviewKind::TokenReview => &self.gates[0],
            ReviewKind::SubjectAccessReview => &self.gates[1],
        };
        let _place = gate.enter().await?;
        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let result = self.attempt(path, body.clone()).await;
            self.metrics.observe_api_call(
                &ApiCallLabels {
                    kind,
                    code: match &result {
                        Ok((code, _)) => *code,
                        Err(AttemptError {
                            error: ApiCallError::Status { code, .. },
                            ..
                        }) => *code,
                        Err(_) => 0,
                    },
                },
                started.elapsed(),
            );
            match result {
                Ok((_, bytes)) => return Ok(bytes),
                Err(AttemptError { error, retry }) => {
                    if !retry || attempt == MAX_ATTEMPTS {
                        return Err(error);
                    }
                    let delay = backoff(attempt);
                    tracing::debug!(kind = kind.as_str(), attempt, ?delay, %error, "retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
            }
        }
    }

    /// One POST, bounded by the timeout and the size cap: the status code and body of a success.
    async fn attempt(&self, path: &'static str, body: Bytes) -> Result<(u16, Bytes), AttemptError> {
        let request = Request::post(path)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .body(kube::client::Body::from(body))
            .map_err(|e| AttemptError {
                error: ApiCallError::InvalidResponse(format!("building request: {e}")),
                retry: false,
            })?;
        let exchange = async {
            let response = self.client.send(request).await.map_err(transport_error)?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| AttemptError {
                    error: if e.is::<http_body_util::LengthLimitError>() {
                        ApiCallError::InvalidResponse(format!(
                            "answer larger than {MAX_RESPONSE_BYTES} bytes"
                        ))
                    } else {
                        ApiCallError::Transport(format!("reading the answer: {e}"))
                    },
                    retry: false,
                })?
                .to_bytes();
            if status.is_success() {
                Ok((status.as_u16(), bytes))
            } else {
                Err(status_error(status, retry_after, &bytes))
            }
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(AttemptError {
                error: ApiCallError::Timeout(self.timeout),
                // Client-side timeouts are not retried (DefaultShouldRetry).
                retry: false,
            }),
        }
    }
}

/// Sleep before attempt `attempt + 1`: 0.5 s × 1.5^(attempt-1), times 1 + U[0, 0.2).
fn backoff(attempt: u32) -> Duration {
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let base = FIRST_BACKOFF.as_secs_f64() * 1.5_f64.powi(exponent);
    Duration::from_secs_f64(base * (1.0 + 0.2 * jitter_fraction()))
}

/// A uniform fraction in [0, 1) from the system's randomness; 0 if it is unavailable.
fn jitter_fraction() -> f64 {
    let mut bytes = [0u8; 4];
    match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.0,
    }
}

/// A transport error: retried only when the connection was reset or lost mid-exchange, as Go's
/// `IsConnectionReset` / `IsHTTP2ConnectionLost`; refused connections, TLS and DNS errors are not.
fn transport_error(error: kube::Error) -> AttemptError {
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
    let AttemptError { error, retry } = status_error(status, retry_after, body);
    (error, retry)
}

/// An HTTP error answer, classified as client-go and `DefaultShouldRetry` would: retried for
/// `InternalError` (any 5xx without a more specific reason), `Timeout` (504), `TooManyRequests`
/// (429), `ServerTimeout`, or any answer asking for a delay (`Retry-After`,
/// `details.retryAfterSeconds`). A 503 without a delay, and every 4xx but 429, is final.
fn status_error(status: StatusCode, retry_after: u64, body: &[u8]) -> AttemptError {
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
    let delay_requested =
        retry_after > 0 || parsed.details.is_some_and(|d| d.retry_after_seconds > 0);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn retried(code: u16, retry_after: u64, body: &str) -> bool {
        status_error(
            StatusCode::from_u16(code).unwrap(),
            retry_after,
            body.as_bytes(),
        )
        .retry
    }

    #[test]
    fn retry_classification_follows_default_should_retry() {
        assert!(retried(500, 0, ""));
        assert!(retried(502, 0, "bad gateway"));
        assert!(retried(504, 0, ""));
        assert!(retried(429, 0, ""));
        assert!(retried(503, 1, ""));
        assert!(retried(
            503,
            0,
            r#"{"kind":"Status","reason":"ServiceUnavailable","details":{"retryAfterSeconds":2}}"#
        ));
        assert!(!retried(503, 0, ""));
        for code in [400, 401, 403, 404, 409, 422] {
            assert!(!retried(code, 0, ""), "{code} must not be retried");
        }
        assert!(retried(
            500,
            0,
            r#"{"kind":"Status","reason":"InternalError","code":500}"#
        ));
    }

    #[test]
    fn status_errors_carry_reason_and_short_message() {
        let e = status_error(
            StatusCode::FORBIDDEN,
            0,
            br#"{"kind":"Status","status":"Failure","message":"tokenreviews is forbidden","reason":"Forbidden","code":403}"#,
        )
        .error;
        assert_eq!(
            e.to_string(),
            "API server answered 403 Forbidden: tokenreviews is forbidden"
        );
        let long = "x".repeat(5000);
        match status_error(StatusCode::INTERNAL_SERVER_ERROR, 0, long.as_bytes()).error {
            ApiCallError::Status { message, .. } => assert_eq!(message.len(), 200),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn backoff_matches_the_kubelet_schedule() {
        for (attempt, base_ms) in [(1, 500.0), (2, 750.0), (3, 1125.0), (4, 1687.5)] {
            let d = backoff(attempt).as_secs_f64() * 1000.0;
            assert!(
                d >= base_ms && d < base_ms * 1.2,
                "attempt {attempt}: {d} ms not in [{base_ms}, {})",
                base_ms * 1.2
            );
        }
    }
}
