//! The request pipeline, top to bottom, for each request a client connection carries:
//!
//! 1. canonical path: not canonical → 301 to the cleaned path, unusable → 400 (before authentication,
//!    as the kubelet's Go router answers);
//! 2. authenticate: the connection's verified client certificate, else anonymous when allowed → 401;
//! 3. attributes: verb and path → the ordered `nodes/<subresource>` list;
//! 4. authorize: the kubelet's loop over that list → 403;
//! 5. forward: the identical path and query to the kubelet, bodies and upgrades streamed.
//!
//! Steps 1 to 4 are [`crate::request::decision`]'s, shared with `explain`. Every request is counted
//! and timed once its response headers are ready, and audited when there is an audit log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue, USER_AGENT};
use http::{Method, Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Body, Incoming};
use tracing::{debug, warn};

use super::metrics::{RequestLabels, RequestMetrics};
use super::outcome::Outcome;
use crate::audit::policy::{PolicyRequest, Stages};
use crate::audit::{
    AuditEvent, AuditId, AuditLog, Authorization as AuditAuthorization, ObjectRef, Stage,
};
use crate::authn::{Authenticator, ConnectionIdentity, User};
use crate::base::reports::Reports;
use crate::base::wire;
use crate::forward::{ForwardError, Forwarder, UpgradedStream, cause, headers};
use crate::request::decision::{Decider, Judgement, Refusal, RequestDecision, Unobserved, Verdict};
use crate::request::responses::{self, ResponseBody};

/// What every request handler shares, read-only.
pub struct Pipeline {
    authenticator: Authenticator,
    /// Path gate, attributes and authorizers: what is decided before forwarding.
    decider: Decider,
    metrics: Arc<RequestMetrics>,
    audit: Option<AuditLog>,
    /// Refuse exec, attach and portForward while their audit event cannot be written.
    audit_require_for_streams: bool,
    /// Upstream failures reported at warning level: once per cause per minute.
    upstream_reports: Reports<cause::Cause>,
}

/// One serving thread's part in the pipeline: what every thread shares, and the thread's own pool
/// of kubelet connections ([`crate::server::serving_threads`]).
pub struct Lane {
    pipeline: Arc<Pipeline>,
    forwarder: Forwarder,
}

impl Pipeline {
    /// The pipeline of a proxy that authenticates with `authenticator`, decides with `decider`
    /// and records to `audit` when there is an audit log.
    pub fn new(
        authenticator: Authenticator,
        decider: Decider,
        metrics: Arc<RequestMetrics>,
        audit: Option<AuditLog>,
        audit_require_for_streams: bool,
    ) -> Pipeline {
        Pipeline {
            authenticator,
            decider,
            metrics,
            audit,
            audit_require_for_streams,
            upstream_reports: Reports::default(),
        }
    }

    /// The authenticator, whose connection-level part runs once per TLS handshake.
    pub fn authenticator(&self) -> &Authenticator {
        &self.authenticator
    }
}

impl Lane {
    /// A serving thread's lane: the shared `pipeline`, and `forwarder` with the thread's own pool.
    pub fn new(pipeline: Arc<Pipeline>, forwarder: Forwarder) -> Lane {
        Lane {
            pipeline,
            forwarder,
        }
    }

    /// The pipeline this lane serves.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Handles one request of a connection whose TLS identity is `identity`: decides, forwards or
    /// refuses, counts and audits it. An upgraded session holds `slot` (the connection's place
    /// under --max-connections) until it ends, as it outlives the HTTP connection.
    pub async fn handle<S: Send + 'static>(
        &self,
        identity: &ConnectionIdentity,
        peer: SocketAddr,
        req: Request<Incoming>,
        slot: S,
    ) -> Response<ResponseBody> {
        self.pipeline
            .handle(&self.forwarder, identity, peer, req, slot)
            .await
    }
}

/// The response header that names a request's audit event, as kube-apiserver sets it.
const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What the pipeline did with one request: the response, and what metrics and audit record.
struct Handled {
    response: Response<ResponseBody>,
    outcome: Outcome,
    /// The subresource allowed, or the first asked for; empty before the path was mapped.
    subresource: &'static str,
    /// The Kubernetes verb; for requests refused before mapping, the method's.
    verb: &'static str,
    /// The audit `objectRef`: the Node, or the pod a pod-level set allowed.
    object_ref: Option<ObjectRef>,
    user: Option<Arc<User>>,
    authorization: Option<AuditAuthorization>,
    /// Allowed and acting ([`crate::audit::acts`]): the audit event is never suppressed.
    acts: bool,
}

/// What the audit event of a request needs from the request itself, taken before the request is
/// handed on; only gathered when auditing is on.
struct AuditStart {
    id: AuditId,
    received: SystemTime,
    request_uri: http::Uri,
    user_agent: Option<HeaderValue>,
}

impl Pipeline {
    /// Decides, forwards or refuses, counts and audits one request. An upgraded session holds
    /// `slot` until it ends.
    async fn handle<S: Send + 'static>(
        &self,
        forwarder: &Forwarder,
        identity: &ConnectionIdentity,
        peer: SocketAddr,
        req: Request<Incoming>,
        slot: S,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let head = req.method() == Method::HEAD;
        let audit_start = match &self.audit {
            Some(_) => match AuditId::random() {
                Ok(id) => Some(AuditStart {
                    id,
                    received: SystemTime::now(),
                    request_uri: req.uri().clone(),
                    user_agent: req.headers().get(USER_AGENT).cloned(),
                }),
                // A request that cannot be audited is not served.
                Err(e) => {
                    warn!(error = %e, "cannot create an audit ID");
                    return responses::internal_error("audit unavailable");
                }
            },
            None => None,
        };
        let mut handled = self
            .decide_and_forward(forwarder, identity, peer, req, started)
            .await;
        let response = &mut handled.response;
        if head && let Either::Right(body) = response.body() {
            // Our own answers carry a body; a HEAD response must not (HTTP/2 peers reset the
            // stream if it does). As Go's net/http does for the kubelet, the length of the body
            // that a GET would get is still announced. The kubelet's answers pass through as is.
            let length = body.size_hint().exact().unwrap_or_default();
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(length));
            *response.body_mut() = Either::Right(Full::default());
        }
        self.metrics.observe_request(
            &RequestLabels {
                code: response.status().as_u16(),
                decision: handled.outcome,
                subresource: handled.subresource,
            },
            started.elapsed(),
        );
        let stream = handled.response.extensions_mut().remove::<UpgradedStream>();
        let completion = match (&self.audit, audit_start) {
            (Some(audit), Some(start)) => {
                self.record(audit, start, peer, &mut handled, stream.is_some())
            }
            _ => None,
        };
        if let Some(stream) = stream {
            self.metrics.streams().inc();
            let metrics = Arc::clone(&self.metrics);
            // The session task runs this when the session ends, however it ends.
            stream.own(move || {
                metrics.streams().dec();
                drop(slot);
                if let Some((audit, mut complete)) = completion {
                    complete.stage = Stage::ResponseComplete;
                    complete.stage_timestamp = SystemTime::now();
                    audit.record(complete);
                }
            });
        }
        handled.response
    }

    /// Records the request's audit event: at `ResponseComplete`, or for an upgraded `stream` at
    /// `ResponseStarted`, returning the event to record again when the session ends. The audit
    /// policy decides first which of these stages are written; the flood rules apply after it.
    fn record(
        &self,
        audit: &AuditLog,
        start: AuditStart,
        peer: SocketAddr,
        handled: &mut Handled,
        stream: bool,
    ) -> Option<(AuditLog, AuditEvent)> {
        if let Ok(id) = HeaderValue::from_str(&start.id.to_string()) {
            handled.response.headers_mut().insert(AUDIT_ID, id);
        }
        let policy_request = PolicyRequest {
            user: handled.user.as_deref(),
            verb: handled.verb,
            object_ref: handled.object_ref.as_ref(),
            path: start.request_uri.path(),
        };
        let kept = audit.stages_kept(&policy_request, handled.acts, stream);
        if kept == Stages::NONE {
            return None;
        }
        let event = AuditEvent {
            id: start.id,
            stage: if stream {
                Stage::ResponseStarted
            } else {
                Stage::ResponseComplete
            },
            request_uri: start.request_uri,
            verb: handled.verb,
            user: handled.user.clone(),
            source_ip: peer.ip(),
            user_agent: start.user_agent,
            object_ref: handled.object_ref.take(),
            response_code: handled.response.status().as_u16(),
            request_received: start.received,
            stage_timestamp: SystemTime::now(),
            authorization: handled.authorization.take(),
            summary: None,
        };
        let completion = (stream && kept.contains(Stage::ResponseComplete))
            .then(|| (audit.clone(), event.clone()));
        if kept.contains(event.stage) {
            audit.submit(event, handled.acts);
        }
        completion
    }

    async fn decide_and_forward(
        &self,
        forwarder: &Forwarder,
        identity: &ConnectionIdentity,
        peer: SocketAddr,
        req: Request<Incoming>,
        started: Instant,
    ) -> Handled {
        let verdict = self
            .decider
            .decide(
                req.method(),
                req.uri().path(),
                req.uri().query(),
                async |path| {
                    self.authenticator
                        .authenticate(
                            identity,
                            peer.ip(),
                            req.version(),
                            req.headers(),
                            path,
                            unix_now(),
                        )
                        .await
                },
                Unobserved,
            )
            .await;
        log_verdict(&verdict, peer, &req, &self.authenticator);
        if let Verdict::Authorized(judgement) = &verdict {
            let (mode, decision) = match &judgement.decision {
                RequestDecision::Allowed { authorizer, .. } => (*authorizer, "allowed"),
                RequestDecision::Forbidden { .. } => ("none", "forbidden"),
                RequestDecision::Error { .. } => ("none", "error"),
            };
            self.metrics.observe_authorization(mode, decision);
        }
        let subresource = verdict.subresource();
        // What only the audit event needs is taken only when there is an audit log.
        let audited = self.audit.is_some();
        let object_ref = audited
            .then(|| verdict.object_ref(&self.decider.node_name))
            .flatten();
        let verb = verdict.verb(req.method());
        let authorization = audited.then(|| verdict.audit()).flatten();
        let acts = verdict.acts();
        let refusal = match verdict.refusal() {
            Some(refusal) => Some(refusal),
            None if self.audit_require_for_streams
                && let Some(audit) = &self.audit
                && wire::is_upgrade_request(req.version(), req.headers())
                && headers::may_upgrade(req.uri().path(), req.headers())
                && !audit.is_writable() =>
            {
                warn!(%peer, "refusing a stream: its audit event cannot be written");
                Some(Refusal::AuditUnavailable)
            }
            None if acts
                && let Some(audit) = &self.audit
                && let Err(refused) = audit.admit_act(verdict.user().map(|u| u.name.as_str())) =>
            {
                debug!(%peer, retry_after = ?refused.retry_after, "refusing an act: over its audit share");
                Some(Refusal::AuditBudget(refused.retry_after))
            }
            None => None,
        };
        // A refused act did not act: its event is metered as any other.
        let acts = acts && refusal.is_none();
        let (response, outcome) = match (refusal, verdict.user()) {
            (Some(refusal), _) => refusal.answer(req.method()),
            (None, Some(user)) => {
                self.metrics.observe_decision(started.elapsed());
                self.forward(forwarder, peer, req, user).await
            }
            // An allowed verdict always has a user; refuse should that ever not hold.
            (None, None) => Refusal::Unauthenticated.answer(req.method()),
        };
        Handled {
            response,
            outcome,
            subresource,
            verb,
            object_ref,
            user: verdict.user().cloned(),
            authorization,
            acts,
        }
    }

    /// Forwards an allowed request; a failure becomes its refusal.
    async fn forward(
        &self,
        forwarder: &Forwarder,
        peer: SocketAddr,
        req: Request<Incoming>,
        user: &User,
    ) -> (Response<ResponseBody>, Outcome) {
        let method = req.method().clone();
        match forwarder.forward(req, user).await {
            Ok(response) => (response.map(Either::Left), Outcome::Allowed),
            Err(e @ ForwardError::CallerBody(_)) => {
                debug!(%peer, error = %e, "request body could not be read");
                Refusal::CallerBody(&e.to_string()).answer(&method)
            }
            Err(ForwardError::Busy(busy)) => {
                debug!(%peer, user = %user.name, error = %busy, "request not forwarded");
                Refusal::Busy(&busy).answer(&method)
            }
            Err(e) => {
                let diagnosis = cause::diagnose(&e);
                self.metrics.upstream_failed(diagnosis.cause);
                let detail = &diagnosis.detail;
                if self.upstream_reports.admit(diagnosis.cause) {
                    warn!(
                        cause = diagnosis.cause.as_str(),
                        "cannot reach the kubelet: {detail}"
                    );
                } else {
                    debug!(%peer, cause = diagnosis.cause.as_str(), "cannot reach the kubelet: {detail}");
                }
                Refusal::Upstream(&e.to_string()).answer(&method)
            }
        }
    }
}

/// One log line for a request the proxy refuses or allows: debug for the usual, warn for an
/// authorizer failure. Never a credential: only names, the path and reasons.
fn log_verdict(
    verdict: &Verdict,
    peer: SocketAddr,
    req: &Request<Incoming>,
    authenticator: &Authenticator,
) {
    let path = req.uri().path();
    let ignored_token = || authenticator.ignores_token(req.version(), req.headers());
    match verdict {
        Verdict::Redirect { .. } => {}
        Verdict::BadPath(reason) => debug!(%peer, %reason, "refused request path"),
        Verdict::Unauthenticated { failure: None } if ignored_token() => debug!(
            %peer,
            path,
            "no credential: a bearer token was sent, but token authentication is off \
             (--authentication-token-webhook)"
        ),
        Verdict::Unauthenticated { failure: None } => debug!(%peer, path, "no credential"),
        Verdict::Unauthenticated {
            failure: Some(reason),
        } => debug!(%peer, path, %reason, "authentication failed"),
        Verdict::Authorized(Judgement {
            user,
            attributes,
            pod,
            decision,
            ..
        }) => {
            if user.name == crate::authn::ANONYMOUS_USER && ignored_token() {
                debug!(
                    %peer,
                    path,
                    "anonymous: a bearer token was sent, but token authentication is off \
                     (--authentication-token-webhook)"
                );
            }
            let (user, verb) = (&user.name, attributes.verb);
            match decision {
                RequestDecision::Allowed {
                    subresource,
                    authorizer,
                    reason,
                } => debug!(%user, verb, path, subresource, authorizer, %reason, "allowed"),
                RequestDecision::Error { subresource, error } => {
                    warn!(%user, verb, path, subresource, %error, "authorization failed");
                }
                RequestDecision::Forbidden { reason } => {
                    let subresources = &attributes.subresources;
                    let pod = pod.as_ref().map(|pod| pod.label);
                    debug!(%user, verb, path, %subresources, pod, %reason, "forbidden");
                }
            }
        }
    }
}
