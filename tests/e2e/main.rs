//! End-to-end scenarios: the real proxy, configured from real command lines, in front of the
//! stand-in kubelet, driven over real TLS on loopback the way kubectl, the API server and
//! Prometheus drive a kubelet. One test binary (linking is the slow part); one module per theme.

#[path = "../support/mod.rs"]
mod support;
/// The test data loader the unit tests use, so both read `tests/data/` the same way.
#[path = "../../src/test_data.rs"]
mod test_data;

mod admin;
mod apiserver_failures;
mod audit;
mod audit_admission;
mod audit_bounds;
mod audit_policy;
mod authorization;
mod cli;
mod config_files;
mod credentials;
mod deadlines;
mod delegated;
mod explain;
mod failure_budget;
mod fleet;
mod forged_tokens;
mod forwarding;
mod fuzz_corpus;
mod handing_over;
mod hostile;
mod hygiene;
pub mod joining;
mod jwt_authenticators;
mod live_rbac;
mod manifests;
mod match_conditions;
mod memory_bounds;
mod monitoring;
mod neighbours;
mod operator_cli;
mod path_safety;
mod paths;
mod pod_scoped;
mod real_apiserver;
mod real_apiserver_authn_config;
mod real_apiserver_drain;
mod real_apiserver_kustomize;
mod real_apiserver_tokens;
mod reload;
mod retry_after;
mod review_bounds;
mod review_gate;
mod secrets;
mod self_contained;
mod session_drain;
mod shutdown;
mod tls_front;
mod upgrades;
mod upgrading;
mod upstream_bounds;
mod upstream_causes;
mod walkthrough;
mod x509;
