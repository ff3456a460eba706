//! What the proxy decided about a request, as metrics label, `explain`'s JSON and the pipeline's
//! account of each request.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

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
