//! The one registry, and every layer's metrics registered in it: done once, at assembly, so that
//! each layer defines its own families and the admin listener serves them all without knowing
//! any.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::apiserver::ApiServerMetrics;
use crate::audit::AuditMetrics;
use crate::authn::metrics::AuthnMetrics;
use crate::authz::metrics::AuthzMetrics;
use crate::base::reload::ReloadMetrics;
use crate::forward::metrics::ForwardMetrics;
use crate::request::metrics::RequestMetrics;
use crate::server::metrics::ServerMetrics;

/// Every layer's metrics, each registered in `registry`, from the ground up.
pub struct LayerMetrics {
    /// What `/metrics` serves.
    pub registry: Registry,
    /// The API server clients', shared by all of them and their caches.
    pub apiserver: Arc<ApiServerMetrics>,
    /// Authentication's.
    pub authn: Arc<AuthnMetrics>,
    /// The request pipeline's.
    pub requests: Arc<RequestMetrics>,
    /// The server's.
    pub server: Arc<ServerMetrics>,
    /// The file watcher's.
    pub reloads: ReloadMetrics,
    /// Authorization's.
    pub authz: AuthzMetrics,
    /// The audit log's.
    pub audit: AuditMetrics,
    /// Forwarding's.
    pub forward: ForwardMetrics,
}

impl LayerMetrics {
    /// A registry with every layer's families in it.
    pub fn register() -> LayerMetrics {
        let mut registry = crate::base::metrics::registry();
        let requests = Arc::new(RequestMetrics::register(&mut registry));
        let server = Arc::new(ServerMetrics::register(&mut registry));
        let forward = ForwardMetrics::register(&mut registry);
        let apiserver = Arc::new(ApiServerMetrics::register(&mut registry));
        let reloads = ReloadMetrics::register(&mut registry);
        let authn = Arc::new(AuthnMetrics::register(&mut registry));
        let audit = AuditMetrics::register(&mut registry);
        let authz = AuthzMetrics::register(&mut registry);
        LayerMetrics {
            registry,
            reloads,
            apiserver,
            authn,
            authz,
            audit,
            forward,
            requests,
            server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters alerts take `increase()` of are exported at 0 before their first event, for
    /// every value of their label sets, so that the first event shows as an increase.
    #[test]
    fn alerted_counters_exist_at_zero_from_the_start() {
        let metrics = LayerMetrics::register();
        metrics.reloads.watch("client_ca");
        drop(metrics.audit.suppressed());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        let mut wanted = vec![
            "kubelet_auth_proxy_config_reloads_total{target=\"client_ca\",result=\"failed\"} 0"
                .to_owned(),
            "kubelet_auth_proxy_audit_events_suppressed_total{reason=\"overall_budget\",authenticated=\"false\"} 0"
                .to_owned(),
            "kubelet_auth_proxy_handover_failures_total{cause=\"stranger\"} 0".to_owned(),
        ];
        for cause in crate::forward::cause::Cause::ALL {
            wanted.push(format!(
                "kubelet_auth_proxy_upstream_errors_total{{cause=\"{}\"}} 0",
                cause.as_str()
            ));
        }
        for kind in ["TokenReview", "SubjectAccessReview"] {
            for cause in crate::apiserver::failure::FAILURE_CAUSES {
                wanted.push(format!(
                    "kubelet_auth_proxy_apiserver_review_failures_total{{kind=\"{kind}\",cause=\"{cause}\"}} 0"
                ));
            }
            for family in ["reviews_refused_total", "reviews_held_off_total"] {
                wanted.push(format!(
                    "kubelet_auth_proxy_apiserver_{family}{{kind=\"{kind}\"}} 0"
                ));
            }
        }
        for line in wanted {
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }
}
