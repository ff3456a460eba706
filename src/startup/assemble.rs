//! Settings → running services. The only code that builds the API server and kubelet clients,
//! registers every layer's metrics ([`super::metrics`]), opens the audit log (creating the file, pruning old backups,
//! starting its writer thread) and hands the reload registry to the file watcher; everything it
//! needs was validated by [`Settings::load`], so what can fail here is what touching the system
//! can fail at.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::metrics::LayerMetrics;
use crate::apiserver::{ApiServerClient, ApiServerMetrics, ApiServerSettings};
use crate::audit::budget::{self, Budget};
use crate::audit::policy::PolicyGate;
use crate::audit::{AuditLog, AuditTarget, reviews_skipped_event};
use crate::authn::Authenticator;
use crate::authn::service_account_keys::ServiceAccountKeys;
use crate::authn::structured::StructuredAuthentication;
use crate::authn::token::TokenReviewAuthenticator;
use crate::authn::x509::X509Authenticator;
use crate::authz::live_rbac::RbacAuthorizer;
use crate::authz::metrics::AuthzMetrics;
use crate::authz::node::NodeAuthorizer;
use crate::authz::webhook::SubjectAccessReviewAuthorizer;
use crate::authz::{Authorizer, AuthorizerChain};
use crate::base::reload::ReloadRegistry;
use crate::base::shutdown::Shutdown;
use crate::config::{
    AuthorizationSettings, AuthorizerSettings, ConfigError, Settings, UpstreamSettings,
};
use crate::forward::metrics::ForwardMetrics;
use crate::forward::{ForwardOptions, Forwarder};
use crate::request::decision::Decider;
use crate::server::drain::{PodRelease, SessionDrain};
use crate::server::{ServedMetrics, Services};
use tokio_util::sync::CancellationToken;

/// Builds the services from `settings`. Must run inside a Tokio runtime: the API server
/// clients start their tasks as they are built.
pub fn assemble(settings: Settings) -> Result<Services, ConfigError> {
    let metrics = LayerMetrics::register();
    let shutdown = Shutdown::new();
    let mut reloads = settings.reloads;
    let mut clients = ApiServerClients::new(
        Arc::clone(&metrics.apiserver),
        settings.authorization.apiserver_max_reviews_inflight,
    );
    let tokens = match settings.token_review {
        Some(review) => {
            let client = clients.get(review.apiserver, &mut reloads);
            let keys = Arc::new(ServiceAccountKeys::new(
                client.clone(),
                review.service_account_issuers,
                review.local_audiences,
                Arc::clone(&metrics.authn),
            ));
            let stop = shutdown.draining().clone();
            let refresh = Arc::clone(&keys).run();
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = refresh => {}
                }
            });
            let tokens = TokenReviewAuthenticator::new(
                client,
                review.audiences,
                review.cache_ttl,
                &metrics.authn,
            )
            .map_err(|e| client_error("--authentication-token-webhook", e))?
            .with_local_checks(keys);
            Some(Arc::new(tokens))
        }
        None => None,
    };
    let structured = match settings.authentication_config {
        Some(file) => {
            let structured = StructuredAuthentication::start(
                file,
                metrics.authn.issuer_keys.clone(),
                metrics.authn.structured.clone(),
            )
            .map_err(|e| client_error("--authentication-config", e))?;
            reloads.add(Arc::clone(&structured) as _);
            Some(structured)
        }
        None => None,
    };
    let authenticator = Authenticator::new(
        settings.client_ca.map(X509Authenticator::new),
        tokens,
        structured,
        settings.anonymous_auth,
    )
    .map_err(|e| client_error("--client-ca-file", e))?;
    let decider = decider(
        settings.authorization,
        &mut clients,
        &mut reloads,
        &metrics.authz,
        shutdown.closing(),
    )?;
    let forwarder = forwarder(settings.upstream, &metrics.forward, &shutdown);
    let audit = match settings.audit {
        Some(audit) => Some({
            let rotation = audit.options.rotation;
            let kept = budget::kept_bytes(
                matches!(audit.target, AuditTarget::File(_)),
                rotation.max_size_mb,
                rotation.max_backups,
            );
            let retention = audit.options.flood_retention;
            let log = AuditLog::open(audit.target, audit.options, metrics.audit.dropped())
                .map_err(|e| ConfigError::File {
                    flag: "--audit-log-path",
                    reason: format!("cannot open: {e}"),
                    path: audit.path,
                    source: Some(Box::new(e)),
                })?;
            let log = match audit.policy {
                Some(policy) => log.with_policy(PolicyGate::new(policy, metrics.audit.omitted())),
                None => log,
            };
            match retention {
                Some(retention) => log.with_budget(Budget::new(
                    kept,
                    retention,
                    metrics.audit.suppressed(),
                    metrics.audit.acts_refused(),
                )),
                None => log,
            }
        }),
        None => None,
    };
    if let Some(failures) = authenticator.failure_budget() {
        // The summaries go to the audit log, when there is one, whatever its flood budget.
        let audit = audit.clone();
        let summarize = move |source, skipped, since, until| {
            if let Some(audit) = &audit
                && let Some(event) = reviews_skipped_event(source, skipped, since, until)
            {
                audit.record(event);
            }
        };
        tokio::spawn(Arc::clone(failures).report(summarize, shutdown.draining().clone()));
    }
    let session_drain = SessionDrain {
        timeout: settings.drain.session_timeout,
        release: settings.drain.release.map(|release| PodRelease {
            client: clients.get(release.apiserver, &mut reloads),
            namespace: release.namespace,
            name: release.name,
        }),
    };
    Ok(Services {
        listen_addresses: settings.listen_addresses,
        listen_retry_timeout: settings.listen_retry_timeout,
        admin_listen_address: settings.admin_listen_address,
        admin_socket: settings.admin_socket,
        handover_socket: settings.handover_socket,
        server_tls: settings.server_tls,
        authenticator,
        decider,
        forwarder,
        header_read_timeout: settings.header_read_timeout,
        idle_connection_timeout: settings.idle_connection_timeout,
        max_connections: settings.max_connections,
        serving_threads: settings.serving_threads,
        shutdown_grace_period: settings.shutdown_grace_period,
        session_drain,
        metrics: ServedMetrics {
            registry: metrics.registry,
            server: metrics.server,
            requests: metrics.requests,
            reloads: metrics.reloads,
        },
        reloads,
        audit,
        audit_require_for_streams: settings.audit_require_for_streams,
        shutdown,
    })
}

/// The forwarder to the kubelet (its connection pool, no connection opened yet). Also what
/// `check-config --probe` builds, alone: it opens nothing else.
pub fn forwarder(
    upstream: UpstreamSettings,
    metrics: &ForwardMetrics,
    shutdown: &Shutdown,
) -> Forwarder {
    Forwarder::with_endpoint(
        upstream.endpoint,
        ForwardOptions {
            forward_identity_headers: upstream.forward_identity_headers,
            connect_timeout: upstream.connect_timeout,
            streaming_idle_timeout: upstream.streaming_idle_timeout,
            max_requests_inflight: upstream.max_requests_inflight,
            max_requests_inflight_per_user: upstream.max_requests_inflight_per_user,
            requests_in_flight: metrics.requests_in_flight(),
            shutdown: shutdown.clone(),
        },
    )
}

/// The decider alone, for `explain`: webhooks get their own API server clients and metrics that
/// nobody serves.
pub fn decider_for_explain(mut settings: AuthorizationSettings) -> Result<Decider, ConfigError> {
    // One process asking once: its lists need not be spread.
    for authorizer in &mut settings.authorizers {
        if let AuthorizerSettings::Rbac(rbac) = authorizer {
            rbac.start_jitter = Duration::ZERO;
        }
    }
    let mut clients = ApiServerClients::new(
        Arc::new(ApiServerMetrics::default()),
        settings.apiserver_max_reviews_inflight,
    );
    // Nobody watches files for `explain`: it decides once and exits (the RBAC authorizer's
    // watches end with the decider).
    decider(
        settings,
        &mut clients,
        &mut ReloadRegistry::default(),
        &AuthzMetrics::default(),
        &CancellationToken::new(),
    )
}

/// The authorizer chain, the table and the node name. Must run in a Tokio runtime: the `RBAC`
/// authorizer starts its watches here, until `stop` (the proxy's closing) or the decider is
/// dropped.
fn decider(
    settings: AuthorizationSettings,
    clients: &mut ApiServerClients,
    reloads: &mut ReloadRegistry,
    metrics: &AuthzMetrics,
    stop: &CancellationToken,
) -> Result<Decider, ConfigError> {
    let node_name: Arc<str> = Arc::from(settings.node_name);
    let mut chain = Vec::with_capacity(settings.authorizers.len());
    for authorizer in settings.authorizers {
        chain.push(match authorizer {
            AuthorizerSettings::AlwaysAllow => Authorizer::AlwaysAllow,
            AuthorizerSettings::AlwaysDeny => Authorizer::AlwaysDeny,
            AuthorizerSettings::Node => {
                Authorizer::Node(NodeAuthorizer::new(Arc::clone(&node_name)))
            }
            AuthorizerSettings::Policy(policy) => Authorizer::Policy(policy),
            AuthorizerSettings::Rbac(rbac) => {
                rbac.apiserver.register_reloads(reloads);
                Authorizer::Rbac(Arc::new(RbacAuthorizer::start(
                    rbac,
                    metrics.rbac().clone(),
                    stop.clone(),
                )))
            }
            AuthorizerSettings::Webhook { spec, apiserver } => {
                let client = clients.get(*apiserver, reloads);
                Authorizer::Webhook(Arc::new(SubjectAccessReviewAuthorizer::new(
                    client, &spec, metrics,
                )))
            }
        });
    }
    Ok(Decider {
        authorizers: AuthorizerChain::new(chain),
        mapping: settings.mapping,
        node_name,
    })
}

/// A failure to build something whose settings were valid, attributed to `flag`.
fn client_error(
    flag: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: e.to_string(),
        source: Some(Box::new(e)),
    }
}

/// API server clients by kubeconfig and timeout, so that TokenReview and the webhooks that share
/// a connection share one client (and its connection pool and review bounds).
struct ApiServerClients {
    metrics: Arc<ApiServerMetrics>,
    /// `--apiserver-max-reviews-inflight`, for every client.
    max_inflight: usize,
    built: Vec<((Option<PathBuf>, Duration), ApiServerClient)>,
}

impl ApiServerClients {
    fn new(metrics: Arc<ApiServerMetrics>, max_inflight: usize) -> Self {
        ApiServerClients {
            metrics,
            max_inflight,
            built: Vec::new(),
        }
    }

    /// The client for `settings`: the one already built for the same kubeconfig and timeout, or
    /// a new one, whose credentials `reloads` then keeps up to date.
    fn get(
        &mut self,
        settings: ApiServerSettings,
        reloads: &mut ReloadRegistry,
    ) -> ApiServerClient {
        let (kubeconfig, timeout) = settings.sharing_key();
        let key = (kubeconfig.map(Path::to_owned), timeout);
        if let Some((_, client)) = self.built.iter().find(|(k, _)| *k == key) {
            return client.clone();
        }
        settings.register_reloads(reloads);
        let client = ApiServerClient::new(settings, self.max_inflight, Arc::clone(&self.metrics));
        self.built.push((key, client.clone()));
        client
    }
}
