//! What the operator sees of a running proxy: the admin listener ([`listener`]: `/healthz`,
//! `/readyz`, `/metrics`), the `admin-probe` command for exec probes ([`exec_probe`]), the
//! Prometheus metrics ([`metrics`], [`generation`], [`certificates`]) and the rate-limited reports of recurring
//! failures in the log ([`reports`]).

pub mod certificates;
pub mod exec_probe;
pub mod generation;
pub mod labels;
pub mod listener;
pub mod metrics;
pub mod reports;
