//! Forwarding's metrics: the requests in flight to the kubelet, each holding an upstream
//! connection ([`super::limits`]). Failures to reach the kubelet and upgraded sessions are
//! counted by the request pipeline, which sees how each request ends.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::base::metrics::register;

/// The forwarding families (a default one is registered nowhere: `check-config --probe`).
#[derive(Debug, Default)]
pub struct ForwardMetrics {
    requests_in_flight: Gauge,
}

impl ForwardMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &mut Registry) -> ForwardMetrics {
        let metrics = ForwardMetrics::default();
        register! { registry, metrics;
            requests_in_flight => "upstream_requests_in_flight", "Requests in flight to the kubelet, each holding an upstream connection, at most --upstream-max-requests-inflight";
        }
        metrics
    }

    /// The gauge of requests in flight to the kubelet, handed to the forwarder
    /// ([`super::ForwardOptions::requests_in_flight`]).
    pub fn requests_in_flight(&self) -> Gauge {
        self.requests_in_flight.clone()
    }
}
