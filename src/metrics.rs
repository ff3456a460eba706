//! Prometheus metrics of the proxy, served on the admin listener. Label values come from small
//! fixed sets (status codes, decisions, subresource names): never a user name, path or token.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// What the proxy decided about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum Outcome {
    /// Authorized and forwarded; the code is the kubelet's.
    Allowed,
    /// 403: no attribute set was allowed.
    Forbidden,
    /// 401: no or bad credential.
    Unauthenticated,
    /// 301: the path was not canonical.
    Redirected,
    /// 400: the path was unusable.
    BadRequest,
    /// 502: the kubelet could not be reached or failed.
    UpstreamError,
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

/// Labels of the latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The proxy's decision.
    pub decision: Outcome,
}

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
    connections: Gauge,
    handshake_failures: Counter,
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
        let connections = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections currently open",
            connections.clone(),
        );
        let handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "Client TLS handshakes that failed or timed out",
            handshake_failures.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            connections,
            handshake_failures,
        }
    }

    /// Records one finished request (at response headers; streams continue afterwards).
    pub fn observe_request(&self, labels: &RequestLabels, elapsed: Duration) {
        self.requests.get_or_create(labels).inc();
        self.latency
            .get_or_create(&DecisionLabels {
                decision: labels.decision,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The open-connections gauge, incremented and decremented by the accept loop.
    pub fn connections(&self) -> &Gauge {
        &self.connections
    }

    /// Counts a failed or timed-out TLS handshake.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
