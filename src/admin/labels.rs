//! The label sets and label values of the proxy's metrics ([`super::metrics`]): small fixed sets
//! (status codes, decisions, causes, subresource names), never a user name, path or token.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// What the proxy decided about a request.
/// Serialized (for `explain`'s JSON document) in camel case, `Allowed` as `forwarded` and
/// `Redirected` as `redirect`, the spelling that document has always used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Authorized and forwarded; the code is the kubelet's.
    #[serde(rename = "forwarded")]
    Allowed,
    /// 403: no attribute set was allowed.
    Forbidden,
    /// 500: an authorizer failed (SubjectAccessReview unavailable).
    AuthorizationError,
    /// 401: no or bad credential.
    Unauthenticated,
    /// 301: the path was not canonical.
    #[serde(rename = "redirect")]
    Redirected,
    /// 400: the path was unusable.
    BadRequest,
    /// 502: the kubelet could not be reached or failed.
    UpstreamError,
    /// 429 or 503: authorized, but no place among the requests in flight to the kubelet.
    Throttled,
    /// 503: an exec, attach or portForward refused because its audit event cannot be written.
    AuditUnavailable,
}

impl Outcome {
    /// How many outcomes there are.
    pub const COUNT: usize = 9;

    /// A distinct index below [`Outcome::COUNT`] per outcome: its declaration order.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The label value: snake case, as Prometheus label values usually are.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Forbidden => "forbidden",
            Outcome::AuthorizationError => "authorization_error",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Redirected => "redirected",
            Outcome::BadRequest => "bad_request",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Throttled => "throttled",
            Outcome::AuditUnavailable => "audit_unavailable",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Labels of the request counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    /// HTTP status code returned to the client.
    pub code: u16,
    /// The proxy's decision.
    pub decision: Outcome,
    /// The subresource that was allowed, or the first one asked for; empty before authorization.
    pub subresource: &'static str,
}

/// Labels of suppressed audit events: why, and whether the caller was authenticated (never who:
/// the summary events name the identities).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SuppressedLabels {
    /// `budget` (the identity's own) or `overall_budget`.
    pub reason: &'static str,
    /// False for requests refused before authentication.
    pub authenticated: bool,
}

/// Labels of the per-thread counters: the serving thread's index, from 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ThreadLabels {
    /// The serving thread ([`crate::server::serving_threads`]).
    pub thread: u16,
}

/// Labels of the latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The proxy's decision.
    pub decision: Outcome,
}

/// Which review an API server call makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum ReviewKind {
    /// `authentication.k8s.io/v1` TokenReview.
    TokenReview,
    /// `authorization.k8s.io/v1` SubjectAccessReview.
    SubjectAccessReview,
}

impl ReviewKind {
    /// The Kubernetes kind, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewKind::TokenReview => "TokenReview",
            ReviewKind::SubjectAccessReview => "SubjectAccessReview",
        }
    }
}

/// Labels of API server calls: one observation per HTTP attempt, retries included.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ApiCallLabels {
    /// The review made.
    pub kind: ReviewKind,
    /// HTTP status code of the answer; 0 when there was none (unreachable, timeout).
    pub code: u16,
}

/// Labels of the per-kind API server metrics (latency, reviews in flight, waiting, refused).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReviewKindLabels {
    /// The review made.
    pub kind: ReviewKind,
}

/// How a cache lookup was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheResult {
    /// From the cache.
    Hit,
    /// Not cached: this request made the API server call.
    Miss,
    /// Not cached, but another request was already making the same call: this one waited for it.
    Coalesced,
}

impl EncodeLabelValue for CacheResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Coalesced => "coalesced",
        };
        EncodeLabelValue::encode(&value, encoder)
    }
}

/// How a refresh ahead ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefreshResult {
    /// The API server answered: its answer replaced the entry.
    Replaced,
    /// The review failed: the entry stays to its original expiry.
    Failed,
}

impl EncodeLabelValue for RefreshResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = match self {
            RefreshResult::Replaced => "replaced",
            RefreshResult::Failed => "failed",
        };
        EncodeLabelValue::encode(&value, encoder)
    }
}

/// Labels of refreshes ahead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefreshLabels {
    /// Which cache: the TokenReview or the SubjectAccessReview one.
    pub cache: ReviewKind,
    /// How the refresh ended.
    pub result: RefreshResult,
}

/// Labels of cache lookups.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CacheLabels {
    /// Which cache: the TokenReview or the SubjectAccessReview one.
    pub cache: ReviewKind,
    /// How the lookup was served.
    pub result: CacheResult,
}

/// The outcome of reloading a file-backed setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadResult {
    /// The new version is in force.
    Applied,
    /// The new version could not be used; the previous one stays in force.
    Failed,
}

impl EncodeLabelValue for ReloadResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let value = match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Failed => "failed",
        };
        EncodeLabelValue::encode(&value, encoder)
    }
}

/// Labels of audit events an audit policy omitted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AuditOmittedLabels {
    /// `no_rule`, `level_none` or `omitted_stage`.
    pub reason: &'static str,
}

/// Labels of failures to reach the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    /// The cause: `connection_refused`, `timeout`, `unknown_ca`, `name_mismatch`,
    /// `certificate_expired`, `ca_used_as_end_entity`, `client_certificate_rejected`, `tls`,
    /// `protocol` or `other`.
    pub cause: &'static str,
}

/// Labels of reviews that failed after their retries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReviewFailureLabels {
    /// The review made.
    pub kind: ReviewKind,
    /// The cause: `unreachable`, `timeout`, `unauthorized`, `forbidden`, `throttled`,
    /// `server_error`, `status` or `invalid_answer`.
    pub cause: &'static str,
}

/// Labels of a webhook authorizer's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AuthorizerLabels {
    /// The authorizer's name in `--authorization-config` (`webhook` for
    /// `--authorization-mode=Webhook`): a fixed set, from the configuration.
    pub name: String,
}

/// The `mode` values of the authorization decisions: the chain's modes, and `none`.
pub(crate) const AUTHORIZATION_MODES: [&str; 7] = [
    "AlwaysAllow",
    "AlwaysDeny",
    "Node",
    "Policy",
    "RBAC",
    "Webhook",
    "none",
];
/// The `decision` values of the authorization decisions.
pub(crate) const AUTHORIZATION_DECISIONS: [&str; 3] = ["allowed", "forbidden", "error"];

/// Labels of the authorization decisions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AuthorizationDecisionLabels {
    /// The mode that allowed, as in `--authorization-mode`; `none` when none did.
    pub mode: &'static str,
    /// `allowed`, `forbidden` or `error`.
    pub decision: &'static str,
}

/// Labels of tokens refused on the node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LocalRejectionLabels {
    /// [`crate::authn::jwt::Rejection::as_str`].
    pub reason: &'static str,
}

/// Labels of tokens answered 401 without a TokenReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SkippedBudgetLabels {
    /// The budget that was spent: `source` or `overall`.
    pub budget: &'static str,
}

/// Labels of fetches of the service-account issuer's keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FetchResultLabels {
    /// `success` or `failed`.
    pub result: &'static str,
}

/// Labels of reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReloadLabels {
    /// What was reloaded: `serving_certificate`, `client_ca`, `policy`, `upstream_tls` or
    /// `apiserver_credentials`.
    pub target: &'static str,
    /// Whether the new version is in force.
    pub result: ReloadResult,
}
