//! The decision about one request, made once for the server and for `explain`:
//!
//! 1. the path gate: not canonical → 301 to the cleaned path (query kept), unusable → 400, both
//!    before authentication, as the kubelet's Go router answers;
//! 2. the authentication outcome → 401;
//! 3. the verb and the ordered `nodes/<subresource>` attribute sets, then, with
//!    `--pod-scoped-authz`, the pod-level set of a container path (`pods/exec`, … on that pod);
//! 4. the kubelet's loop over those sets through the authorizer chain → 403 or 500.
//!
//! [`Decider::decide`] yields a [`Verdict`]; an [`Observer`] sees each step (a no-op on the request
//! path, a recorder in `explain`). [`Refusal::answer`] is the one place any refusal, decided here
//! or met while forwarding, becomes its response and its metrics label, and
//! [`Verdict::audit`] its audit annotation, so the server and `explain` cannot disagree.

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use crate::audit::acts::is_act;
use crate::audit::{Authorization as AuditAuthorization, ObjectRef};
use crate::authn::{Authentication, User};
use crate::authz::attributes::{AttributeMapping, KubeletAttributes, Subresources};
use crate::authz::attributes::{kubelet_attributes, verb_for_method};
use crate::authz::match_conditions::ConditionTrace;
use crate::authz::pod_attributes::{PodAttributes, pod_attributes};
use crate::authz::{AuthorizationError, Authorizer, AuthorizerChain, ChainEvent, Decision, Reason};
use crate::authz::{POD_RESOURCE, RESOURCE};
use crate::forward::Busy;
use crate::request::canonical_path::{PathCheck, PathError, check_path};
use crate::request::outcome::Outcome;
use crate::request::responses::{self, ResponseBody};

/// What decides: the authorizer chain, the attribute table in force and the Node name.
pub struct Decider {
    /// May they do it.
    pub authorizers: AuthorizerChain,
    /// How requests map to attributes.
    pub mapping: AttributeMapping,
    /// The Node name every attribute carries; shared with audit events.
    pub node_name: Arc<str>,
}

/// Sees each step of a decision as it is taken. Every method defaults to nothing, so the server's
/// observer ([`Unobserved`]) costs nothing.
pub trait Observer {
    /// The path is canonical; `decoded` is what the attributes are computed from.
    fn canonical(&mut self, _decoded: &str) {}
    /// One of a Webhook authorizer's match conditions was evaluated (or not, after a false one)
    /// on one attribute set, before that authorizer's answer.
    fn condition(
        &mut self,
        _subresource: &'static str,
        _authorizer: &Authorizer,
        _condition: ConditionTrace<'_>,
    ) {
    }
    /// One authorizer answered on one attribute set; authorizers after the deciding one are not
    /// asked and not shown.
    fn answered(
        &mut self,
        _subresource: &'static str,
        _authorizer: &Authorizer,
        _answer: &Result<Decision, AuthorizationError>,
    ) {
    }
    /// The chain decided on one attribute set, naming the deciding authorizer if one decided.
    fn decided(
        &mut self,
        _subresource: &'static str,
        _result: &Result<(Decision, Option<&'static str>), AuthorizationError>,
    ) {
    }
}

/// The observer of the request path: sees nothing.
pub struct Unobserved;

impl Observer for Unobserved {}

/// Lets a caller keep its observer and read it afterwards (`explain` passes `&mut recorder`).
impl<T: Observer> Observer for &mut T {
    fn canonical(&mut self, decoded: &str) {
        (**self).canonical(decoded);
    }

    fn condition(
        &mut self,
        subresource: &'static str,
        authorizer: &Authorizer,
        condition: ConditionTrace<'_>,
    ) {
        (**self).condition(subresource, authorizer, condition);
    }

    fn answered(
        &mut self,
        subresource: &'static str,
        authorizer: &Authorizer,
        answer: &Result<Decision, AuthorizationError>,
    ) {
        (**self).answered(subresource, authorizer, answer);
    }

    fn decided(
        &mut self,
        subresource: &'static str,
        result: &Result<(Decision, Option<&'static str>), AuthorizationError>,
    ) {
        (**self).decided(subresource, result);
    }
}

/// What was decided about a request before it is forwarded.
#[derive(Debug)]
pub enum Verdict {
    /// The path is not canonical: 301 to `location`, the cleaned path with the query.
    Redirect {
        /// The `Location` header.
        location: String,
    },
    /// The path is malformed or ambiguous: 400.
    BadPath(PathError),
    /// No usable credential: 401. `failure` says, for logs only, why a presented one was
    /// rejected; `None` when none was presented.
    Unauthenticated {
        /// Why the credential was rejected.
        failure: Option<String>,
    },
    /// The caller is known and the authorizers were asked.
    Authorized(Judgement),
}

/// The authorizers' judgement on an authenticated request.
#[derive(Debug)]
pub struct Judgement {
    /// The caller.
    pub user: Arc<User>,
    /// The verb and the subresources that were to be tried.
    pub attributes: KubeletAttributes,
    /// The pod-level set, when it was asked (`--pod-scoped-authz`, a container path, and no
    /// node-level set allowed), as its label and the pod it names. Not built when a node-level
    /// set allowed, so the common case copies nothing out of the path.
    pub pod: Option<PodTarget>,
    /// The outcome of the kubelet's loop.
    pub decision: RequestDecision,
    /// Whether the request acts ([`crate::audit::acts`]), judged on the path it was authorized on.
    pub acts: bool,
}

/// The pod a pod-level attribute set named, kept for audit (`objectRef`) and `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTarget {
    /// `pods/<subresource>`, the label the set's decision carries.
    pub label: &'static str,
    /// `log`, `exec`, `attach` or `portforward`.
    pub subresource: &'static str,
    /// The verb the set was asked with.
    pub verb: &'static str,
    /// The pod's namespace, from the path.
    pub namespace: Arc<str>,
    /// The pod's name, from the path.
    pub name: Arc<str>,
}

impl From<PodAttributes<'_>> for PodTarget {
    fn from(pod: PodAttributes<'_>) -> PodTarget {
        PodTarget {
            label: pod.label,
            subresource: pod.subresource,
            verb: pod.verb,
            namespace: Arc::from(pod.namespace),
            name: Arc::from(pod.pod),
        }
    }
}

/// The outcome of the kubelet's loop over a request's attribute sets.
#[derive(Debug, Clone)]
pub enum RequestDecision {
    /// Allowed on `subresource` by `authorizer` for `reason`.
    Allowed {
        /// The subresource whose attributes were allowed: a kubelet set's bare name (`proxy`),
        /// or the pod-level set's label (`pods/exec`).
        subresource: &'static str,
        /// The authorizer that allowed.
        authorizer: &'static str,
        /// Its reason.
        reason: Reason,
    },
    /// No attribute set was allowed: 403. `reason` is the last decision's reason.
    Forbidden {
        /// The last authorizer reason seen, for logs and audit.
        reason: Reason,
    },
    /// Authorizing `subresource` failed: 500, and the remaining attribute sets were not tried.
    Error {
        /// The subresource whose authorization failed.
        subresource: &'static str,
        /// What failed.
        error: AuthorizationError,
    },
}

impl Decider {
    /// Decides `method path?query`. `authenticate` runs only once the path passed the gate, so
    /// an unclean path never costs a TokenReview; it is given the decoded path (anonymous access
    /// may depend on it).
    pub async fn decide(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        authenticate: impl AsyncFnOnce(&str) -> Authentication,
        mut observer: impl Observer,
    ) -> Verdict {
        let decoded = match check_path(path) {
            PathCheck::Canonical { decoded } => decoded,
            PathCheck::Redirect { location } => {
                let location = match query {
                    Some(query) => format!("{location}?{query}"),
                    None => location,
                };
                return Verdict::Redirect { location };
            }
            PathCheck::Reject(reason) => return Verdict::BadPath(reason),
        };
        observer.canonical(&decoded);
        let user = match authenticate(&decoded).await {
            Authentication::User(user) => user,
            Authentication::Unauthenticated => return Verdict::Unauthenticated { failure: None },
            Authentication::Failed(reason) => {
                return Verdict::Unauthenticated {
                    failure: Some(reason),
                };
            }
        };
        let attributes = kubelet_attributes(&self.mapping, method, &decoded);
        let pod = if self.mapping.pod_scoped {
            pod_attributes(method, &decoded)
        } else {
            None
        };
        let decision = authorize_request(
            &self.authorizers,
            &attributes,
            pod,
            &user,
            &self.node_name,
            &decoded,
            &mut observer,
        )
        .await;
        // Asked last: when it decided, or when every set was refused.
        let asked = |pod: &PodAttributes<'_>| match &decision {
            RequestDecision::Allowed { subresource, .. }
            | RequestDecision::Error { subresource, .. } => *subresource == pod.label,
            RequestDecision::Forbidden { .. } => true,
        };
        Verdict::Authorized(Judgement {
            user,
            attributes,
            pod: pod.filter(asked).map(PodTarget::from),
            decision,
            acts: is_act(method, &decoded),
        })
    }
}

/// The kubelet's authorization loop (kubernetes v1.33 `pkg/kubelet/server/server.go`
/// `InstallAuthFilter`): each attribute set in order; only `Allow` stops it, `Deny` and
/// `NoOpinion` both move on to the next set, and an error ends it at once. The pod-level set
/// (`pod`), when there is one, comes last, so it can only add access to the pod in the path:
/// a node-level answer is reached exactly as without it.
pub async fn authorize_request(
    chain: &AuthorizerChain,
    request: &KubeletAttributes,
    pod: Option<PodAttributes<'_>>,
    user: &User,
    node_name: &str,
    path: &str,
    mut observer: impl Observer,
) -> RequestDecision {
    let mut reason = Reason::Static("no attributes");
    let sets = || {
        let names = request.subresources.iter();
        let node_sets = names.zip(request.attributes(user, node_name, path));
        let pod_set = pod.map(|pod| (pod.label, pod.attributes(user, path)));
        node_sets.chain(pod_set).enumerate()
    };
    // The authorizers that decide on the node are asked about every set first; a review is made
    // only for the sets none of them decided. The answer is the kubelet's: its loop goes on past
    // a refused set, so a set allowed locally is reached either way.
    let local = chain.local_prefix();
    let all = chain.authorizers().len();
    let (first, second) = if local == 0 || local == all {
        (0..all, None)
    } else {
        (0..local, Some(local..all))
    };
    // Sets the first pass left undecided, by index.
    let mut undecided: u64 = 0;
    for (index, (subresource, attrs)) in sets() {
        let result = chain
            .authorize_part(first.clone(), &attrs, |authorizer, event| {
                show(&mut observer, subresource, authorizer, event);
            })
            .await;
        // A request has at most four sets (three node-level, one pod-level); were there more,
        // those beyond 64 would be refused without a review: closed, not open.
        if second.is_some() && matches!(result, Ok((Decision::NoOpinion(_), _))) && index < 64 {
            undecided |= 1 << index;
            continue;
        }
        observer.decided(subresource, &result);
        match settle(subresource, result) {
            Ok(why) => reason = why,
            Err(decision) => return decision,
        }
    }
    let Some(second) = second else {
        return RequestDecision::Forbidden { reason };
    };
    for (index, (subresource, attrs)) in sets() {
        if undecided & (1 << index) == 0 {
            continue;
        }
        let result = chain
            .authorize_part(second.clone(), &attrs, |authorizer, event| {
                show(&mut observer, subresource, authorizer, event);
            })
            .await;
        observer.decided(subresource, &result);
        match settle(subresource, result) {
            Ok(why) => reason = why,
            Err(decision) => return decision,
        }
    }
    RequestDecision::Forbidden { reason }
}

/// Shows `observer` one event of the chain on `subresource`'s set.
fn show(
    observer: &mut impl Observer,
    subresource: &'static str,
    authorizer: &Authorizer,
    event: ChainEvent<'_>,
) {
    match event {
        ChainEvent::Condition(condition) => observer.condition(subresource, authorizer, condition),
        ChainEvent::Answer(answer) => observer.answered(subresource, authorizer, answer),
    }
}

/// One set's answer in the kubelet's loop: `Err` with the request's decision when it ends the
/// loop (allowed, or an error), else `Ok` with the refusal's reason and the loop goes on.
fn settle(
    subresource: &'static str,
    result: Result<(Decision, Option<&'static str>), AuthorizationError>,
) -> Result<Reason, RequestDecision> {
    match result {
        Ok((Decision::Allow(why), authorizer)) => Err(RequestDecision::Allowed {
            subresource,
            authorizer: authorizer.unwrap_or_default(),
            reason: why,
        }),
        Ok((Decision::Deny(why) | Decision::NoOpinion(why), _)) => Ok(why),
        Err(error) => Err(RequestDecision::Error { subresource, error }),
    }
}

/// Why the proxy answers a request itself instead of the kubelet.
#[derive(Debug)]
pub enum Refusal<'a> {
    /// 301 to the clean path.
    Redirect(&'a str),
    /// 400: the path is refused.
    BadPath(&'a PathError),
    /// 401.
    Unauthenticated,
    /// 403: no attribute set was allowed.
    Forbidden {
        /// The caller.
        user: &'a User,
        /// The verb asked about.
        verb: &'a str,
        /// Every subresource tried.
        subresources: &'a Subresources,
    },
    /// 500: an authorizer could not decide on `subresource`.
    AuthorizationError {
        /// The caller.
        user: &'a User,
        /// The verb asked about.
        verb: &'a str,
        /// The subresource whose authorization failed.
        subresource: &'a str,
    },
    /// 503: an exec, attach or portForward whose audit event cannot be written
    /// (`--audit-log-require-for-streams`).
    AuditUnavailable,
    /// 429: a request that acts, from an identity writing more than its fair share of audit
    /// bytes while the audit log's flood budget is spent; it may try again after the duration.
    AuditBudget(Duration),
    /// 429 or 503: no place among the requests in flight to the kubelet.
    Busy(&'a Busy),
    /// 400: the caller's request body could not be read.
    CallerBody(&'a str),
    /// 502: the kubelet could not be reached or failed.
    Upstream(&'a str),
}

impl Refusal<'_> {
    /// The response the proxy sends for `method` and the metrics label it is counted under.
    pub fn answer(&self, method: &Method) -> (http::Response<ResponseBody>, Outcome) {
        match self {
            Refusal::Redirect(location) => {
                (responses::redirect(method, location), Outcome::Redirected)
            }
            Refusal::BadPath(reason) => (
                responses::bad_request(&reason.to_string()),
                Outcome::BadRequest,
            ),
            Refusal::Unauthenticated => (responses::unauthorized(), Outcome::Unauthenticated),
            Refusal::Forbidden {
                user,
                verb,
                subresources,
            } => (
                responses::forbidden(user, verb, subresources),
                Outcome::Forbidden,
            ),
            Refusal::AuthorizationError {
                user,
                verb,
                subresource,
            } => (
                responses::authorization_error(user, verb, subresource),
                Outcome::AuthorizationError,
            ),
            Refusal::AuditUnavailable => (
                responses::service_unavailable(
                    "the audit log cannot be written (--audit-log-require-for-streams)",
                ),
                Outcome::AuditUnavailable,
            ),
            Refusal::AuditBudget(retry_after) => (
                responses::too_many_requests_after(
                    "this user's requests that act (exec, attach, portForward, run, checkpoint) \
                     are over their share of the audit log (--audit-log-flood-retention)",
                    *retry_after,
                ),
                Outcome::Throttled,
            ),
            Refusal::Busy(busy @ Busy::User(_)) => (
                responses::too_many_requests(&busy.to_string()),
                Outcome::Throttled,
            ),
            Refusal::Busy(busy @ Busy::Total(_)) => (
                responses::service_unavailable(&busy.to_string()),
                Outcome::Throttled,
            ),
            Refusal::CallerBody(reason) => (responses::bad_request(reason), Outcome::BadRequest),
            Refusal::Upstream(reason) => (responses::bad_gateway(reason), Outcome::UpstreamError),
        }
    }
}

impl Verdict {
    /// The refusal this verdict means, or `None` when the request is to be forwarded.
    pub fn refusal(&self) -> Option<Refusal<'_>> {
        Some(match self {
            Verdict::Redirect { location } => Refusal::Redirect(location),
            Verdict::BadPath(reason) => Refusal::BadPath(reason),
            Verdict::Unauthenticated { .. } => Refusal::Unauthenticated,
            Verdict::Authorized(judgement) => match &judgement.decision {
                RequestDecision::Allowed { .. } => return None,
                RequestDecision::Forbidden { .. } => Refusal::Forbidden {
                    user: &judgement.user,
                    verb: judgement.attributes.verb,
                    subresources: &judgement.attributes.subresources,
                },
                RequestDecision::Error { subresource, .. } => Refusal::AuthorizationError {
                    user: &judgement.user,
                    verb: judgement.attributes.verb,
                    subresource,
                },
            },
        })
    }

    /// The audit annotation: the authorizers' decision and reason, `None` when they were not
    /// asked (301, 400, 401). A refusal met while forwarding keeps the `allow` of the decision.
    pub fn audit(&self) -> Option<AuditAuthorization> {
        let Verdict::Authorized(judgement) = self else {
            return None;
        };
        Some(match &judgement.decision {
            RequestDecision::Allowed { reason, .. } => AuditAuthorization::Allow(reason.clone()),
            RequestDecision::Forbidden { reason } => AuditAuthorization::Forbid(reason.clone()),
            RequestDecision::Error { .. } => AuditAuthorization::Error,
        })
    }

    /// The Kubernetes verb: the mapped one once authenticated, else the method's.
    pub fn verb(&self, method: &Method) -> &'static str {
        match self {
            Verdict::Authorized(judgement) => judgement.attributes.verb,
            _ => verb_for_method(method),
        }
    }

    /// The subresource allowed, the one that failed, or the first asked for; empty before the
    /// path was mapped. Metrics and audit name it.
    pub fn subresource(&self) -> &'static str {
        let Verdict::Authorized(judgement) = self else {
            return "";
        };
        match &judgement.decision {
            RequestDecision::Allowed { subresource, .. }
            | RequestDecision::Error { subresource, .. } => subresource,
            RequestDecision::Forbidden { .. } => judgement
                .attributes
                .subresources
                .iter()
                .next()
                .unwrap_or_default(),
        }
    }

    /// The audit `objectRef`: the pod when the pod-level set allowed (or failed), else the Node
    /// `node_name` with [`Verdict::subresource`]; `None` before the path was mapped.
    pub fn object_ref(&self, node_name: &Arc<str>) -> Option<ObjectRef> {
        let subresource = self.subresource();
        if subresource.is_empty() {
            return None;
        }
        if let Verdict::Authorized(Judgement { pod: Some(pod), .. }) = self
            && pod.label == subresource
        {
            return Some(ObjectRef {
                resource: POD_RESOURCE,
                namespace: Some(Arc::clone(&pod.namespace)),
                subresource: pod.subresource,
                name: Arc::clone(&pod.name),
            });
        }
        Some(ObjectRef {
            resource: RESOURCE,
            namespace: None,
            subresource,
            name: Arc::clone(node_name),
        })
    }

    /// Whether the request is allowed and acts ([`crate::audit::acts`]): its audit event is never
    /// suppressed or omitted. A refused exec did nothing, so its event is treated as any refusal.
    pub fn acts(&self) -> bool {
        matches!(
            self,
            Verdict::Authorized(Judgement {
                decision: RequestDecision::Allowed { .. },
                acts: true,
                ..
            })
        )
    }

    /// The authenticated caller, if authentication was reached and succeeded.
    pub fn user(&self) -> Option<&Arc<User>> {
        match self {
            Verdict::Authorized(judgement) => Some(&judgement.user),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pod_tests;
