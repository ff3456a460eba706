//! The audit event model: plain data, built on the request path from what the request holds.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderValue, Uri};
use ring::rand::{SecureRandom, SystemRandom};
use uuid::{Builder, Uuid};

use crate::authn::User;
use crate::authz::Reason;

/// The system random number generator failed. The caller should refuse the request: without it
/// TLS itself is unsafe, and an event without a unique ID cannot be correlated.
#[derive(Debug, thiserror::Error)]
#[error("the system random number generator failed")]
pub struct AuditIdError;

/// A request's audit ID: a random UUID version 4, as kube-apiserver's, so tools that correlate the
/// stages of one request by `auditID` work unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuditId(pub(super) Uuid);

impl AuditId {
    /// A fresh random ID from the operating system's generator (ring's, the project's one source
    /// of randomness); `uuid` sets the version and variant bits.
    pub fn random() -> Result<AuditId, AuditIdError> {
        let mut bytes = [0u8; 16];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| AuditIdError)?;
        Ok(AuditId(Builder::from_random_bytes(bytes).into_uuid()))
    }
}

impl fmt::Display for AuditId {
    /// Lowercase hex in 8-4-4-4-12 groups, as Go's `uuid.New().String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// The stage of request handling an event describes. An ordinary request has one event at
/// `ResponseComplete`; an upgraded stream (exec, attach, port-forward) also has one at
/// `ResponseStarted` when the stream starts, so a long session is visible while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The response headers were sent and the stream is open.
    ResponseStarted,
    /// The response is finished (for a stream: the stream ended).
    ResponseComplete,
}

impl Stage {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
        }
    }
}

/// The object a request touched, in `v1`: the proxy's Node, `nodes/<subresource>`, or the pod a
/// pod-level attribute set allowed (`--pod-scoped-authz`), `pods/<subresource>` in its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// `nodes` or `pods`.
    pub resource: &'static str,
    /// The pod's namespace; `None` for the Node.
    pub namespace: Option<Arc<str>>,
    /// The subresource that was authorized, or the first one asked for when none was.
    pub subresource: &'static str,
    /// The Node name (`--node-name`) or the pod's, shared so the request path never copies it.
    pub name: Arc<str>,
}

/// What authorization concluded, written as kube-apiserver's `authorization.k8s.io/decision` and
/// `authorization.k8s.io/reason` annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// Allowed: decision `allow` with the authorizer's reason.
    Allow(Reason),
    /// Refused (403): decision `forbid` with the reason.
    Forbid(Reason),
    /// An authorizer failed (500): no decision, reason `internal error`, as kube-apiserver writes.
    Error,
}

/// One audit record, built on the request path from data the request already holds: shared
/// pointers and cheap clones only, no formatting. It carries no header but User-Agent, so neither
/// a token nor an `Authorization` header can reach the log.
///
/// Serializes as kube-apiserver's `audit.k8s.io/v1` Event at level `Metadata`: same field names,
/// order, `omitempty` behaviour and string escaping.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// Shared by every stage of one request.
    pub id: AuditId,
    /// Which stage this event records.
    pub stage: Stage,
    /// The request's path and query as received (`requestURI`).
    pub request_uri: Uri,
    /// The Kubernetes verb (`get`, `create`, …); empty when the method maps to none.
    pub verb: &'static str,
    /// The authenticated caller; `None` before (or without) authentication, written `"user":{}`.
    pub user: Option<Arc<User>>,
    /// The peer address of the connection (`sourceIPs`); client-supplied forwarding headers are
    /// not trusted.
    pub source_ip: IpAddr,
    /// The User-Agent header, if any; truncated to 1024 bytes when written, as kube-apiserver does.
    pub user_agent: Option<HeaderValue>,
    /// The Node subresource, once the path was mapped.
    pub object_ref: Option<ObjectRef>,
    /// The HTTP status sent to the client (`responseStatus.code`); 101 for a started upgrade.
    pub response_code: u16,
    /// When the request arrived.
    pub request_received: SystemTime,
    /// When this stage was reached.
    pub stage_timestamp: SystemTime,
    /// The authorization outcome; `None` when the request was not authorized at all (401, 301, 400).
    pub authorization: Option<Authorization>,
    /// Set only on a summary event: what it reports.
    pub summary: Option<Box<Summary>>,
}

/// What a summary event reports, over the interval from its `requestReceivedTimestamp` to its
/// `stageTimestamp`: many requests in one event, so that a flood is recorded without flooding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Summary {
    /// Events a flood budget kept out of the log ([`crate::audit::budget`]).
    Suppressed(Suppressed),
    /// Requests of one source answered 401 without a TokenReview
    /// ([`crate::authn::failure_budget`]).
    ReviewsSkipped(ReviewsSkipped),
}

/// One source's bearer tokens refused without a TokenReview; the source is the event's
/// `sourceIPs` (`0.0.0.0` for the sources beyond the budget's table).
pub use crate::authn::failure_budget::ReviewsSkipped;

/// What one identity's summary event reports: its events not written, over the interval from
/// the event's `requestReceivedTimestamp` to its `stageTimestamp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppressed {
    /// The user name; empty for requests refused before authentication, which share one budget;
    /// `None` for the identities beyond the budget's table, which share another.
    pub identity: Option<String>,
    /// Events not written.
    pub events: u64,
    /// Their bytes as they would have been written.
    pub bytes: u64,
    /// Of those events, how many because the identity's own budget was spent; the rest because
    /// the overall one was.
    pub own_budget: u64,
    /// Acts refused before they reached the kubelet: the identity was over its fair share.
    pub acts_refused: u64,
    /// The events not written, by subresource (empty: refused before the path was mapped).
    pub subresources: Vec<(&'static str, u64)>,
}
