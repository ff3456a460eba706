//! Forwarding's metrics: the requests in flight to the kubelet, each holding an upstream
//! connection ([`super::limits`]). Failures to reach the kubelet and upgraded sessions are
//! counted by the request pipeline, which sees how each request ends.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The forwarding families.
#[derive(Debug)]
pub struct ForwardMetrics {
    requests_in_flight: Gauge,
}

impl Default for ForwardMetrics {
    /// Metrics nobody serves (`check-config --probe`).
    fn default() -> Self {
        ForwardMetrics::register(&mut Registry::default())
    }
}

impl ForwardMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> ForwardMetrics {
        let requests_in_flight = Gauge::default();
        registry.register(
            "upstream_requests_in_flight",
            "Requests in flight to the kubelet, each holding an upstream connection, at most --upstream-max-requests-inflight",
            requests_in_flight.clone(),
        );
        ForwardMetrics { requests_in_flight }
    }

    /// The gauge of requests in flight to the kubelet, handed to the forwarder
    /// ([`super::ForwardOptions::requests_in_flight`]).
    pub fn requests_in_flight(&self) -> Gauge {
        self.requests_in_flight.clone()
    }
}
