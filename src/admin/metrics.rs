//! Prometheus metrics of the proxy, served on the admin listener. Label values come from small
//! fixed sets (status codes, decisions, subresource names): never a user name, path or token.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::audit::policy::OmittedEvents;

use super::labels::{AUTHORIZATION_DECISIONS, AUTHORIZATION_MODES};
pub use super::labels::{
    ApiCallLabels, AuditOmittedLabels, AuthorizationDecisionLabels, AuthorizerLabels, CacheLabels,
    CacheResult, DecisionLabels, FetchResultLabels, LocalRejectionLabels, Outcome, RefreshLabels,
    RefreshResult, ReloadLabels, ReloadResult, RequestLabels, ReviewFailureLabels, ReviewKind,
    ReviewKindLabels, SkippedBudgetLabels, SuppressedLabels, ThreadLabels, UpstreamErrorLabels,
};

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ])
}

/// Every metric family of the proxy and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<DecisionLabels, Histogram, fn() -> Histogram>,
    /// The latency family's histogram of each outcome (indexed by [`Outcome::index`]), looked up
    /// in the family once: a lookup hashes the labels and takes the family's lock, per request.
    latency_by_outcome: [std::sync::OnceLock<Histogram>; Outcome::COUNT],
    decision_latency: Histogram,
    connections: Gauge,
    connections_limit: Gauge,
    streams: Gauge,
    upstream_requests: Gauge,
    handshake_failures: Counter,
    connection_timeouts: Counter,
    accepted: Family<ThreadLabels, Counter>,
    api_calls: Family<ApiCallLabels, Counter>,
    api_latency: Family<ReviewKindLabels, Histogram, fn() -> Histogram>,
    reviews_in_flight: Family<ReviewKindLabels, Gauge>,
    reviews_waiting: Family<ReviewKindLabels, Gauge>,
    reviews_refused: Family<ReviewKindLabels, Counter>,
    cache_lookups: Family<CacheLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    review_failures: Family<ReviewFailureLabels, Counter>,
    reviews_deferred: Family<ReviewKindLabels, Counter>,
    hold_off_until: Gauge,
    refreshes_ahead: Family<RefreshLabels, Counter>,
    audit_dropped: Counter,
    tokens_refused_locally: Family<LocalRejectionLabels, Counter>,
    sa_key_fetches: Family<FetchResultLabels, Counter>,
    sa_keys: Gauge,
    reviews_skipped: Family<SkippedBudgetLabels, Counter>,
    audit_suppressed: Family<SuppressedLabels, Counter>,
    audit_omitted: Family<AuditOmittedLabels, Counter>,
    match_condition_exclusions: Family<AuthorizerLabels, Counter>,
    match_condition_errors: Family<AuthorizerLabels, Counter>,
    generation: crate::admin::generation::Generation,
    certificates: crate::admin::certificates::CertificateMetrics,
    rbac: crate::authz::live_rbac::metrics::RbacMetrics,
    decisions: Family<AuthorizationDecisionLabels, Counter>,
    /// Each (mode, decision) pair's counter of `decisions`, once used.
    decisions_by_pair:
        [std::sync::OnceLock<Counter>; AUTHORIZATION_MODES.len() * AUTHORIZATION_DECISIONS.len()],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every family under the `kubelet_auth_proxy` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kubelet_auth_proxy");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests served, by status code, decision and subresource",
            requests.clone(),
        );
        let latency: Family<DecisionLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request headers to response headers, by decision",
            latency.clone(),
        );
        let decision_latency = latency_histogram();
        registry.register(
            "request_decision_duration_seconds",
            "Time from request headers until a request allowed was authenticated and authorized and handed to the kubelet connection: the latency the proxy adds before the kubelet sees it, reviews the caches could not answer included",
            decision_latency.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections currently open, upgraded exec, attach and portForward sessions included",
            connections.clone(),
        );
        let connections_limit = Gauge::default();
        registry.register(
            "connections_limit",
            "Most client connections served at once (--max-connections, lowered when the file-descriptor limit asks): connections_open / connections_limit is how near the cap the proxy is",
            connections_limit.clone(),
        );
        let streams = Gauge::default();
        registry.register(
            "upgraded_streams_open",
            "exec, attach and portForward sessions currently spliced to the kubelet",
            streams.clone(),
        );
        let upstream_requests = Gauge::default();
        registry.register(
            "upstream_requests_in_flight",
            "Requests in flight to the kubelet, each holding an upstream connection, at most --upstream-max-requests-inflight",
            upstream_requests.clone(),
        );
        let handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "Client TLS handshakes that failed or timed out",
            handshake_failures.clone(),
        );
        let connection_timeouts = Counter::default();
        registry.register(
            "connection_timeouts",
            "Client connections closed because no request came within --header-read-timeout after the handshake, or within --idle-connection-timeout after the last one",
            connection_timeouts.clone(),
        );
        let accepted = Family::<ThreadLabels, Counter>::default();
        registry.register(
            "serving_thread_connections_accepted",
            "Client connections accepted, by serving thread (--serving-threads): how evenly the threads share the connections",
            accepted.clone(),
        );
        let api_calls = Family::<ApiCallLabels, Counter>::default();
        registry.register(
            "apiserver_calls",
            "TokenReview and SubjectAccessReview HTTP attempts, by kind and status code (0: no answer)",
            api_calls.clone(),
        );
        let api_latency: Family<ReviewKindLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "apiserver_call_duration_seconds",
            "Duration of TokenReview and SubjectAccessReview HTTP attempts",
            api_latency.clone(),
        );
        let reviews_in_flight = Family::<ReviewKindLabels, Gauge>::default();
        registry.register(
            "apiserver_reviews_in_flight",
            "TokenReviews and SubjectAccessReviews being made now (attempts and retries), at most --apiserver-max-reviews-inflight per kind",
            reviews_in_flight.clone(),
        );
        let reviews_waiting = Family::<ReviewKindLabels, Gauge>::default();
        registry.register(
            "apiserver_reviews_waiting",
            "Reviews waiting for a place under --apiserver-max-reviews-inflight",
            reviews_waiting.clone(),
        );
        let reviews_refused = Family::<ReviewKindLabels, Counter>::default();
        registry.register(
            "apiserver_reviews_refused",
            "Reviews never made because no place came free in time or too many were waiting; their requests failed closed",
            reviews_refused.clone(),
        );
        let cache_lookups = Family::<CacheLabels, Counter>::default();
        registry.register(
            "review_cache_lookups",
            "Token and authorization cache lookups: hit, miss (called the API server) or coalesced (waited for a call already in flight)",
            cache_lookups.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Reloads of the serving certificate, client CA and policy files after they changed on disk",
            reloads.clone(),
        );
        let upstream_errors = Family::<UpstreamErrorLabels, Counter>::default();
        registry.register(
            "upstream_errors",
            "Requests that could not be forwarded because the kubelet could not be reached, by cause",
            upstream_errors.clone(),
        );
        let review_failures = Family::<ReviewFailureLabels, Counter>::default();
        registry.register(
            "apiserver_review_failures",
            "TokenReviews and SubjectAccessReviews that failed after their retries, by cause; each failed its request closed",
            review_failures.clone(),
        );
        let reviews_deferred = Family::<ReviewKindLabels, Counter>::default();
        registry.register(
            "apiserver_reviews_held_off",
            "Reviews not sent because the API server's Retry-After outlasted --apiserver-request-timeout; each failed its request closed",
            reviews_deferred.clone(),
        );
        let hold_off_until = Gauge::default();
        registry.register(
            "apiserver_hold_off_until_timestamp_seconds",
            "End of the API server's last Retry-After hold as Unix time (0: none); the hold left is this minus time(), when positive",
            hold_off_until.clone(),
        );
        let refreshes_ahead = Family::<RefreshLabels, Counter>::default();
        registry.register(
            "cache_refreshes_ahead",
            "Cache entries revalidated in the background because they were used in the last tenth of their lifetime, by result",
            refreshes_ahead.clone(),
        );
        let tokens_refused_locally = Family::<LocalRejectionLabels, Counter>::default();
        registry.register(
            "tokens_refused_locally",
            "Bearer tokens of the cluster's service-account issuer refused on the node, without a TokenReview, by reason: malformed, unknown_key, signature, expired, not_yet_valid, audience, algorithm",
            tokens_refused_locally.clone(),
        );
        let sa_key_fetches = Family::<FetchResultLabels, Counter>::default();
        registry.register(
            "service_account_key_fetches",
            "Fetches of the service-account issuer's public keys from the API server, by result (success, failed)",
            sa_key_fetches.clone(),
        );
        let reviews_skipped = Family::<SkippedBudgetLabels, Counter>::default();
        registry.register(
            "token_reviews_skipped",
            "Bearer tokens answered 401 without a TokenReview because their source's failed authentications were over budget, by the budget spent: source (the source's own) or overall (the node's)",
            reviews_skipped.clone(),
        );
        let sa_keys = Gauge::default();
        registry.register(
            "service_account_keys",
            "Public keys of the service-account issuer held for checking tokens on the node (0: none, every token goes to TokenReview)",
            sa_keys.clone(),
        );
        let audit_dropped = Counter::default();
        registry.register(
            "audit_events_dropped",
            "Audit events not written: the writer fell behind (queue full) or writing failed",
            audit_dropped.clone(),
        );
        let audit_suppressed = Family::<SuppressedLabels, Counter>::default();
        registry.register(
            "audit_events_suppressed",
            "Audit events not written because their identity's (reason budget) or the overall (overall_budget) flood budget was spent; summary events name the identities",
            audit_suppressed.clone(),
        );
        let audit_omitted = Family::<AuditOmittedLabels, Counter>::default();
        registry.register(
            "audit_events_omitted",
            "Audit events --audit-policy-file left out, by reason: no_rule (no rule matched: level None), level_none (the matching rule's level is None), omitted_stage (the rule's omitStages)",
            audit_omitted.clone(),
        );
        let match_condition_exclusions = Family::<AuthorizerLabels, Counter>::default();
        registry.register(
            "authorization_match_condition_exclusions",
            "Webhook authorizations skipped because a matchCondition was false (no opinion, no SubjectAccessReview), by authorizer",
            match_condition_exclusions.clone(),
        );
        let match_condition_errors = Family::<AuthorizerLabels, Counter>::default();
        registry.register(
            "authorization_match_condition_evaluation_errors",
            "Webhook authorizations whose matchConditions could not be evaluated (the failurePolicy answered), by authorizer",
            match_condition_errors.clone(),
        );
        let generation = crate::admin::generation::Generation::register(&mut registry);
        let certificates = crate::admin::certificates::CertificateMetrics::register(&mut registry);
        let rbac = crate::authz::live_rbac::metrics::RbacMetrics::register(&mut registry);
        let decisions = Family::<AuthorizationDecisionLabels, Counter>::default();
        registry.register(
            "authorization_decisions",
            "Requests authorized, by the mode that decided (RBAC, Webhook, Policy, Node, AlwaysAllow; none when no authorizer allowed) and the decision (allowed, forbidden, error)",
            decisions.clone(),
        );
        // The counters an alert computes `increase()` or `rate()` over, and the gauges beside
        // them, exist at 0 from the start for every value of their small label sets: a series
        // that first appears at 1 hides its first event from `increase()`, and a dashboard
        // shows a flat zero instead of no data.
        for cause in crate::forward::cause::Cause::ALL {
            drop(upstream_errors.get_or_create(&UpstreamErrorLabels {
                cause: cause.as_str(),
            }));
        }
        for kind in [ReviewKind::TokenReview, ReviewKind::SubjectAccessReview] {
            for cause in crate::apiserver::failure::FAILURE_CAUSES {
                drop(review_failures.get_or_create(&ReviewFailureLabels { kind, cause }));
            }
            let labels = ReviewKindLabels { kind };
            drop(reviews_in_flight.get_or_create(&labels));
            drop(reviews_waiting.get_or_create(&labels));
            drop(reviews_refused.get_or_create(&labels));
            drop(reviews_deferred.get_or_create(&labels));
        }
        Metrics {
            registry,
            generation,
            certificates,
            rbac,
            decisions,
            decisions_by_pair: Default::default(),
            requests,
            latency,
            latency_by_outcome: Default::default(),
            decision_latency,
            connections,
            connections_limit,
            streams,
            upstream_requests,
            handshake_failures,
            connection_timeouts,
            accepted,
            api_calls,
            api_latency,
            reviews_in_flight,
            reviews_waiting,
            reviews_refused,
            cache_lookups,
            reloads,
            upstream_errors,
            review_failures,
            reviews_deferred,
            hold_off_until,
            refreshes_ahead,
            audit_dropped,
            tokens_refused_locally,
            sa_key_fetches,
            sa_keys,
            reviews_skipped,
            audit_suppressed,
            audit_omitted,
            match_condition_exclusions,
            match_condition_errors,
        }
    }

    /// The `RBAC` authorizer's metrics.
    pub fn rbac(&self) -> &crate::authz::live_rbac::metrics::RbacMetrics {
        &self.rbac
    }

    /// Counts one request's authorization: the mode that allowed (`none` if none did) and the
    /// decision.
    pub fn observe_authorization(&self, mode: &'static str, decision: &'static str) {
        let labels = || AuthorizationDecisionLabels { mode, decision };
        // The modes and decisions are fixed sets: once a pair's counter is made, a request finds
        // it without the family's lock. Any other name (none is) goes through the family.
        let slot = AUTHORIZATION_MODES
            .iter()
            .position(|m| *m == mode)
            .zip(AUTHORIZATION_DECISIONS.iter().position(|d| *d == decision))
            .map(|(m, d)| &self.decisions_by_pair[m * AUTHORIZATION_DECISIONS.len() + d]);
        match slot {
            Some(slot) => slot
                .get_or_init(|| self.decisions.get_or_create(&labels()).clone())
                .inc(),
            None => self.decisions.get_or_create(&labels()).inc(),
        };
    }

    /// Records one finished request (at response headers; streams continue afterwards).
    pub fn observe_request(&self, labels: &RequestLabels, elapsed: Duration) {
        self.requests.get_or_create(labels).inc();
        self.latency_by_outcome[labels.decision.index()]
            .get_or_init(|| {
                self.latency
                    .get_or_create(&DecisionLabels {
                        decision: labels.decision,
                    })
                    .clone()
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records how long an allowed request took to be decided, from its headers to its hand-over
    /// to the forwarder: what the proxy adds to the kubelet's own time.
    pub fn observe_decision(&self, elapsed: Duration) {
        self.decision_latency.observe(elapsed.as_secs_f64());
    }

    /// Records one HTTP attempt to the API server.
    pub fn observe_api_call(&self, labels: &ApiCallLabels, elapsed: Duration) {
        self.api_calls.get_or_create(labels).inc();
        self.api_latency
            .get_or_create(&ReviewKindLabels { kind: labels.kind })
            .observe(elapsed.as_secs_f64());
    }

    /// The gauge of `kind` reviews in flight.
    pub fn reviews_in_flight(&self, kind: ReviewKind) -> Gauge {
        self.reviews_in_flight
            .get_or_create(&ReviewKindLabels { kind })
            .clone()
    }

    /// The gauge of `kind` reviews waiting for a place.
    pub fn reviews_waiting(&self, kind: ReviewKind) -> Gauge {
        self.reviews_waiting
            .get_or_create(&ReviewKindLabels { kind })
            .clone()
    }

    /// Counts a `kind` review refused for want of a place.
    pub fn review_refused(&self, kind: ReviewKind) {
        self.reviews_refused
            .get_or_create(&ReviewKindLabels { kind })
            .inc();
    }

    /// Records how a review cache lookup was served.
    pub fn observe_cache(&self, cache: ReviewKind, result: CacheResult) {
        self.cache_lookups
            .get_or_create(&CacheLabels { cache, result })
            .inc();
    }

    /// The counter of `cache`'s lookups served as `result`, handed to the cache once so that
    /// counting its hits, one or two per request, costs no label lookup.
    pub fn cache_lookups(&self, cache: ReviewKind, result: CacheResult) -> Counter {
        self.cache_lookups
            .get_or_create(&CacheLabels { cache, result })
            .clone()
    }

    /// Creates the reload counters of `target` at 0 (applied and failed), once the target is
    /// watched, so an alert's `increase()` sees its first failed reload.
    pub fn watch_reloads(&self, target: &'static str) {
        for result in [ReloadResult::Applied, ReloadResult::Failed] {
            drop(self.reloads.get_or_create(&ReloadLabels { target, result }));
        }
    }

    /// Records a reload after a file change.
    pub fn observe_reload(&self, target: &'static str, result: ReloadResult) {
        self.reloads
            .get_or_create(&ReloadLabels { target, result })
            .inc();
    }

    /// The counter of `name`'s webhook authorizations skipped by a false match condition, handed
    /// to that authorizer once so counting costs no label lookup.
    pub fn match_condition_exclusions(&self, name: &str) -> Counter {
        self.match_condition_exclusions
            .get_or_create(&AuthorizerLabels {
                name: name.to_owned(),
            })
            .clone()
    }

    /// The counter of `name`'s webhook authorizations whose match conditions failed.
    pub fn match_condition_errors(&self, name: &str) -> Counter {
        self.match_condition_errors
            .get_or_create(&AuthorizerLabels {
                name: name.to_owned(),
            })
            .clone()
    }

    /// Creates the counters of tokens refused on the node and of key fetches at 0: service-account
    /// tokens are checked on the node.
    pub fn service_account_keys_watched(&self) {
        for rejection in crate::authn::jwt::Rejection::ALL {
            drop(
                self.tokens_refused_locally
                    .get_or_create(&LocalRejectionLabels {
                        reason: rejection.as_str(),
                    }),
            );
        }
        for result in ["success", "failed"] {
            drop(
                self.sa_key_fetches
                    .get_or_create(&FetchResultLabels { result }),
            );
        }
    }

    /// Counts a token refused on the node.
    pub fn token_refused_locally(&self, rejection: crate::authn::jwt::Rejection) {
        self.tokens_refused_locally
            .get_or_create(&LocalRejectionLabels {
                reason: rejection.as_str(),
            })
            .inc();
    }

    /// The counters of tokens answered 401 without a review, by the budget spent (`source` or
    /// `overall`), created at 0: tokens are reviewed, so their failures are budgeted.
    pub fn token_reviews_skipped(&self) -> [Counter; 2] {
        ["source", "overall"].map(|budget| {
            self.reviews_skipped
                .get_or_create(&SkippedBudgetLabels { budget })
                .clone()
        })
    }

    /// Counts a fetch of the issuer's keys; a success sets how many are held.
    pub fn service_account_keys_fetched(&self, success: bool, keys: usize) {
        let result = if success { "success" } else { "failed" };
        self.sa_key_fetches
            .get_or_create(&FetchResultLabels { result })
            .inc();
        if success {
            self.sa_keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
        }
    }

    /// The counter of dropped audit events, handed to the audit log.
    pub fn audit_dropped(&self) -> Counter {
        self.audit_dropped.clone()
    }

    /// The counters of audit events kept out of the log by the flood budget, each created at 0
    /// (the budget is in force).
    pub fn audit_suppressed(&self) -> Family<SuppressedLabels, Counter> {
        for reason in ["budget", "overall_budget"] {
            for authenticated in [false, true] {
                drop(self.audit_suppressed.get_or_create(&SuppressedLabels {
                    reason,
                    authenticated,
                }));
            }
        }
        self.audit_suppressed.clone()
    }

    /// The counters of audit events `--audit-policy-file` omits, one per reason, created now so
    /// counting takes no lock.
    pub fn audit_omitted(&self) -> OmittedEvents {
        let reason = |reason| {
            self.audit_omitted
                .get_or_create(&AuditOmittedLabels { reason })
                .clone()
        };
        OmittedEvents {
            no_rule: reason("no_rule"),
            level_none: reason("level_none"),
            omitted_stage: reason("omitted_stage"),
        }
    }

    /// The open-connections gauge: every client connection, upgraded sessions included, counted
    /// by its [`crate::server::deadlines::ConnectionSlot`].
    pub fn connections(&self) -> &Gauge {
        &self.connections
    }

    /// Sets the cap on client connections in force, for alerts on how near it the proxy is.
    pub fn set_connections_limit(&self, limit: u32) {
        self.connections_limit.set(i64::from(limit));
    }

    /// The open upgraded-streams gauge.
    pub fn streams(&self) -> &Gauge {
        &self.streams
    }

    /// The gauge of requests in flight to the kubelet, handed to the forwarder.
    pub fn upstream_requests_in_flight(&self) -> Gauge {
        self.upstream_requests.clone()
    }

    /// Counts a failed or timed-out TLS handshake.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Counts a request that could not reach the kubelet, by cause.
    pub fn upstream_failed(&self, cause: &'static str) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels { cause })
            .inc();
    }

    /// Counts a review call not sent because the API server's `Retry-After` outlasted what the
    /// review may wait.
    pub fn review_deferred(&self, kind: ReviewKind) {
        self.reviews_deferred
            .get_or_create(&ReviewKindLabels { kind })
            .inc();
    }

    /// Sets the end of the API server's hold-off, `None` when it was lifted.
    pub fn set_hold_off_until(&self, until: Option<std::time::SystemTime>) {
        let seconds: u64 = until.map_or(0, |at| {
            at.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        });
        self.hold_off_until
            .set(i64::try_from(seconds).unwrap_or(i64::MAX));
    }

    /// Counts a refresh ahead of a cache entry, by result.
    pub fn refreshed_ahead(&self, cache: ReviewKind, result: RefreshResult) {
        self.refreshes_ahead
            .get_or_create(&RefreshLabels { cache, result })
            .inc();
    }

    /// Counts a review that failed after its retries, by cause.
    pub fn review_failed(&self, kind: ReviewKind, cause: &'static str) {
        self.review_failures
            .get_or_create(&ReviewFailureLabels { kind, cause })
            .inc();
    }

    /// Counts a connection closed for missing its first-request or idle deadline.
    pub fn connection_timed_out(&self) {
        self.connection_timeouts.inc();
    }

    /// The counter of connections accepted by serving thread `thread`, resolved once by the
    /// thread so that accepting costs one increment.
    pub fn accepted_by(&self, thread: usize) -> Counter {
        let thread = u16::try_from(thread).unwrap_or(u16::MAX);
        self.accepted
            .get_or_create(&ThreadLabels { thread })
            .clone()
    }

    /// Certificate expiry and the last reload of each watched file
    /// ([`crate::admin::certificates`]).
    pub fn certificates(&self) -> &crate::admin::certificates::CertificateMetrics {
        &self.certificates
    }

    /// Build, start time and handovers ([`crate::admin::generation`]).
    pub fn generation(&self) -> &crate::admin::generation::Generation {
        &self.generation
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome has its own index, and each outcome's latencies land in its own series.
    #[test]
    fn each_outcome_is_timed_in_its_own_histogram() {
        let all = [
            Outcome::Allowed,
            Outcome::Forbidden,
            Outcome::AuthorizationError,
            Outcome::Unauthenticated,
            Outcome::Redirected,
            Outcome::BadRequest,
            Outcome::UpstreamError,
            Outcome::Throttled,
            Outcome::AuditUnavailable,
        ];
        let mut indexes: Vec<usize> = all.iter().map(|o| o.index()).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, (0..Outcome::COUNT).collect::<Vec<_>>());

        let metrics = Metrics::new();
        let observe = |decision, times| {
            for _ in 0..times {
                metrics.observe_request(
                    &RequestLabels {
                        code: 200,
                        decision,
                        subresource: "healthz",
                    },
                    Duration::from_millis(1),
                );
            }
        };
        observe(Outcome::Allowed, 3);
        observe(Outcome::Forbidden, 2);
        let text = metrics.encode();
        for (decision, count) in [("allowed", 3), ("forbidden", 2)] {
            let line = format!(
                "kubelet_auth_proxy_request_duration_seconds_count{{decision=\"{decision}\"}} {count}"
            );
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }

    /// The counters alerts take `increase()` of are exported at 0 before their first event, for
    /// every value of their label sets, so that the first event shows as an increase.
    #[test]
    fn alerted_counters_exist_at_zero_from_the_start() {
        let metrics = Metrics::new();
        metrics.watch_reloads("client_ca");
        drop(metrics.audit_suppressed());
        let text = metrics.encode();
        let mut wanted = vec![
            "kubelet_auth_proxy_config_reloads_total{target=\"client_ca\",result=\"failed\"} 0"
                .to_owned(),
            "kubelet_auth_proxy_audit_events_suppressed_total{reason=\"overall_budget\",authenticated=\"false\"} 0"
                .to_owned(),
            "kubelet_auth_proxy_handover_failures_total{cause=\"stranger\"} 0".to_owned(),
        ];
        for cause in crate::forward::cause::Cause::ALL {
            wanted.push(format!(
                "kubelet_auth_proxy_upstream_errors_total{{cause=\"{}\"}} 0",
                cause.as_str()
            ));
        }
        for kind in ["TokenReview", "SubjectAccessReview"] {
            for cause in crate::apiserver::failure::FAILURE_CAUSES {
                wanted.push(format!(
                    "kubelet_auth_proxy_apiserver_review_failures_total{{kind=\"{kind}\",cause=\"{cause}\"}} 0"
                ));
            }
            for family in ["reviews_refused_total", "reviews_held_off_total"] {
                wanted.push(format!(
                    "kubelet_auth_proxy_apiserver_{family}{{kind=\"{kind}\"}} 0"
                ));
            }
        }
        for line in wanted {
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }
}
