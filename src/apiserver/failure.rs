//! A failed review, said so an operator can act on it: its cause as a small fixed set (the
//! metrics label), a hint naming what to look at, and a report at warning level once per kind and
//! cause per minute, so an API server that is down does not become a log line per request while
//! every new cause shows at once. `check-config --probe` gives the same hints.

use super::ApiCallError;
use super::metrics::ReviewKind;
use crate::base::reports::Reports;

/// The causes [`cause`] gives a review that was made and failed, the values of the failures
/// counter's `cause` label, whose series exist at 0 from the start (an alert's `increase()` then
/// sees the first failure). `busy` is not among them: a review refused a place is never made,
/// and counts in the refused reviews instead.
pub const FAILURE_CAUSES: [&str; 8] = [
    "unreachable",
    "timeout",
    "unauthorized",
    "forbidden",
    "throttled",
    "server_error",
    "status",
    "invalid_answer",
];

/// The cause of a failed review, as a metrics label value: `unreachable`, `timeout`,
/// `unauthorized` (401), `forbidden` (403), `throttled` (429), `server_error` (5xx), `status`
/// (any other status), `invalid_answer` or `busy`.
pub fn cause(error: &ApiCallError) -> &'static str {
    match error {
        ApiCallError::Transport(_) => "unreachable",
        ApiCallError::Timeout(_) => "timeout",
        ApiCallError::Status { code: 401, .. } => "unauthorized",
        ApiCallError::Status { code: 403, .. } => "forbidden",
        ApiCallError::Status { code: 429, .. } | ApiCallError::HeldOff(_) => "throttled",
        ApiCallError::Status {
            code: 500..=599, ..
        } => "server_error",
        ApiCallError::Status { .. } => "status",
        ApiCallError::InvalidResponse(_) => "invalid_answer",
        ApiCallError::Busy(_) => "busy",
    }
}

/// What to look at for a failed `kind` review, as `: <hint>` (empty when the message says all).
pub fn hint(kind: ReviewKind, error: &ApiCallError) -> &'static str {
    match (error, kind) {
        (ApiCallError::Status { code: 401, .. }, _) => {
            ": the credentials were refused (an expired or unknown client certificate, or a \
             revoked token): check --kubeconfig and the files it names"
        }
        (ApiCallError::Status { code: 403, .. }, ReviewKind::TokenReview) => {
            ": the proxy's identity may not create tokenreviews: bind it to the ClusterRole \
             system:auth-delegator"
        }
        (ApiCallError::Status { code: 403, .. }, ReviewKind::SubjectAccessReview) => {
            ": the proxy's identity may not create subjectaccessreviews: bind it to the \
             ClusterRole system:auth-delegator"
        }
        (ApiCallError::Status { code: 429, .. } | ApiCallError::HeldOff(_), _) => {
            ": the API server is shedding load; requests fail closed until it recovers"
        }
        (ApiCallError::Transport(_), _) => ": check the kubeconfig's server address and CA",
        (ApiCallError::Timeout(_), _) => {
            ": the API server is slow or unreachable; --apiserver-request-timeout bounds each \
             attempt"
        }
        (ApiCallError::InvalidResponse(_), _) => {
            ": the kubeconfig's server may not be a Kubernetes API server"
        }
        (ApiCallError::Busy(_), _) => {
            ": raise --apiserver-max-reviews-inflight if the API server can take more"
        }
        _ => "",
    }
}

/// Reports failed reviews of one API server client.
#[derive(Debug, Default)]
pub struct FailureReports(Reports<(ReviewKind, &'static str)>);

impl FailureReports {
    /// Logs a failed `kind` review at warning level with its cause and hint, unless the same kind
    /// and cause was reported within the last minute (then at debug level). The error names
    /// neither the token nor any field of the review.
    pub fn report(&self, kind: ReviewKind, error: &ApiCallError) {
        let cause = cause(error);
        let hint = hint(kind, error);
        if self.0.admit((kind, cause)) {
            tracing::warn!(
                kind = kind.as_str(),
                cause,
                "{} failed (fails closed): {error}{hint}; reported once a minute per cause",
                kind.as_str()
            );
        } else {
            tracing::debug!(kind = kind.as_str(), cause, %error, "review failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn status(code: u16) -> ApiCallError {
        ApiCallError::Status {
            code,
            reason: String::new(),
            message: String::new(),
        }
    }

    #[test]
    fn each_failure_has_its_cause_and_a_hint() {
        for (error, want, hint_has) in [
            (
                ApiCallError::Transport("refused".into()),
                "unreachable",
                "server address",
            ),
            (
                ApiCallError::Timeout(Duration::from_secs(1)),
                "timeout",
                "--apiserver-request-timeout",
            ),
            (status(401), "unauthorized", "credentials were refused"),
            (status(403), "forbidden", "system:auth-delegator"),
            (status(429), "throttled", "shedding load"),
            (status(503), "server_error", ""),
            (status(404), "status", ""),
            (
                ApiCallError::InvalidResponse("not JSON".into()),
                "invalid_answer",
                "not be a Kubernetes",
            ),
        ] {
            assert_eq!(cause(&error), want, "{error}");
            let hint = hint(ReviewKind::SubjectAccessReview, &error);
            assert!(hint.contains(hint_has), "{error}: {hint}");
        }
        assert!(hint(ReviewKind::TokenReview, &status(403)).contains("create tokenreviews"));
        assert!(
            hint(ReviewKind::SubjectAccessReview, &status(403))
                .contains("create subjectaccessreviews")
        );
    }

    #[test]
    fn one_report_per_kind_and_cause_a_minute() {
        let reports = Reports::default();
        let key = (ReviewKind::TokenReview, "forbidden");
        assert!(reports.admit(key));
        assert!(!reports.admit(key));
        assert!(reports.admit((ReviewKind::SubjectAccessReview, "forbidden")));
        assert!(reports.admit((ReviewKind::TokenReview, "unreachable")));
    }
}
