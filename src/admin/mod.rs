//! What the operator sees of a running proxy: the admin listener ([`listener`]: `/healthz`,
//! `/readyz`, and `/metrics`, the one registry every layer registered its metrics in) and the
//! `admin-probe` command for exec probes ([`exec_probe`]). It knows no layer's metrics and no
//! layer's readiness: the server hands it the registry and what holds readiness back.

pub mod exec_probe;
pub mod listener;
