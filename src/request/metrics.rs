//! The request pipeline's metrics, counted once a request's response headers are ready: requests
//! by code, outcome and subresource and their latency; the latency the proxy adds before the
//! kubelet sees an allowed request; authorization decisions by mode; failures to reach the
//! kubelet by cause; upgraded sessions open.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::outcome::Outcome;
use crate::base::metrics::{latency_histogram, register};
use crate::forward::cause::Cause;

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

/// Labels of the latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabels {
    decision: Outcome,
}

/// The `mode` values of the authorization decisions: the chain's modes, and `none`.
const AUTHORIZATION_MODES: [&str; 7] = [
    "AlwaysAllow",
    "AlwaysDeny",
    "Node",
    "Policy",
    "RBAC",
    "Webhook",
    "none",
];
/// The `decision` values of the authorization decisions.
const AUTHORIZATION_DECISIONS: [&str; 3] = ["allowed", "forbidden", "error"];

/// Labels of the authorization decisions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AuthorizationDecisionLabels {
    /// The mode that allowed, as in `--authorization-mode`; `none` when none did.
    mode: &'static str,
    /// `allowed`, `forbidden` or `error`.
    decision: &'static str,
}

/// Labels of failures to reach the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UpstreamErrorLabels {
    /// [`Cause::as_str`].
    cause: &'static str,
}

/// The request families.
#[derive(Debug)]
pub struct RequestMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<DecisionLabels, Histogram, fn() -> Histogram>,
    /// The latency family's histogram of each outcome (indexed by [`Outcome::index`]), looked up
    /// in the family once: a lookup hashes the labels and takes the family's lock, per request.
    latency_by_outcome: [OnceLock<Histogram>; Outcome::COUNT],
    decision_latency: Histogram,
    decisions: Family<AuthorizationDecisionLabels, Counter>,
    /// Each (mode, decision) pair's counter of `decisions`, once used.
    decisions_by_pair:
        [OnceLock<Counter>; AUTHORIZATION_MODES.len() * AUTHORIZATION_DECISIONS.len()],
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    streams: Gauge,
}

impl Default for RequestMetrics {
    /// Families registered nowhere (tests).
    fn default() -> Self {
        RequestMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            latency_by_outcome: Default::default(),
            decision_latency: latency_histogram(),
            decisions: Family::default(),
            decisions_by_pair: Default::default(),
            upstream_errors: Family::default(),
            streams: Gauge::default(),
        }
    }
}

impl RequestMetrics {
    /// Registers the families in `registry`; the failures to reach the kubelet exist at 0 for
    /// every cause, so an alert's `increase()` sees the first.
    pub fn register(registry: &mut Registry) -> RequestMetrics {
        let metrics = RequestMetrics::default();
        register! { registry, metrics;
            requests => "requests", "Requests served, by status code, decision and subresource";
            latency => "request_duration_seconds", "Time from request headers to response headers, by decision";
            decision_latency => "request_decision_duration_seconds", "Time from request headers until a request allowed was authenticated and authorized and handed to the kubelet connection: the latency the proxy adds before the kubelet sees it, reviews the caches could not answer included";
            streams => "upgraded_streams_open", "exec, attach and portForward sessions currently spliced to the kubelet";
            upstream_errors => "upstream_errors", "Requests that could not be forwarded because the kubelet could not be reached, by cause";
            decisions => "authorization_decisions", "Requests authorized, by the mode that decided (RBAC, Webhook, Policy, Node, AlwaysAllow; none when no authorizer allowed) and the decision (allowed, forbidden, error)";
        }
        for cause in Cause::ALL {
            drop(metrics.upstream_errors.get_or_create(&UpstreamErrorLabels {
                cause: cause.as_str(),
            }));
        }
        metrics
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

    /// Counts a request that could not reach the kubelet, by cause.
    pub fn upstream_failed(&self, cause: Cause) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                cause: cause.as_str(),
            })
            .inc();
    }

    /// The open upgraded-streams gauge.
    pub fn streams(&self) -> &Gauge {
        &self.streams
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

        let mut registry = Registry::default();
        let metrics = RequestMetrics::register(&mut registry);
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
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for (decision, count) in [("allowed", 3), ("forbidden", 2)] {
            let line = format!("request_duration_seconds_count{{decision=\"{decision}\"}} {count}");
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }
}
