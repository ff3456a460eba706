//! From validated settings to running services: [`assemble`] builds the clients, the audit log
//! and every layer's metrics in the one registry ([`metrics`]); [`probe`]
//! (`check-config --probe`) reaches every dependency before the proxy relies on it.

pub mod assemble;
pub mod metrics;
pub mod probe;
