//! The API server client's metrics: each HTTP attempt (`apiserver_calls`, its duration), the
//! bound on reviews in flight (in flight, waiting, refused), failed and held-off reviews, the
//! `Retry-After` hold, and the review caches' lookups and refreshes ahead.

use std::time::{Duration, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::failure::FAILURE_CAUSES;
use crate::base::metrics::{latency_histogram, register};

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
struct ReviewKindLabels {
    kind: ReviewKind,
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

/// Labels of refreshes ahead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefreshLabels {
    /// Which cache: the TokenReview or the SubjectAccessReview one.
    cache: ReviewKind,
    /// `replaced` (the API server answered: its answer replaced the entry) or `failed` (the
    /// entry stays to its original expiry).
    result: &'static str,
}

/// Labels of cache lookups.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CacheLabels {
    /// Which cache: the TokenReview or the SubjectAccessReview one.
    cache: ReviewKind,
    result: CacheResult,
}

/// Labels of reviews that failed after their retries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReviewFailureLabels {
    kind: ReviewKind,
    /// One of [`FAILURE_CAUSES`].
    cause: &'static str,
}

/// The API server client's metric families, shared by its clients, gates and caches.
#[derive(Debug)]
pub struct ApiServerMetrics {
    calls: Family<ApiCallLabels, Counter>,
    latency: Family<ReviewKindLabels, Histogram, fn() -> Histogram>,
    in_flight: Family<ReviewKindLabels, Gauge>,
    waiting: Family<ReviewKindLabels, Gauge>,
    refused: Family<ReviewKindLabels, Counter>,
    failures: Family<ReviewFailureLabels, Counter>,
    held_off: Family<ReviewKindLabels, Counter>,
    hold_off_until: Gauge,
    cache_lookups: Family<CacheLabels, Counter>,
    refreshes_ahead: Family<RefreshLabels, Counter>,
}

impl Default for ApiServerMetrics {
    /// Families registered nowhere (`explain`, `check-config --probe`, tests).
    fn default() -> Self {
        ApiServerMetrics {
            calls: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
            waiting: Family::default(),
            refused: Family::default(),
            failures: Family::default(),
            held_off: Family::default(),
            hold_off_until: Gauge::default(),
            cache_lookups: Family::default(),
            refreshes_ahead: Family::default(),
        }
    }
}

impl ApiServerMetrics {
    /// Registers the families in `registry`, the counters alerts take `increase()` of created at
    /// 0 for every kind and cause.
    pub fn register(registry: &mut Registry) -> ApiServerMetrics {
        let metrics = ApiServerMetrics::default();
        register! { registry, metrics;
            calls => "apiserver_calls", "TokenReview and SubjectAccessReview HTTP attempts, by kind and status code (0: no answer)";
            latency => "apiserver_call_duration_seconds", "Duration of TokenReview and SubjectAccessReview HTTP attempts";
            in_flight => "apiserver_reviews_in_flight", "TokenReviews and SubjectAccessReviews being made now (attempts and retries), at most --apiserver-max-reviews-inflight per kind";
            waiting => "apiserver_reviews_waiting", "Reviews waiting for a place under --apiserver-max-reviews-inflight";
            refused => "apiserver_reviews_refused", "Reviews never made because no place came free in time or too many were waiting; their requests failed closed";
            cache_lookups => "review_cache_lookups", "Token and authorization cache lookups: hit, miss (called the API server) or coalesced (waited for a call already in flight)";
            failures => "apiserver_review_failures", "TokenReviews and SubjectAccessReviews that failed after their retries, by cause; each failed its request closed";
            held_off => "apiserver_reviews_held_off", "Reviews not sent because the API server's Retry-After outlasted --apiserver-request-timeout; each failed its request closed";
            hold_off_until => "apiserver_hold_off_until_timestamp_seconds", "End of the API server's last Retry-After hold as Unix time (0: none); the hold left is this minus time(), when positive";
            refreshes_ahead => "cache_refreshes_ahead", "Cache entries revalidated in the background because they were used in the last tenth of their lifetime, by result";
        }
        for kind in [ReviewKind::TokenReview, ReviewKind::SubjectAccessReview] {
            for cause in FAILURE_CAUSES {
                drop(
                    metrics
                        .failures
                        .get_or_create(&ReviewFailureLabels { kind, cause }),
                );
            }
            let labels = ReviewKindLabels { kind };
            for family in [&metrics.refused, &metrics.held_off] {
                drop(family.get_or_create(&labels));
            }
            for family in [&metrics.in_flight, &metrics.waiting] {
                drop(family.get_or_create(&labels));
            }
        }
        metrics
    }

    /// Records one HTTP attempt to the API server.
    pub fn observe_call(&self, labels: &ApiCallLabels, elapsed: Duration) {
        self.calls.get_or_create(labels).inc();
        self.latency
            .get_or_create(&ReviewKindLabels { kind: labels.kind })
            .observe(elapsed.as_secs_f64());
    }

    /// The gauge of `kind` reviews in flight.
    pub fn in_flight(&self, kind: ReviewKind) -> Gauge {
        self.in_flight
            .get_or_create(&ReviewKindLabels { kind })
            .clone()
    }

    /// The gauge of `kind` reviews waiting for a place.
    pub fn waiting(&self, kind: ReviewKind) -> Gauge {
        self.waiting
            .get_or_create(&ReviewKindLabels { kind })
            .clone()
    }

    /// Counts a `kind` review refused for want of a place.
    pub fn refused(&self, kind: ReviewKind) {
        self.refused.get_or_create(&ReviewKindLabels { kind }).inc();
    }

    /// Counts a review that failed after its retries, by cause.
    pub fn failed(&self, kind: ReviewKind, cause: &'static str) {
        self.failures
            .get_or_create(&ReviewFailureLabels { kind, cause })
            .inc();
    }

    /// Counts a review call not sent because the API server's `Retry-After` outlasted what the
    /// review may wait.
    pub fn held_off(&self, kind: ReviewKind) {
        self.held_off
            .get_or_create(&ReviewKindLabels { kind })
            .inc();
    }

    /// Sets the end of the API server's hold-off, `None` when it was lifted.
    pub fn set_hold_off_until(&self, until: Option<SystemTime>) {
        let seconds: u64 = until.map_or(0, |at| {
            at.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        });
        self.hold_off_until
            .set(i64::try_from(seconds).unwrap_or(i64::MAX));
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

    /// Counts a refresh ahead of a cache entry: its answer `replaced` the entry, or it failed.
    pub fn refreshed_ahead(&self, cache: ReviewKind, replaced: bool) {
        let result = if replaced { "replaced" } else { "failed" };
        self.refreshes_ahead
            .get_or_create(&RefreshLabels { cache, result })
            .inc();
    }
}
