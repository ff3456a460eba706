//! Configuration: flags parsed by clap ([`flags`]), then validated and read into [`Settings`], a
//! file for each part; every problem is a [`ConfigError`] naming the flag and, for files, the path,
//! so `main` can print one clear line and exit with status 2.
//!
//! Reading files is the only I/O here: nothing is created, written, removed, connected or started,
//! so `check-config` and `explain` can use this freely; [`mod@crate::startup::assemble`] turns
//! settings into the running services.

mod audit_log;
mod audit_policy;
mod authentication_config;
pub mod authorization;
mod authorizers;
pub mod drain;
pub mod duration;
mod error;
pub mod file;
pub mod flags;
pub mod listen;
mod max_connections;
mod serving;
mod token_review;
mod upstream;
pub mod warnings;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::authn::NoAuthenticationMethod;
use crate::authn::structured::StructuredSettings;
use crate::authn::x509::ClientCa;
use crate::base::reload::{ReloadRegistry, Reloadable};
use audit_log::audit_settings;
use authentication_config::authentication_config_settings;
use error::flag_cause;
use flags::ProxyFlags;
use max_connections::{apiserver_clients, descriptor_plan};
use serving::{client_ca_settings, serving_settings};
use token_review::token_review_settings;
use upstream::{upstream, upstream_target};
use warnings::{Warning, authorization_warnings};

pub use audit_log::AuditSettings;
pub use authorizers::{AuthorizationSettings, AuthorizerSettings};
pub use error::{Cause, ConfigError};
pub(crate) use error::{file_cause, file_error};
pub use token_review::TokenReviewSettings;
pub use upstream::UpstreamSettings;

/// Everything the server is configured with, validated, with every file it names read.
pub struct Settings {
    /// Where the kubelet API is served.
    pub listen_addresses: Vec<SocketAddr>,
    /// How long a listen address in use is retried.
    pub listen_retry_timeout: Duration,
    /// Where /healthz, /readyz and /metrics are served.
    pub admin_listen_address: SocketAddr,
    /// Where this process alone serves the same (`--admin-socket`).
    pub admin_socket: Option<PathBuf>,
    /// Where the listening sockets are handed to and taken from another proxy
    /// (`--handover-socket`), its directory checked.
    pub handover_socket: Option<PathBuf>,
    /// Serving TLS, client certificates requested when x509 authentication is on; rebuilt when
    /// the certificate, key or client CA files change.
    pub server_tls: Arc<Reloadable<rustls::ServerConfig>>,
    /// The CA bundle client certificates are verified against (`--client-ca-file`).
    pub client_ca: Option<Arc<Reloadable<ClientCa>>>,
    /// Bearer tokens checked with TokenReview (`--authentication-token-webhook`).
    pub token_review: Option<TokenReviewSettings>,
    /// Anonymous requests allowed (`--anonymous-auth`).
    pub anonymous_auth: bool,
    /// `--authentication-config`: JWT issuers decided on the node, anonymous access by path.
    pub authentication_config: Option<StructuredSettings>,
    /// The authorizer chain, the attribute table and the Node name.
    pub authorization: AuthorizationSettings,
    /// The kubelet and how requests reach it.
    pub upstream: UpstreamSettings,
    /// Handshake and request-header deadline.
    pub header_read_timeout: Duration,
    /// Time a connection may stay open with nothing in flight.
    pub idle_connection_timeout: Duration,
    /// Most connections served at once, fitted to the open-file limit.
    pub max_connections: u32,
    /// Threads serving client connections (`--serving-threads`, 0 resolved to the CPUs).
    pub serving_threads: usize,
    /// Time given to in-flight requests at shutdown.
    pub shutdown_grace_period: Duration,
    /// Sessions served on after a handover, and the pod released for them.
    pub drain: drain::DrainSettings,
    /// Where audit events go, if anywhere; checked, not opened.
    pub audit: Option<AuditSettings>,
    /// Refuse exec, attach and portForward while their audit event cannot be written.
    pub audit_require_for_streams: bool,
    /// The files watched for changes, in the order their values were loaded.
    pub reloads: ReloadRegistry,
    /// What works but should be looked at: logged at start, printed by `check-config`.
    pub warnings: Vec<Warning>,
    /// What is worth knowing but needs no action (rules of a cluster's RBAC dump that concern
    /// other resources): logged at start, printed by `check-config`; `--strict` ignores them.
    pub notes: Vec<Warning>,
}

impl Settings {
    /// Validates `flags` and reads every file they name. Reads the kubeconfig only when
    /// TokenReview or the Webhook mode needs it; nothing is connected. The first problem found is
    /// the error; [`Settings::check`] reports them all.
    pub async fn load(flags: &ProxyFlags) -> Result<Settings, ConfigError> {
        // `check` never returns an empty list: every step that yields nothing records why.
        Settings::check(flags)
            .await
            .map_err(|mut errors| errors.swap_remove(0))
    }

    /// [`Settings::load`], reporting every problem it can find in one pass (never an empty
    /// list): the serving pair, authentication, authorization, the upstream and the audit log
    /// are checked independently, so `check-config` can list them all at once.
    pub async fn check(flags: &ProxyFlags) -> Result<Settings, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut notes = Vec::new();
        let mut reloads = ReloadRegistry::default();
        let token_review = keep(&mut errors, token_review_settings(flags).await);
        let authentication_config = keep(
            &mut errors,
            authentication_config_settings(flags, &mut warnings),
        );
        // The client CA first: the serving configuration advertises its names, so it reloads
        // after it.
        let client_ca = keep(&mut errors, client_ca_settings(flags, &mut reloads));
        let serving = keep(
            &mut errors,
            serving_settings(
                flags,
                &mut reloads,
                &mut warnings,
                client_ca.clone().flatten(),
            ),
        );
        if let (Some(token_review), Some(client_ca), Some(structured)) =
            (&token_review, &client_ca, &authentication_config)
        {
            keep(
                &mut errors,
                NoAuthenticationMethod::check(
                    client_ca.is_some(),
                    token_review.is_some() || structured.is_some(),
                    flags.anonymous_auth,
                )
                .map_err(|e| flag_cause("--client-ca-file", e)),
            );
        }
        let authorization = keep(
            &mut errors,
            AuthorizationSettings::read(flags, &mut reloads).await,
        );
        let serving_threads = crate::server::serving_threads::resolve(flags.serving_threads);
        if let Some(warning) = serving_threads.warning {
            warnings.push(Warning::new("--serving-threads", warning));
        }
        let serving_threads = serving_threads.count;
        let max_connections = match (&token_review, &authorization) {
            (Some(token_review), Some(authorization)) => {
                let clients = apiserver_clients(token_review.as_ref(), authorization);
                keep(
                    &mut errors,
                    descriptor_plan(flags, clients, serving_threads, &mut warnings),
                )
            }
            _ => None,
        };
        if let Some(authorization) = &authorization {
            let policy_flag = if flags.authorization_config.is_some() {
                "--authorization-config"
            } else {
                "--authorization-policy-file"
            };
            warnings.extend(authorization_warnings(
                authorization,
                flags.anonymous_auth,
                policy_flag,
                &mut notes,
            ));
        }
        let audit = keep(
            &mut errors,
            audit_settings(flags, authorization.as_ref(), &mut warnings),
        );
        // A warning, not an error: the handover never stops a start (the server checks again).
        if let Some(path) = &flags.handover_socket
            && let Err(e) = crate::server::handover_socket::check(path)
        {
            warnings.push(Warning::new(
                "--handover-socket",
                format!("{e}; the proxy would serve without handing its sockets over there"),
            ));
        }
        let node_name = authorization.as_ref().map(|a| a.node_name.as_str());
        let upstream = keep(&mut errors, upstream(flags, node_name, &mut reloads));
        let drain = keep(&mut errors, drain::drain_settings(flags, &mut warnings));
        match (
            token_review.zip(authentication_config),
            serving.zip(client_ca),
            authorization,
            max_connections,
            audit,
            upstream,
            drain,
        ) {
            (
                Some((token_review, authentication_config)),
                Some((server_tls, client_ca)),
                Some(authorization),
                Some(max_connections),
                Some(audit),
                Some(upstream),
                Some(drain),
            ) if errors.is_empty() => Ok(Settings {
                listen_addresses: listen::resolve(
                    &flags.listen_address,
                    flags
                        .upstream
                        .as_deref()
                        .and_then(|url| upstream_target(url).ok())
                        .as_ref(),
                ),
                listen_retry_timeout: flags.listen_retry_timeout,
                admin_listen_address: flags.admin_listen_address,
                admin_socket: flags.admin_socket.clone(),
                handover_socket: flags.handover_socket.clone(),
                server_tls,
                client_ca,
                token_review,
                anonymous_auth: flags.anonymous_auth,
                authentication_config,
                authorization,
                upstream,
                header_read_timeout: flags.header_read_timeout,
                idle_connection_timeout: flags.idle_connection_timeout,
                max_connections,
                serving_threads,
                shutdown_grace_period: flags.shutdown_grace_period,
                drain,
                audit,
                audit_require_for_streams: flags.audit_log_require_for_streams,
                reloads,
                warnings,
                notes,
            }),
            _ => Err(errors),
        }
    }
}

/// The value of `result`, or `None` with its error recorded in `errors`.
fn keep<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}
