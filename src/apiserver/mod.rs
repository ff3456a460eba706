//! The Kubernetes API server client for TokenReview and SubjectAccessReview, with the kubelet's
//! retry rules (k8s.io/apiserver v0.33 `pkg/util/webhook/webhook.go`
//! `DefaultRetryBackoffWithInitialDelay`, `WithExponentialBackoff`, `DefaultShouldRetry`): at most
//! 5 attempts, backoff 0.5 s × 1.5ⁿ with 0–20 % jitter, and only errors that `DefaultShouldRetry`
//! calls transient are retried. Every attempt has a timeout and a cap on the response size, so a
//! slow or hostile API server costs a bounded wait.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::Request;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Serialize;

use crate::base::certificates::{CertificateSource, ReadCertificates};
use crate::base::reload::{ReloadError, ReloadRegistry, ReloadTarget, Reloadable};
use metrics::ApiCallLabels;
pub use metrics::{ApiServerMetrics, ReviewKind};

mod answers;
pub mod cache;
pub mod failure;
mod gate;
pub mod hold;
mod kubeconfig_certificates;
pub mod metrics;

pub use answers::{classify_error_answer, decode_subject_access_review, decode_token_review};
use answers::{status_error, transport_error};
use failure::FailureReports;
use gate::ReviewGate;
pub use gate::{Refused, WAITING_PER_PERMIT};
use hold::HoldOff;

/// Largest API server answer read; TokenReview and SubjectAccessReview answers are a few KiB.
pub(crate) const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Attempts per review, as `DefaultAuthWebhookRetryBackoff` (Steps: 5).
pub const MAX_ATTEMPTS: u32 = 5;
/// First backoff step (Duration: 500 ms), multiplied by 1.5 each step.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The name of the API server credentials in reload logs and metrics.
const RELOAD_TARGET: &str = "apiserver_credentials";

/// The API server's CA in a pod, where kube reads it (and re-reads it on rotation).
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

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
    /// The HTTP client could not be built: most often the client certificate or key the
    /// kubeconfig names is not valid PEM, or the two do not match.
    #[error("building the API server client{identity}: {source}")]
    Client {
        /// Where the client certificate and key come from, when from files.
        identity: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// A file the kubeconfig names (or the kubeconfig itself) could not be read.
    #[error("{0}")]
    Files(#[source] ReloadError),
    /// kube's kubeconfig loader asked to wait. It never does today (its loading is synchronous
    /// behind an `async` signature); should a future version wait, this says so instead of
    /// blocking a thread.
    #[error("loading the kubeconfig did not complete at once")]
    Pending,
}

/// How to reach the API server: a client built from a kubeconfig or the in-cluster service
/// account. Building it reads every file the kubeconfig names (so a missing client key or a
/// certificate that does not match its key is a configuration error, named at start and by
/// `check-config`) but connects nothing.
///
/// A kubeconfig's client is rebuilt when the kubeconfig, its client certificate, its client key
/// or its CA file change (see [`ApiServerSettings::register_reloads`]): the kubelet's own kubeconfig
/// names `kubelet-client-current.pem`, which the kubelet rotates before it expires. A bearer
/// `tokenFile` and the in-cluster service account token and CA are re-read by kube itself.
#[derive(Clone)]
pub struct ApiServerSettings {
    kubeconfig: Option<PathBuf>,
    timeout: Duration,
    credentials: Credentials,
}

/// The client in force.
#[derive(Clone)]
enum Credentials {
    /// In-cluster: kube re-reads the rotated token and CA itself.
    InCluster(kube::Client),
    /// From a kubeconfig: rebuilt when its files change.
    Kubeconfig(Arc<Reloadable<kube::Client>>),
}

/// Whether each read from the API server is bounded by the request timeout.
#[derive(Debug, Clone, Copy)]
enum Reads {
    /// Reviews: an answer that stalls is a failed attempt.
    Bounded,
    /// Watches: quiet for minutes when nothing changes.
    Unbounded,
}

impl Credentials {
    fn client(&self) -> kube::Client {
        match self {
            Credentials::InCluster(client) => client.clone(),
            Credentials::Kubeconfig(reloadable) => kube::Client::clone(&reloadable.current()),
        }
    }
}

impl ApiServerSettings {
    /// Reads `kubeconfig` (or the in-cluster configuration when `None`) and builds its client;
    /// every attempt is bounded by `timeout`. Must run inside a Tokio runtime (the client starts
    /// its request queue's task), and opens no connection.
    pub fn read(
        kubeconfig: Option<&Path>,
        timeout: Duration,
    ) -> Result<ApiServerSettings, ApiClientError> {
        ApiServerSettings::read_with(kubeconfig, timeout, Reads::Bounded)
    }

    /// Like [`read`](Self::read), for long-lived watches: connecting and writing are bounded by
    /// `timeout`, reading is not (a quiet watch sends nothing for minutes); the watcher bounds
    /// it with its own idle timeout.
    pub fn read_for_watches(
        kubeconfig: Option<&Path>,
        timeout: Duration,
    ) -> Result<ApiServerSettings, ApiClientError> {
        ApiServerSettings::read_with(kubeconfig, timeout, Reads::Unbounded)
    }

    fn read_with(
        kubeconfig: Option<&Path>,
        timeout: Duration,
        reads: Reads,
    ) -> Result<ApiServerSettings, ApiClientError> {
        let credentials = match kubeconfig {
            Some(path) => {
                let files = credential_files(path)?;
                let kubeconfig = path.to_owned();
                let reloadable = Reloadable::load(RELOAD_TARGET, files, move |_| {
                    client_from_kubeconfig(&kubeconfig, timeout, reads)
                })
                .map_err(|e| match e {
                    ReloadError::Build(cause) => match cause.downcast::<ApiClientError>() {
                        Ok(e) => *e,
                        Err(cause) => ApiClientError::Files(ReloadError::Build(cause)),
                    },
                    e => ApiClientError::Files(e),
                })?;
                Credentials::Kubeconfig(Arc::new(reloadable))
            }
            None => {
                let config = kube::Config::incluster().map_err(ApiClientError::InCluster)?;
                Credentials::InCluster(client(config, timeout, reads, String::new())?)
            }
        };
        Ok(ApiServerSettings {
            kubeconfig: kubeconfig.map(Path::to_owned),
            timeout,
            credentials,
        })
    }

    /// The client in force now (a kubeconfig's is rebuilt when its files change), for callers
    /// that use kube's typed API directly: the RBAC authorizer's lists and watches.
    pub fn client(&self) -> kube::Client {
        self.credentials.client()
    }

    /// What a client is shared by: TokenReview and the webhooks with the same kubeconfig (`None`
    /// for in-cluster) and timeout use one client, its connection pool and its review bounds.
    pub fn sharing_key(&self) -> (Option<&Path>, Duration) {
        (self.kubeconfig.as_deref(), self.timeout)
    }

    /// Has the file watcher keep this client's credentials up to date (the kubeconfig and the
    /// files it names; kube itself re-reads them in-cluster) and read its certificates' expiry.
    pub fn register_reloads(&self, reloads: &mut ReloadRegistry) {
        match &self.credentials {
            Credentials::Kubeconfig(reloadable) => {
                reloads.add(Arc::clone(reloadable) as Arc<dyn ReloadTarget>);
                let Some(path) = &self.kubeconfig else {
                    return;
                };
                for (role, read) in [
                    (
                        "apiserver_client",
                        kubeconfig_certificates::client as ReadCertificates,
                    ),
                    ("apiserver_ca", kubeconfig_certificates::ca),
                ] {
                    reloads.certificates(CertificateSource {
                        role,
                        file: path.clone(),
                        read,
                    });
                }
            }
            Credentials::InCluster(_) => reloads.certificates(CertificateSource::pem(
                "apiserver_ca",
                PathBuf::from(IN_CLUSTER_CA),
            )),
        }
    }
}

/// The files a kubeconfig's current context names: client certificate, client key, CA (kube
/// makes them absolute, relative to the kubeconfig's directory).
struct NamedFiles {
    client_certificate: Option<PathBuf>,
    client_key: Option<PathBuf>,
    certificate_authority: Option<PathBuf>,
}

impl NamedFiles {
    fn of(file: &Kubeconfig) -> NamedFiles {
        let (cluster, user) = kubeconfig_certificates::current(file);
        NamedFiles {
            client_certificate: user.and_then(|u| u.client_certificate.as_ref().map(PathBuf::from)),
            client_key: user.and_then(|u| u.client_key.as_ref().map(PathBuf::from)),
            certificate_authority: cluster
                .and_then(|c| c.certificate_authority.as_ref().map(PathBuf::from)),
        }
    }

    /// ` (client-certificate X, client-key Y)` for an error message; empty for inline data.
    fn identity(&self) -> String {
        match (&self.client_certificate, &self.client_key) {
            (Some(cert), Some(key)) if cert == key => {
                format!(" (client-certificate and client-key {})", cert.display())
            }
            (Some(cert), Some(key)) => format!(
                " (client-certificate {}, client-key {})",
                cert.display(),
                key.display()
            ),
            (Some(cert), None) => format!(" (client-certificate {})", cert.display()),
            (None, Some(key)) => format!(" (client-key {})", key.display()),
            (None, None) => String::new(),
        }
    }
}

/// The kubeconfig and the files it names, each once: what the client is rebuilt from. A
/// kubeconfig changed to name other files takes a restart; new contents of these do not.
fn credential_files(path: &Path) -> Result<Vec<PathBuf>, ApiClientError> {
    let file = Kubeconfig::read_from(path).map_err(ApiClientError::Kubeconfig)?;
    let named = NamedFiles::of(&file);
    let mut files = vec![path.to_owned()];
    for name in [
        named.client_certificate,
        named.client_key,
        named.certificate_authority,
    ]
    .into_iter()
    .flatten()
    {
        if !files.contains(&name) {
            files.push(name);
        }
    }
    Ok(files)
}

/// A client from the kubeconfig at `path`, as it is now.
fn client_from_kubeconfig(
    path: &Path,
    timeout: Duration,
    reads: Reads,
) -> Result<kube::Client, ApiClientError> {
    let file = Kubeconfig::read_from(path).map_err(ApiClientError::Kubeconfig)?;
    let identity = NamedFiles::of(&file).identity();
    let config = ready(kube::Config::from_custom_kubeconfig(
        file,
        &KubeConfigOptions::default(),
    ))
    .ok_or(ApiClientError::Pending)?
    .map_err(ApiClientError::Kubeconfig)?;
    client(config, timeout, reads, identity)
}

/// The client for `config`, with our timeouts and without kube's retries.
fn client(
    mut config: kube::Config,
    timeout: Duration,
    reads: Reads,
    identity: String,
) -> Result<kube::Client, ApiClientError> {
    // kube's own retry layer would re-send 429/503/504 answers inside each of our attempts,
    // multiplying calls and retrying what the kubelet treats as final; ours is the only one.
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = match reads {
        Reads::Bounded => Some(timeout),
        Reads::Unbounded => None,
    };
    config.write_timeout = Some(timeout);
    kube::Client::try_from(config).map_err(|source| ApiClientError::Client { identity, source })
}

/// The output of a future that completes when first polled, without a runtime: reloads run on a
/// blocking thread, where awaiting is not possible.
fn ready<F: Future>(future: F) -> Option<F::Output> {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
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
    /// Never sent: the API server asked this client to wait (`Retry-After`) longer than the
    /// review may wait.
    #[error("API server asked to wait (Retry-After) {0:?} more: not asked")]
    HeldOff(Duration),
}

/// What one attempt produced, with what the retry decision needs.
struct AttemptError {
    error: ApiCallError,
    /// `DefaultShouldRetry`'s verdict.
    retry: bool,
    /// The delay a 429 or 5xx asked for (`Retry-After` or `details.retryAfterSeconds`): the
    /// whole client holds off that long ([`hold`]).
    hold: Option<Duration>,
}

/// A client of the API server's review endpoints. Cheap to share: one pooled connection set.
#[derive(Clone)]
pub struct ApiServerClient {
    credentials: Credentials,
    timeout: Duration,
    metrics: Arc<ApiServerMetrics>,
    /// TokenReviews in flight, then SubjectAccessReviews.
    gates: Arc<[ReviewGate; 2]>,
    /// Failed reviews, reported once a minute per kind and cause.
    failures: Arc<FailureReports>,
    /// The API server's `Retry-After`, obeyed by every review call of this client.
    hold: Arc<HoldOff>,
}

impl std::fmt::Debug for ApiServerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ApiServerClient {
    /// Takes the settings' client and adds the gates on reviews in flight (`max_inflight` of
    /// each kind); no connection is opened until the first review.
    pub fn new(
        settings: ApiServerSettings,
        max_inflight: usize,
        metrics: Arc<ApiServerMetrics>,
    ) -> ApiServerClient {
        let ApiServerSettings {
            credentials,
            timeout,
            ..
        } = settings;
        let gate = |kind| ReviewGate::new(kind, max_inflight, timeout, Arc::clone(&metrics));
        let gates = Arc::new([
            gate(ReviewKind::TokenReview),
            gate(ReviewKind::SubjectAccessReview),
        ]);
        ApiServerClient {
            credentials,
            timeout,
            metrics,
            gates,
            failures: Arc::default(),
            hold: Arc::default(),
        }
    }

    /// The metrics this client counts in, for the review caches in front of it.
    pub fn metrics(&self) -> &Arc<ApiServerMetrics> {
        &self.metrics
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

    /// Asks whether this client's own identity may `verb` `resource` in `group` (a
    /// SelfSubjectAccessReview, as `kubectl auth can-i` sends): what `check-config --probe`
    /// checks before the proxy depends on it (creating reviews; listing and watching RBAC). One attempt, bounded like a review; outside the
    /// review gates and metrics.
    pub async fn may(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
    ) -> Result<SubjectAccessReviewStatus, ApiCallError> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    verb: Some(verb.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let body = serde_json::to_vec(&review)
            .map_err(|e| ApiCallError::InvalidResponse(format!("encoding request: {e}")))?;
        let (_, answer) = self
            .attempt(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Bytes::from(body),
            )
            .await
            .map_err(|e| e.error)?;
        serde_json::from_slice::<SelfSubjectAccessReview>(&answer)
            .map_err(|e| {
                ApiCallError::InvalidResponse(format!("decoding SelfSubjectAccessReview: {e}"))
            })?
            .status
            .ok_or_else(|| {
                ApiCallError::InvalidResponse("SelfSubjectAccessReview without status".into())
            })
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
            let pass = match self.hold.admit(self.timeout).await {
                Ok(pass) => pass,
                Err(held) => {
                    self.metrics.held_off(kind);
                    let error = ApiCallError::HeldOff(held.remaining);
                    self.metrics.failed(kind, failure::cause(&error));
                    self.failures.report(kind, &error);
                    return Err(error);
                }
            };
            let started = Instant::now();
            let result = self.attempt(path, body.clone()).await;
            pass.answered(result.as_ref().err().and_then(|e| e.hold));
            self.metrics
                .set_hold_off_until(self.hold.until().map(|until| {
                    SystemTime::now() + until.saturating_duration_since(tokio::time::Instant::now())
                }));
            self.metrics.observe_call(
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
                Err(AttemptError { error, retry, .. }) => {
                    if !retry || attempt == MAX_ATTEMPTS {
                        self.metrics.failed(kind, failure::cause(&error));
                        self.failures.report(kind, &error);
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
        self.exchange(
            Request::post(path)
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .header(ACCEPT, HeaderValue::from_static("application/json"))
                .body(kube::client::Body::from(body)),
        )
        .await
    }

    /// GETs `path` as `accept` once, bounded like a review attempt (the timeout and the size cap), outside
    /// the review gates and metrics; refused at once while the API server's `Retry-After` hold
    /// is in force. For documents the proxy reads now and then (the service-account issuer's
    /// keys).
    pub async fn get(
        &self,
        path: &'static str,
        accept: &'static str,
    ) -> Result<Bytes, ApiCallError> {
        if let Some(until) = self.hold.until() {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !left.is_zero() {
                return Err(ApiCallError::HeldOff(left));
            }
        }
        let request = Request::get(path)
            .header(ACCEPT, HeaderValue::from_static(accept))
            .body(kube::client::Body::empty());
        self.exchange(request)
            .await
            .map(|(_, body)| body)
            .map_err(|e| e.error)
    }

    /// Sets `key: value` among the labels of pod `namespace/name` (a JSON merge patch, which
    /// leaves every other label as it is), once, bounded like a review attempt and refused at
    /// once while the API server's `Retry-After` hold is in force; the caller retries. For the
    /// drain's release of the proxy's own pod from its DaemonSet.
    pub async fn label_pod(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiCallError> {
        let pass = self
            .hold
            .admit(Duration::ZERO)
            .await
            .map_err(|held| ApiCallError::HeldOff(held.remaining))?;
        let patch = serde_json::json!({ "metadata": { "labels": { key: value } } });
        let request = Request::patch(format!("/api/v1/namespaces/{namespace}/pods/{name}"))
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/merge-patch+json"),
            )
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .body(kube::client::Body::from(patch.to_string().into_bytes()));
        let result = self.exchange(request).await;
        pass.answered(result.as_ref().err().and_then(|e| e.hold));
        result.map(|_| ()).map_err(|e| e.error)
    }

    /// Sends one request, bounded by the timeout and the size cap: the status code and body of
    /// a success.
    async fn exchange(
        &self,
        request: Result<Request<kube::client::Body>, http::Error>,
    ) -> Result<(u16, Bytes), AttemptError> {
        let request = request.map_err(|e| AttemptError {
            error: ApiCallError::InvalidResponse(format!("building request: {e}")),
            retry: false,
            hold: None,
        })?;
        let exchange = async {
            let client = self.credentials.client();
            let response = client.send(request).await.map_err(transport_error)?;
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
                    hold: None,
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
                hold: None,
            }),
        }
    }
}

/// Sleep before attempt `attempt + 1`: 0.5 s × 1.5^(attempt-1), times 1 + U[0, 0.2).
fn backoff(attempt: u32) -> Duration {
    retry_delay(attempt, crate::apiserver::cache::random_fraction())
}

/// The wait after failed attempt `attempt` (from 1), with `draw` (uniform in [0, 1)) as the
/// jitter: public so the fleet simulation retries on the client's schedule.
pub fn retry_delay(attempt: u32, draw: f64) -> Duration {
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let base = FIRST_BACKOFF.as_secs_f64() * 1.5_f64.powi(exponent);
    let draw = if draw.is_nan() {
        0.0
    } else {
        draw.clamp(0.0, 1.0)
    };
    Duration::from_secs_f64(base * (1.0 + 0.2 * draw))
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

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
