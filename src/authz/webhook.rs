//! The `Webhook` mode: SubjectAccessReview with the API server, exactly as the kubelet asks
//! (k8s.io/apiserver v0.33 `plugin/pkg/authorizer/webhook/webhook.go` `Authorize`: the request
//! body, the decision table, the 5 m / 30 s cache, the retries), plus
//! coalescing of concurrent identical reviews, which the kubelet lacks; and, as kube-apiserver's
//! webhooks (v1.34), the `matchConditions` that decide whether it is asked at all, evaluated before
//! the cache is looked up.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};

use super::match_conditions::{ConditionTrace, Match, MatchConditions, MatchError};
use super::metrics::AuthzMetrics;
use super::{API_VERSION, Attributes, AuthorizationError, Decision, Reason};
use crate::apiserver::cache::{CacheKey, KeyHasher, ReviewCache};
use crate::apiserver::{ApiServerClient, ReviewKind};
use crate::authn::User;
use prometheus_client::metrics::counter::Counter;

/// The kubelet's SubjectAccessReview cache size.
const MAX_CACHED_DECISIONS: u64 = 8192;
/// Requests whose attributes add up to this many bytes are not cached (the kubelet's DoS guard;
/// the path counts although it is not sent).
const MAX_CACHEABLE_ATTRIBUTE_BYTES: usize = 10_000;
/// How often a webhook's match-condition errors are logged: a condition failing on every request
/// must not become a log line per request.
const CONDITION_ERROR_REPORT_INTERVAL: Duration = Duration::from_secs(60);
/// The reason of the no opinion a false match condition gives (kube-apiserver gives none; ours
/// goes to audit and `explain`).
const SKIPPED: &str = "webhook not asked: a matchCondition is false";

/// What a webhook does when its review fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The failure is remembered and later authorizers are still asked; if none allows, 500.
    NoOpinion,
    /// The chain stops at the failure: 500.
    Deny,
}

/// One SubjectAccessReview webhook of the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSpec {
    /// Its name, for logs.
    pub name: String,
    /// The API server's kubeconfig; `None` for the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// Bound on each review attempt.
    pub timeout: Duration,
    /// How long allowed answers are kept (zero: not cached).
    pub authorized_ttl: Duration,
    /// How long other answers are kept (zero: not cached).
    pub unauthorized_ttl: Duration,
    /// What a failed review, or a match condition that cannot be evaluated, means.
    pub failure_policy: FailurePolicy,
    /// When the webhook is asked at all; none: always.
    pub match_conditions: MatchConditions,
}

/// Asks the API server whether a user may do something on this node, through a bounded,
/// coalescing cache.
pub struct SubjectAccessReviewAuthorizer {
    name: String,
    client: ApiServerClient,
    cache: ReviewCache<Decision>,
    failure_policy: FailurePolicy,
    match_conditions: MatchConditions,
    /// Reviews skipped by a false match condition.
    excluded: Counter,
    /// Reviews whose match conditions could not be evaluated.
    condition_errors: Counter,
    condition_log: ConditionErrorLog,
}

impl std::fmt::Debug for SubjectAccessReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewAuthorizer")
            .finish_non_exhaustive()
    }
}

impl SubjectAccessReviewAuthorizer {
    /// The webhook `spec` describes, asking through `client`: its authorized TTL keeps allowed
    /// answers, its unauthorized TTL denied and no-opinion ones
    /// (`--authorization-webhook-cache-authorized-ttl` / `-unauthorized-ttl`), its failure policy
    /// says whether a failed review stops the chain, its match conditions whether it is asked.
    pub fn new(
        client: ApiServerClient,
        spec: &WebhookSpec,
        metrics: &AuthzMetrics,
    ) -> SubjectAccessReviewAuthorizer {
        let (authorized_ttl, unauthorized_ttl) = (spec.authorized_ttl, spec.unauthorized_ttl);
        let ttl = move |decision: &Decision| match decision {
            Decision::Allow(_) => authorized_ttl,
            Decision::Deny(_) | Decision::NoOpinion(_) => unauthorized_ttl,
        };
        SubjectAccessReviewAuthorizer {
            name: spec.name.clone(),
            excluded: metrics.match_condition_exclusions(&spec.name),
            condition_errors: metrics.match_condition_errors(&spec.name),
            cache: ReviewCache::new(
                ReviewKind::SubjectAccessReview,
                MAX_CACHED_DECISIONS,
                ttl,
                Arc::clone(client.metrics()),
            ),
            client,
            failure_policy: spec.failure_policy,
            match_conditions: spec.match_conditions.clone(),
            condition_log: ConditionErrorLog::default(),
        }
    }

    /// Whether a failed review stops the chain (`failurePolicy: Deny`) instead of letting later
    /// authorizers decide (`NoOpinion`).
    pub fn stops_chain_on_error(&self) -> bool {
        self.failure_policy == FailurePolicy::Deny
    }

    /// The API server's decision on `attrs`. A review that fails after its retries, or an answer
    /// both allowed and denied, is an error (the kubelet answers 500). A false match condition is
    /// no opinion without asking; one that cannot be evaluated is an error.
    pub async fn authorize(&self, attrs: &Attributes<'_>) -> Result<Decision, AuthorizationError> {
        self.authorize_observed(attrs, |_| {}).await
    }

    /// [`authorize`](Self::authorize), showing `observe` each match condition's result (`explain`
    /// does; the server passes a no-op). The conditions see the spec the webhook would receive,
    /// and are evaluated before the cache is looked up, as kube-apiserver does.
    pub async fn authorize_observed(
        &self,
        attrs: &Attributes<'_>,
        observe: impl FnMut(ConditionTrace<'_>),
    ) -> Result<Decision, AuthorizationError> {
        if !self.match_conditions.is_empty() {
            match self.match_conditions.evaluate(&review_spec(attrs), observe) {
                Match::Matched => {}
                Match::Skipped => {
                    self.excluded.inc();
                    return Ok(Decision::NoOpinion(Reason::Static(SKIPPED)));
                }
                Match::Failed(error) => {
                    self.condition_errors.inc();
                    self.condition_log
                        .report(&self.name, self.failure_policy, &error);
                    return Err(AuthorizationError::MatchConditions(error));
                }
            }
        }
        let attribute_bytes = attrs.verb.len()
            + API_VERSION.len()
            + attrs.namespace.len()
            + attrs.resource.len()
            + attrs.subresource.len()
            + attrs.name.len()
            + attrs.path.len();
        if attribute_bytes >= MAX_CACHEABLE_ATTRIBUTE_BYTES {
            // Boxed, as `ReviewCache::get_or_review` boxes its reviews: inline, this rare path
            // would add its kilobytes to every request's future.
            return Box::pin(self.review(attrs)).await;
        }
        self.cache
            .get_or_review(RECENT_KEYS.with(|recent| recent.key(attrs)), || {
                self.review(attrs)
            })
            .await
            .map_err(|shared| (*shared).clone())
    }

    /// One SubjectAccessReview of `attrs`. The future owns its spec, so a refresh ahead can run
    /// it in the background.
    fn review(
        &self,
        attrs: &Attributes<'_>,
    ) -> impl Future<Output = Result<Decision, AuthorizationError>> + Send + 'static {
        let (client, spec) = (self.client.clone(), review_spec(attrs));
        async move {
            let status = client
                .subject_access_review(spec)
                .await
                .map_err(|e| AuthorizationError::Webhook(e.to_string()))?;
            decision_from_review(&status)
        }
    }
}

/// Logs a webhook's match-condition errors at most once per
/// [`CONDITION_ERROR_REPORT_INTERVAL`], with the count of those not logged since.
#[derive(Debug, Default)]
struct ConditionErrorLog {
    last: Mutex<Option<Instant>>,
    unreported: AtomicU64,
}

impl ConditionErrorLog {
    /// Whether an error met at `now` is logged; if so, with how many were not since the last.
    fn admit(&self, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last
            .is_some_and(|at| now.saturating_duration_since(at) < CONDITION_ERROR_REPORT_INTERVAL)
        {
            self.unreported.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.unreported.swap(0, Ordering::Relaxed))
    }

    fn report(&self, authorizer: &str, failure_policy: FailurePolicy, error: &MatchError) {
        let Some(suppressed) = self.admit(Instant::now()) else {
            return;
        };
        tracing::warn!(
            authorizer,
            failure_policy = ?failure_policy,
            suppressed,
            %error,
            "matchConditions could not be evaluated: the webhook is not asked and its failurePolicy answers"
        );
    }
}

/// The kubelet's reading of a SubjectAccessReview status (k8s.io/apiserver v0.33
/// `plugin/pkg/authorizer/webhook/webhook.go` `Authorize`): allowed → `Allow`,
/// denied → `Deny`, neither → `NoOpinion`, each with the API server's reason; both is an error.
/// Public so the handling of whatever the API server answers can be exercised on its own, as the
/// fuzzer does.
pub fn decision_from_review(
    status: &SubjectAccessReviewStatus,
) -> Result<Decision, AuthorizationError> {
    let reason = || Reason::Shared(Arc::from(status.reason.as_deref().unwrap_or_default()));
    match (status.allowed, status.denied == Some(true)) {
        (true, true) => Err(AuthorizationError::Webhook(
            "SubjectAccessReview answered both allowed and denied".into(),
        )),
        (true, false) => Ok(Decision::Allow(reason())),
        (false, true) => Ok(Decision::Deny(reason())),
        (false, false) => Ok(Decision::NoOpinion(reason())),
    }
}

/// The spec the kubelet sends (k8s.io/apiserver v0.33 `plugin/pkg/authorizer/webhook/webhook.go`
/// `Authorize`): empty verb, namespace and group omitted, version
/// `v1`, resource `nodes`, the subresource and node name; the user's name, uid, groups and extra
/// as authenticated (empty ones omitted, as Go's `omitempty` does). The pod-level set has the
/// pod's namespace, resource `pods` and the pod's name, as the API server's own check of the same
/// operation.
pub fn review_spec(attrs: &Attributes<'_>) -> SubjectAccessReviewSpec {
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let user = attrs.user;
    SubjectAccessReviewSpec {
        resource_attributes: Some(ResourceAttributes {
            namespace: non_empty(attrs.namespace),
            verb: non_empty(attrs.verb),
            version: Some(API_VERSION.to_owned()),
            resource: Some(attrs.resource.to_owned()),
            subresource: non_empty(attrs.subresource),
            name: non_empty(attrs.name),
            ..ResourceAttributes::default()
        }),
        user: non_empty(&user.name),
        uid: non_empty(&user.uid),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| {
            user.extra
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }),
        ..SubjectAccessReviewSpec::default()
    }
}

/// The cache key of the review of `attrs`: everything the spec is made of, so equal keys mean
/// equal reviews; any difference in verb, namespace, resource, subresource, name, user, uid, group
/// order or extra is a different entry, as in the kubelet. The user's part comes first, padded to
/// a SHA-256 block (`user_key_prefix`), so that the authorizer can hash it once per user
/// (`RecentKeys`) and each request only its attributes.
pub fn review_cache_key(attrs: &Attributes<'_>) -> CacheKey {
    finish_review_key(user_key_prefix(attrs.user), attrs)
}

/// The user's part of a review cache key: name, uid, groups in order and extra, each
/// length-prefixed or counted, so it says itself where it ends, then zeros to a block boundary.
fn user_key_prefix(user: &User) -> KeyHasher {
    let mut key = KeyHasher::sha256();
    key.field(user.name.as_bytes())
        .field(user.uid.as_bytes())
        .count(user.groups.len());
    for group in &user.groups {
        key.field(group.as_bytes());
    }
    key.count(user.extra.len());
    for (name, values) in &user.extra {
        key.field(name.as_bytes()).count(values.len());
        for value in values {
            key.field(value.as_bytes());
        }
    }
    key.pad_to_block();
    key
}

/// The key of `attrs` from its user's part, `prefix`.
fn finish_review_key(mut prefix: KeyHasher, attrs: &Attributes<'_>) -> CacheKey {
    prefix
        .field(attrs.verb.as_bytes())
        .field(attrs.namespace.as_bytes())
        .field(attrs.resource.as_bytes())
        .field(attrs.subresource.as_bytes())
        .field(attrs.name.as_bytes());
    prefix.finish()
}

/// How many users [`RecentKeys`] keeps: a kubelet's callers are few (the API server,
/// monitoring, a few people); a user beyond these only costs the hashing this saves, plus a scan
/// of this many.
const REMEMBERED_USERS: usize = 32;
/// How many attribute sets [`RecentKeys`] keeps the keys of, per user: a caller asks for a few
/// subresources (`healthz`, `metrics`, `stats`, `pods`, …).
const REMEMBERED_KEYS_PER_USER: usize = 8;

/// The review cache keys of the users seen last. A user's requests all share the user's part of
/// their keys ([`user_key_prefix`]), hashed here once, and mostly ask for the same few attribute
/// sets, whose keys are kept: a request whose user and attributes were seen hashes nothing, one
/// of a known user with new attributes only its attributes (one SHA-256 block for the kubelet's
/// sets). Users and attributes are found by equality with the whole user and every attribute
/// the key is made of, never by a digest or an address, so the key is exactly
/// [`review_cache_key`].
///
/// One per thread ([`RECENT_KEYS`]): each serving thread keeps its own, so a request takes no
/// lock for its key. The key is a function of the attributes alone, so the authorizers of a
/// thread share its table.
#[derive(Default)]
struct RecentKeys {
    /// Newest first; the oldest goes when a new user comes and there are [`REMEMBERED_USERS`].
    users: RefCell<VecDeque<RecentUser>>,
}

thread_local! {
    /// This thread's [`RecentKeys`].
    static RECENT_KEYS: RecentKeys = RecentKeys::default();
}

/// A user [`RecentKeys`] remembers.
struct RecentUser {
    user: User,
    /// The user's part of every key, hashed and padded.
    prefix: KeyHasher,
    /// Newest first, at most [`REMEMBERED_KEYS_PER_USER`].
    keys: VecDeque<(KeyAttributes, CacheKey)>,
}

/// The attributes a review key is made of besides the user ([`finish_review_key`]), owned.
struct KeyAttributes {
    verb: String,
    namespace: String,
    resource: &'static str,
    subresource: String,
    name: String,
}

impl KeyAttributes {
    fn new(attrs: &Attributes<'_>) -> KeyAttributes {
        KeyAttributes {
            verb: attrs.verb.to_owned(),
            namespace: attrs.namespace.to_owned(),
            resource: attrs.resource,
            subresource: attrs.subresource.to_owned(),
            name: attrs.name.to_owned(),
        }
    }

    /// Whether `attrs` has these attributes, every one of them.
    fn matches(&self, attrs: &Attributes<'_>) -> bool {
        self.verb == attrs.verb
            && self.namespace == attrs.namespace
            && self.resource == attrs.resource
            && self.subresource == attrs.subresource
            && self.name == attrs.name
    }
}

impl RecentKeys {
    /// [`review_cache_key`] of `attrs`.
    fn key(&self, attrs: &Attributes<'_>) -> CacheKey {
        let mut users = self.users.borrow_mut();
        if let Some(known) = users.iter_mut().find(|known| known.user == *attrs.user) {
            if let Some((_, key)) = known.keys.iter().find(|(seen, _)| seen.matches(attrs)) {
                return *key;
            }
            let key = finish_review_key(known.prefix.clone(), attrs);
            if known.keys.len() >= REMEMBERED_KEYS_PER_USER {
                known.keys.pop_back();
            }
            known.keys.push_front((KeyAttributes::new(attrs), key));
            return key;
        }
        let prefix = user_key_prefix(attrs.user);
        let key = finish_review_key(prefix.clone(), attrs);
        if users.len() >= REMEMBERED_USERS {
            users.pop_back();
        }
        users.push_front(RecentUser {
            user: attrs.user.clone(),
            prefix,
            keys: VecDeque::from([(KeyAttributes::new(attrs), key)]),
        });
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn attrs<'a>(user: &'a User, verb: &'a str, subresource: &'a str) -> Attributes<'a> {
        Attributes::node(user, verb, subresource, "worker-1", "/pods")
    }

    #[test]
    fn spec_is_the_kubelets() {
        let user = User {
            name: "system:serviceaccount:monitoring:agent".into(),
            uid: "8d3c".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/pod-name".into(),
                vec!["agent-x7k2p".into()],
            )]),
        };
        let json = serde_json::to_value(review_spec(&attrs(&user, "get", "pods"))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "resourceAttributes": {
                    "verb": "get", "version": "v1", "resource": "nodes",
                    "subresource": "pods", "name": "worker-1"
                },
                "user": "system:serviceaccount:monitoring:agent",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["agent-x7k2p"]},
                "uid": "8d3c"
            })
        );
        let anonymous = User::anonymous();
        let json = serde_json::to_value(review_spec(&attrs(&anonymous, "", "healthz"))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "resourceAttributes": {
                    "version": "v1", "resource": "nodes", "subresource": "healthz", "name": "worker-1"
                },
                "user": "system:anonymous",
                "groups": ["system:unauthenticated"]
            })
        );
        let pod = Attributes {
            namespace: "team-a",
            resource: "pods",
            subresource: "exec",
            name: "web-0",
            verb: "create",
            ..attrs(&anonymous, "", "")
        };
        assert_eq!(
            serde_json::to_value(review_spec(&pod)).unwrap()["resourceAttributes"],
            serde_json::json!({
                "namespace": "team-a", "verb": "create", "version": "v1", "resource": "pods",
                "subresource": "exec", "name": "web-0"
            })
        );
    }

    #[test]
    fn condition_errors_are_logged_once_a_minute_with_the_count_not_logged() {
        let log = ConditionErrorLog::default();
        let start = Instant::now();
        assert_eq!(log.admit(start), Some(0));
        assert_eq!(log.admit(start + Duration::from_secs(1)), None);
        assert_eq!(log.admit(start + Duration::from_secs(59)), None);
        assert_eq!(log.admit(start + Duration::from_secs(60)), Some(2));
        assert_eq!(log.admit(start + Duration::from_secs(61)), None);
        assert_eq!(log.admit(start + Duration::from_secs(121)), Some(1));
    }

    #[test]
    fn keys_differ_on_every_field_of_the_spec() {
        let base = User {
            name: "alice".into(),
            uid: "u".into(),
            groups: vec!["a".into(), "b".into()],
            extra: BTreeMap::from([("k".into(), vec!["v".into()])]),
        };
        let key = |u: &User, verb, sub| review_cache_key(&attrs(u, verb, sub));
        let reference = key(&base, "get", "pods");
        assert_eq!(reference, key(&base.clone(), "get", "pods"));
        let mut swapped = base.clone();
        swapped.groups.reverse();
        let mut other_uid = base.clone();
        other_uid.uid = "v".into();
        let mut other_extra = base.clone();
        other_extra.extra.insert("k".into(), vec!["w".into()]);
        for (what, other) in [
            ("verb", key(&base, "create", "pods")),
            ("subresource", key(&base, "get", "proxy")),
            ("group order", key(&swapped, "get", "pods")),
            ("uid", key(&other_uid, "get", "pods")),
            ("extra", key(&other_extra, "get", "pods")),
            (
                "namespace",
                review_cache_key(&Attributes {
                    namespace: "team-a",
                    ..attrs(&base, "get", "pods")
                }),
            ),
            (
                "resource",
                review_cache_key(&Attributes {
                    resource: "pods",
                    ..attrs(&base, "get", "pods")
                }),
            ),
        ] {
            assert_ne!(reference, other, "{what} must change the key");
        }
    }

    #[test]
    fn recent_keys_are_the_exact_keys() {
        let user = |name: &str, groups: &[&str], extra: &[(&str, &str)]| User {
            name: name.into(),
            uid: "u".into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                .collect(),
        };
        // Users equal but for one detail, the user part of each longer or shorter than a block.
        let long = "system:serviceaccount:monitoring:a-rather-long-service-account-name";
        let users = [
            user("alice", &["a", "b"], &[]),
            user("alice", &["b", "a"], &[]),
            user("alice", &["a", "b"], &[("k", "v")]),
            user("alice", &["a", "b"], &[("k", "w")]),
            user(
                long,
                &["system:serviceaccounts", "system:authenticated"],
                &[],
            ),
            user(long, &["system:serviceaccounts"], &[("pod-name", "x")]),
        ];
        // Attribute sets equal but for one attribute.
        fn sets(u: &User) -> [Attributes<'_>; 6] {
            let base = attrs(u, "get", "pods");
            [
                base,
                Attributes {
                    verb: "create",
                    ..base
                },
                Attributes {
                    subresource: "proxy",
                    ..base
                },
                Attributes {
                    namespace: "team-a",
                    ..base
                },
                Attributes {
                    resource: "pods",
                    ..base
                },
                Attributes {
                    name: "worker-2",
                    ..base
                },
            ]
        }
        let recent = RecentKeys::default();
        let mut seen = Vec::new();
        // Twice round: first each key is hashed, then found.
        for _ in 0..2 {
            for u in &users {
                for a in sets(u) {
                    let key = recent.key(&a);
                    assert_eq!(key, review_cache_key(&a), "{a:?}");
                    seen.push(key);
                }
            }
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            users.len() * 6,
            "every user and set has its own key"
        );
        // More sets of one user, and more users, than are kept: all still have their exact key.
        for i in 0..REMEMBERED_KEYS_PER_USER * 2 {
            let name = format!("node-{i}");
            let a = Attributes {
                name: &name,
                ..attrs(&users[0], "get", "pods")
            };
            assert_eq!(recent.key(&a), review_cache_key(&a));
        }
        for i in 0..REMEMBERED_USERS * 2 {
            let u = user(&format!("user-{i}"), &["g"], &[]);
            let a = attrs(&u, "get", "pods");
            assert_eq!(recent.key(&a), review_cache_key(&a));
        }
        let kept = recent.users.borrow();
        assert_eq!(kept.len(), REMEMBERED_USERS);
        assert!(
            kept.iter()
                .all(|u| u.keys.len() <= REMEMBERED_KEYS_PER_USER)
        );
        drop(kept);
        for a in sets(&users[0]) {
            assert_eq!(recent.key(&a), review_cache_key(&a));
        }
    }
}
