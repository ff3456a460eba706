//! What every layer's metrics share. Each layer defines the families it updates next to the code
//! that updates them and registers them, at assembly, into the one
//! [`Registry`](prometheus_client::registry::Registry) the admin listener serves, under the
//! [`PREFIX`]; nothing here knows any layer's families.

use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The prefix of every metric name: `kubelet_auth_proxy_`.
pub const PREFIX: &str = "kubelet_auth_proxy";

/// The registry every layer registers its families in.
pub fn registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// Registers fields of `metrics` in `registry`, one line each: the field, its name (after the
/// [`PREFIX`]) and its help text, so that a layer's families read as a table beside the code
/// that updates them.
macro_rules! register {
    ($registry:expr, $metrics:ident; $($field:ident => $name:literal, $help:literal;)*) => {
        $($registry.register($name, $help, $metrics.$field.clone());)*
    };
}
pub(crate) use register;

/// The Prometheus text exposition of every metric in `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The buckets of every latency histogram, in seconds: from 100 µs (a decision from the caches)
/// to 10 s (a review that waited out its retries).
pub fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ])
}
