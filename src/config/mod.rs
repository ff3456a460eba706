//! Configuration: flags parsed by clap ([`flags`]), then validated and read into [`Settings`].
//! Reading files is the only I/O here: nothing is created, written, removed, connected or started,
//! so `check-config` and `explain` can use this freely; [`mod@crate::startup::assemble`] turns settings into the
//! running services. Every problem is a [`ConfigError`] that names the flag and, for files, the
//! path, so `main` can print one clear line and exit with status 2.

pub mod authorization;
pub mod duration;
pub mod file;
pub mod flags;
pub mod listen;
pub mod warnings;

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Uri};
use rustls::pki_types::ServerName;

use crate::apiserver::{ApiClientError, ApiServerSettings};
use crate::audit::{self, AuditOptions, AuditTarget, Rotation};
use crate::authn::NoAuthenticationMethod;
use crate::authn::x509::ClientCa;
use crate::authz::attributes::AttributeMapping;
use crate::authz::match_conditions::MatchConditions;
use crate::authz::policy::PolicyAuthorizer;
use crate::forward::{UpstreamEndpoint, UpstreamTarget, UpstreamTlsConfig};
use crate::server::descriptors;
use crate::startup::reload::{ReloadError, ReloadRegistry, ReloadTarget, Reloadable};
use crate::tls::{self, ServerTls, UpstreamTls, ciphers};
use authorization::{AuthorizerSpec, FailurePolicy, WebhookSpec};
use flags::{AuthorizationMode, ProxyFlags};
use warnings::{Warning, authorization_warnings};

/// The cause of a configuration problem, kept so that callers can tell one failure from another.
pub type Cause = Box<dyn StdError + Send + Sync>;

/// A configuration problem, reported before anything is served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag's value is wrong or missing.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag, e.g. `--upstream`.
        flag: &'static str,
        /// What is wrong.
        reason: String,
        /// The underlying error, when a library reported one.
        #[source]
        source: Option<Cause>,
    },
    /// A file named by a flag is missing, unreadable or malformed.
    #[error("{flag} {}: {reason}", path.display())]
    File {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// The underlying error, when a library reported one.
        #[source]
        source: Option<Cause>,
    },
}

impl ConfigError {
    /// The flag the problem is about.
    pub fn flag(&self) -> &'static str {
        match self {
            ConfigError::Flag { flag, .. } | ConfigError::File { flag, .. } => flag,
        }
    }
}

fn flag_error(flag: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: reason.into(),
        source: None,
    }
}

pub(crate) fn file_error(
    flag: &'static str,
    path: &Path,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason: reason.into(),
        source: None,
    }
}

/// A flag whose value a library refused, with its error kept as the source.
fn flag_cause(flag: &'static str, cause: impl StdError + Send + Sync + 'static) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: cause.to_string(),
        source: Some(Box::new(cause)),
    }
}

/// A reloadable value that could not be loaded from `path`, without naming the file twice when
/// the file at fault is the flag's own.
fn reload_cause(flag: &'static str, path: &Path, e: ReloadError) -> ConfigError {
    let reason = match &e {
        ReloadError::Read { path: at, source } if at == path => format!("cannot read: {source}"),
        ReloadError::Empty { path: at } if at == path => "the file is empty".to_owned(),
        other => other.to_string(),
    };
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason,
        source: Some(Box::new(e)),
    }
}

/// A file a library refused, with its error kept as the source.
pub(crate) fn file_cause(
    flag: &'static str,
    path: &Path,
    cause: impl StdError + Send + Sync + 'static,
) -> ConfigError {
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason: cause.to_string(),
        source: Some(Box::new(cause)),
    }
}

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
    /// Serving TLS, client certificates requested when x509 authentication is on; rebuilt when
    /// the certificate, key or client CA files change.
    pub server_tls: Arc<Reloadable<rustls::ServerConfig>>,
    /// The CA bundle client certificates are verified against (`--client-ca-file`).
    pub client_ca: Option<Arc<Reloadable<ClientCa>>>,
    /// Bearer tokens checked with TokenReview (`--authentication-token-webhook`).
    pub token_review: Option<TokenReviewSettings>,
    /// Anonymous requests allowed (`--anonymous-auth`).
    pub anonymous_auth: bool,
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

/// TokenReview settings.
pub struct TokenReviewSettings {
    /// How to reach the API server.
    pub apiserver: ApiServerSettings,
    /// `--authentication-token-audiences`.
    pub audiences: Vec<String>,
    /// `--authentication-token-webhook-cache-ttl`.
    pub cache_ttl: Duration,
}

/// What `explain` needs, and part of what the server needs: the chain, the table, the node.
pub struct AuthorizationSettings {
    /// The authorizers in the order they are asked.
    pub authorizers: Vec<AuthorizerSettings>,
    /// How requests map to attributes.
    pub mapping: AttributeMapping,
    /// The Node name of every attribute.
    pub node_name: String,
    /// `--apiserver-max-reviews-inflight`, for every API server client.
    pub apiserver_max_reviews_inflight: usize,
}

/// One authorizer of the chain, its files read.
pub enum AuthorizerSettings {
    /// Allows everything.
    AlwaysAllow,
    /// No opinion on anything.
    AlwaysDeny,
    /// Node identities only on their own node.
    Node,
    /// Local RBAC rules, loaded (and reloaded when their files change).
    Policy(Arc<Reloadable<PolicyAuthorizer>>),
    /// SubjectAccessReview.
    Webhook {
        /// Its name, TTLs and failure policy.
        spec: WebhookSpec,
        /// How to reach the API server (boxed: a kube configuration is large, and the chain
        /// is mostly other authorizers).
        apiserver: Box<ApiServerSettings>,
    },
}

impl AuthorizerSettings {
    /// The mode name, as written in `--authorization-mode`.
    pub fn name(&self) -> &'static str {
        match self {
            AuthorizerSettings::AlwaysAllow => "AlwaysAllow",
            AuthorizerSettings::AlwaysDeny => "AlwaysDeny",
            AuthorizerSettings::Node => "Node",
            AuthorizerSettings::Policy(_) => "Policy",
            AuthorizerSettings::Webhook { .. } => "Webhook",
        }
    }
}

/// The kubelet, resolved, and the bounds on requests to it.
pub struct UpstreamSettings {
    /// Where and how to connect.
    pub endpoint: UpstreamEndpoint,
    /// `--forward-identity-headers`.
    pub forward_identity_headers: bool,
    /// `--upstream-connect-timeout`.
    pub connect_timeout: Duration,
    /// `--streaming-connection-idle-timeout`.
    pub streaming_idle_timeout: Duration,
    /// `--upstream-max-requests-inflight`.
    pub max_requests_inflight: usize,
    /// `--upstream-max-requests-inflight-per-user`.
    pub max_requests_inflight_per_user: usize,
}

/// The audit log, checked but not opened.
pub struct AuditSettings {
    /// A file or standard output.
    pub target: AuditTarget,
    /// Rotation and truncation.
    pub options: AuditOptions,
    /// `--audit-log-path` as given, for errors.
    pub path: PathBuf,
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
        if let (Some(token_review), Some(client_ca)) = (&token_review, &client_ca) {
            keep(
                &mut errors,
                NoAuthenticationMethod::check(
                    client_ca.is_some(),
                    token_review.is_some(),
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
        let audit = keep(&mut errors, audit_settings(flags, &mut warnings));
        let node_name = authorization.as_ref().map(|a| a.node_name.as_str());
        let upstream = keep(&mut errors, upstream(flags, node_name, &mut reloads));
        match (
            token_review,
            serving.zip(client_ca),
            authorization,
            max_connections,
            audit,
            upstream,
        ) {
            (
                Some(token_review),
                Some((server_tls, client_ca)),
                Some(authorization),
                Some(max_connections),
                Some(audit),
                Some(upstream),
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
                server_tls,
                client_ca,
                token_review,
                anonymous_auth: flags.anonymous_auth,
                authorization,
                upstream,
                header_read_timeout: flags.header_read_timeout,
                idle_connection_timeout: flags.idle_connection_timeout,
                max_connections,
                serving_threads,
                shutdown_grace_period: flags.shutdown_grace_period,
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

/// TokenReview: the kubeconfig, read only when `--authentication-token-webhook` is on.
async fn token_review_settings(
    flags: &ProxyFlags,
) -> Result<Option<TokenReviewSettings>, ConfigError> {
    if !flags.authentication_token_audiences.is_empty() && !flags.authentication_token_webhook {
        return Err(flag_error(
            "--authentication-token-audiences",
            "given, but --authentication-token-webhook is off",
        ));
    }
    if !flags.authentication_token_webhook {
        return Ok(None);
    }
    Ok(Some(TokenReviewSettings {
        apiserver: ApiServerSettings::read(
            flags.kubeconfig.as_deref(),
            flags.apiserver_request_timeout,
        )
        .map_err(|e| kubeconfig_error(flags, e))?,
        audiences: flags.authentication_token_audiences.clone(),
        cache_ttl: flags.authentication_token_webhook_cache_ttl,
    }))
}

/// The client CA bundle (`--client-ca-file`), registered for reloading.
fn client_ca_settings(
    flags: &ProxyFlags,
    reloads: &mut ReloadRegistry,
) -> Result<Option<Arc<Reloadable<ClientCa>>>, ConfigError> {
    let Some(path) = &flags.client_ca_file else {
        return Ok(None);
    };
    reloads
        .load("client_ca", vec![path.clone()], |paths| {
            ClientCa::from_pem_file(&paths[0])
        })
        .map(Some)
        .map_err(|e| reload_cause("--client-ca-file", path, e))
}

/// The serving pair, TLS versions and suites: the serving configuration, advertising
/// `client_ca`'s names, registered for reloading.
fn serving_settings(
    flags: &ProxyFlags,
    reloads: &mut ReloadRegistry,
    warnings: &mut Vec<Warning>,
    client_ca: Option<Arc<Reloadable<ClientCa>>>,
) -> Result<Arc<Reloadable<rustls::ServerConfig>>, ConfigError> {
    let cert_path = flags
        .tls_cert_file
        .as_deref()
        .ok_or_else(|| flag_error("--tls-cert-file", "required"))?;
    let key_path = flags
        .tls_private_key_file
        .as_deref()
        .ok_or_else(|| flag_error("--tls-private-key-file", "required"))?;
    // Read once here for precise errors; the reloadable rebuilds from the same files.
    let certs =
        tls::read_certs(cert_path).map_err(|e| file_cause("--tls-cert-file", cert_path, e))?;
    let key =
        tls::read_key(key_path).map_err(|e| file_cause("--tls-private-key-file", key_path, e))?;
    check_pair(
        &certs,
        &key,
        ("--tls-cert-file", cert_path),
        ("--tls-private-key-file", key_path),
    )?;
    let min_version = ciphers::parse_min_version(&flags.tls_min_version)
        .map_err(|e| flag_error("--tls-min-version", e))?;
    let ciphers::Selection {
        suites: cipher_suites,
        skipped,
    } = ciphers::select_suites(&flags.tls_cipher_suites)
        .map_err(|e| flag_error("--tls-cipher-suites", e))?;
    if !skipped.is_empty() {
        warnings.push(Warning::new(
            "--tls-cipher-suites",
            format!(
                "skipping {}: rustls does not offer them (CBC, RSA key exchange); only AEAD \
                 suites with forward secrecy are served",
                skipped.join(",")
            ),
        ));
    }
    if min_version == ciphers::MinVersion::Tls13 && !flags.tls_cipher_suites.is_empty() {
        warnings.push(Warning::new(
            "--tls-cipher-suites",
            "has no effect with --tls-min-version=VersionTLS13",
        ));
    }
    serving_tls(
        reloads,
        cert_path,
        key_path,
        min_version,
        cipher_suites,
        client_ca,
    )
    .map_err(|e| reload_cause("--tls-cert-file", cert_path, e))
}

impl AuthorizationSettings {
    /// Only what authorization depends on: `--authorization-mode` or `--authorization-config`,
    /// the policy files, the attribute table flags and the Node name, and the kubeconfig only
    /// when a Webhook is in the chain. `explain` runs on this alone.
    pub async fn load(flags: &ProxyFlags) -> Result<AuthorizationSettings, ConfigError> {
        AuthorizationSettings::read(flags, &mut ReloadRegistry::default()).await
    }

    async fn read(
        flags: &ProxyFlags,
        reloads: &mut ReloadRegistry,
    ) -> Result<AuthorizationSettings, ConfigError> {
        let node_name = match &flags.node_name {
            Some(name) if !name.trim().is_empty() => name.trim().to_owned(),
            Some(_) => return Err(flag_error("--node-name", "must not be empty")),
            None => default_node_name().map_err(|e| flag_error("--node-name", e))?,
        };
        let mut authorizers = Vec::new();
        for spec in authorizer_specs(flags)? {
            authorizers.push(match spec {
                AuthorizerSpec::AlwaysAllow => AuthorizerSettings::AlwaysAllow,
                AuthorizerSpec::AlwaysDeny => AuthorizerSettings::AlwaysDeny,
                AuthorizerSpec::Node => AuthorizerSettings::Node,
                AuthorizerSpec::Policy(files) => {
                    let flag = if flags.authorization_config.is_some() {
                        "--authorization-config"
                    } else {
                        "--authorization-policy-file"
                    };
                    let policy = reloads
                        .load("policy", files, PolicyAuthorizer::load)
                        .map_err(|e| flag_cause(flag, e))?;
                    let stats = policy.current().stats();
                    tracing::info!(
                        cluster_roles = stats.cluster_roles,
                        cluster_role_bindings = stats.cluster_role_bindings,
                        rules = stats.rules,
                        "loaded local policy"
                    );
                    AuthorizerSettings::Policy(policy)
                }
                AuthorizerSpec::Webhook(spec) => {
                    let apiserver =
                        ApiServerSettings::read(spec.kubeconfig.as_deref(), spec.timeout).map_err(
                            |e| match &flags.authorization_config {
                                Some(path) => ConfigError::File {
                                    flag: "--authorization-config",
                                    path: path.clone(),
                                    reason: format!("authorizer {:?}: {e}", spec.name),
                                    source: Some(Box::new(e)),
                                },
                                None => kubeconfig_error(flags, e),
                            },
                        )?;
                    AuthorizerSettings::Webhook {
                        spec,
                        apiserver: Box::new(apiserver),
                    }
                }
            });
        }
        Ok(AuthorizationSettings {
            authorizers,
            mapping: AttributeMapping {
                fine_grained: flags.fine_grained_authz,
                exec_requires_create: flags.exec_requires_create,
                standalone_statusz_flagz: flags.standalone_statusz_flagz,
                pod_scoped: flags.pod_scoped_authz,
            },
            node_name,
            apiserver_max_reviews_inflight: flags.apiserver_max_reviews_inflight as usize,
        })
    }

    /// The authorizers' mode names, in order, e.g. `Node,Policy,Webhook`.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self
            .authorizers
            .iter()
            .map(AuthorizerSettings::name)
            .collect();
        names.join(",")
    }
}

/// How many API server clients serving will build: TokenReview and the webhooks that share a
/// kubeconfig and timeout share one (see [`mod@crate::startup::assemble`]).
fn apiserver_clients(
    token_review: Option<&TokenReviewSettings>,
    authorization: &AuthorizationSettings,
) -> usize {
    let mut keys: Vec<(Option<&Path>, Duration)> = Vec::new();
    let token = token_review.map(|t| t.apiserver.sharing_key());
    let webhooks = authorization.authorizers.iter().filter_map(|a| match a {
        AuthorizerSettings::Webhook { apiserver, .. } => Some(apiserver.sharing_key()),
        _ => None,
    });
    for key in token.into_iter().chain(webhooks) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.len()
}

/// Checks `--audit-log-path` and its rotation and truncation flags without creating, writing or
/// removing anything: the directory must exist and be writable, and the file, if present, must be
/// a regular file.
fn audit_settings(
    flags: &ProxyFlags,
    warnings: &mut Vec<Warning>,
) -> Result<Option<AuditSettings>, ConfigError> {
    let Some(path) = &flags.audit_log_path else {
        return Ok(None);
    };
    let target = AuditTarget::from_flag(path.clone());
    if let AuditTarget::File(file) = &target {
        if flags.audit_log_maxsize == 0 {
            warnings.push(Warning::new(
                "--audit-log-maxsize",
                "0: the audit log is never rotated and can fill its disk",
            ));
        } else if flags.audit_log_maxbackup == 0 {
            warnings.push(Warning::new(
                "--audit-log-maxbackup",
                "0: every rotated audit log is kept; together they can fill their disk",
            ));
        }
        audit::check_file_target(file).map_err(|e| file_cause("--audit-log-path", path, e))?;
    }
    Ok(Some(AuditSettings {
        target,
        options: AuditOptions {
            rotation: Rotation {
                max_size_mb: flags.audit_log_maxsize,
                max_backups: flags.audit_log_maxbackup,
            },
            max_event_size: flags
                .audit_log_truncate_enabled
                .then_some(flags.audit_log_truncate_max_event_size as usize),
        },
        path: path.clone(),
    }))
}

/// The kubelet's default node name: the hostname, lowercased.
fn default_node_name() -> Result<String, String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("cannot read the hostname ({e}); set --node-name"))?;
    let name = name.trim().to_lowercase();
    if name.is_empty() {
        return Err("the hostname is empty; set --node-name".into());
    }
    Ok(name)
}

/// The client connections to serve: `--max-connections`, lowered (with a warning) when it does not
/// fit the descriptor limit beside the upstream and API server bounds (see [`descriptors`]).
fn descriptor_plan(
    flags: &ProxyFlags,
    apiserver_clients: usize,
    serving_threads: usize,
    warnings: &mut Vec<Warning>,
) -> Result<u32, ConfigError> {
    let limit = descriptors::hard_limit();
    // Two review kinds per API server client.
    let apiserver = 2 * u64::from(flags.apiserver_max_reviews_inflight) * apiserver_clients as u64;
    let plan = descriptors::plan(
        limit,
        descriptors::Demand {
            max_connections: flags.max_connections,
            // Each serving thread keeps its own pool of kubelet connections, and a pool keeps
            // idle as many as its thread last had in flight: at worst each thread in turn had
            // every place.
            upstream: u64::from(flags.upstream_max_requests_inflight) * serving_threads as u64,
            apiserver,
        },
    )
    .map_err(|e| flag_error("--max-connections", e.to_string()))?;
    if let Some(warning) = plan.warning {
        warnings.push(Warning::new("--max-connections", warning));
    }
    Ok(plan.max_connections)
}

/// A client error attributed to `--kubeconfig` (its file, or its absence).
pub(crate) fn kubeconfig_error(flags: &ProxyFlags, e: ApiClientError) -> ConfigError {
    match &flags.kubeconfig {
        Some(path) => file_cause("--kubeconfig", path, e),
        None => ConfigError::Flag {
            flag: "--kubeconfig",
            reason: format!(
                "{e}; the API server is needed by --authentication-token-webhook and --authorization-mode=Webhook"
            ),
            source: Some(Box::new(e)),
        },
    }
}

/// The authorizer chain as configured: from `--authorization-config`, or from
/// `--authorization-mode` (default `Webhook`) and the flags that go with it.
fn authorizer_specs(flags: &ProxyFlags) -> Result<Vec<AuthorizerSpec>, ConfigError> {
    const FLAG: &str = "--authorization-mode";
    if let Some(path) = &flags.authorization_config {
        if !flags.authorization_mode.is_empty() {
            return Err(flag_error(
                FLAG,
                "cannot be combined with --authorization-config",
            ));
        }
        if !flags.authorization_policy_file.is_empty() {
            return Err(flag_error(
                "--authorization-policy-file",
                "cannot be combined with --authorization-config (list the files in its Policy authorizer)",
            ));
        }
        return authorization::load(path);
    }
    let modes = if flags.authorization_mode.is_empty() {
        &[AuthorizationMode::Webhook][..]
    } else {
        &flags.authorization_mode[..]
    };
    let mut specs = Vec::with_capacity(modes.len());
    for (i, mode) in modes.iter().enumerate() {
        if modes[..i].contains(mode) {
            return Err(flag_error(
                FLAG,
                format!("mode {mode:?} is specified more than once"),
            ));
        }
        specs.push(match mode {
            AuthorizationMode::AlwaysAllow => AuthorizerSpec::AlwaysAllow,
            AuthorizationMode::AlwaysDeny => AuthorizerSpec::AlwaysDeny,
            AuthorizationMode::Node => AuthorizerSpec::Node,
            AuthorizationMode::Policy => {
                if flags.authorization_policy_file.is_empty() {
                    return Err(flag_error(
                        "--authorization-policy-file",
                        "required by --authorization-mode=Policy",
                    ));
                }
                AuthorizerSpec::Policy(flags.authorization_policy_file.clone())
            }
            AuthorizationMode::Webhook => AuthorizerSpec::Webhook(WebhookSpec {
                name: "webhook".into(),
                kubeconfig: flags.kubeconfig.clone(),
                timeout: flags.apiserver_request_timeout,
                authorized_ttl: flags.authorization_webhook_cache_authorized_ttl,
                unauthorized_ttl: flags.authorization_webhook_cache_unauthorized_ttl,
                failure_policy: FailurePolicy::NoOpinion,
                match_conditions: MatchConditions::default(),
            }),
        });
    }
    if !flags.authorization_policy_file.is_empty() && !modes.contains(&AuthorizationMode::Policy) {
        return Err(flag_error(
            "--authorization-policy-file",
            "given, but Policy is not in --authorization-mode",
        ));
    }
    Ok(specs)
}

/// The serving configuration, rebuilt from the certificate, key and (for the advertised CA
/// names) client CA files.
fn serving_tls(
    reloads: &mut ReloadRegistry,
    cert_path: &Path,
    key_path: &Path,
    min_version: ciphers::MinVersion,
    cipher_suites: Vec<rustls::SupportedCipherSuite>,
    client_ca: Option<Arc<Reloadable<ClientCa>>>,
) -> Result<Arc<Reloadable<rustls::ServerConfig>>, ReloadError> {
    let mut paths = vec![cert_path.to_owned(), key_path.to_owned()];
    if let Some(ca) = &client_ca {
        paths.extend(ca.paths().iter().cloned());
    }
    reloads.load("serving_certificate", paths, move |paths| {
        let cert_chain =
            tls::read_certs(&paths[0]).map_err(|e| format!("{}: {e}", paths[0].display()))?;
        let key = tls::read_key(&paths[1]).map_err(|e| format!("{}: {e}", paths[1].display()))?;
        let hints = client_ca.as_ref().map(|ca| ca.current().hint_subjects());
        tls::server_config(ServerTls {
            cert_chain,
            key,
            min_version,
            cipher_suites: cipher_suites.clone(),
            client_ca_hints: hints.as_deref(),
        })
    })
}

/// Parses `--upstream` into a target; only a bare scheme://host[:port] or unix:///path is accepted,
/// so the forwarded path is always exactly the client's.
fn upstream_target(url: &str) -> Result<UpstreamTarget, String> {
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err("a unix socket must be an absolute path: unix:///path/to/socket".into());
        }
        return Ok(UpstreamTarget::Unix {
            path: PathBuf::from(path),
        });
    }
    let uri: Uri = url.parse().map_err(|e| {
        format!("not a URL ({e}); expected https://host:port, http://host:port or unix:///path")
    })?;
    if uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        return Err("must not have a path or query: the client's path is forwarded as is".into());
    }
    let authority: Authority = uri
        .authority()
        .cloned()
        .ok_or("missing host; expected https://host:port")?;
    match uri.scheme_str() {
        Some("https") => Ok(UpstreamTarget::Https { authority }),
        Some("http") => Ok(UpstreamTarget::Http { authority }),
        _ => Err("scheme must be https, http or unix".into()),
    }
}

/// A certificate and key pair given by two flags: the key must be the certificate's. The error
/// names the key's flag and file, and the certificate's.
fn check_pair(
    chain: &[rustls::pki_types::CertificateDer<'static>],
    key: &rustls::pki_types::PrivateKeyDer<'static>,
    (cert_flag, cert_path): (&'static str, &Path),
    (key_flag, key_path): (&'static str, &Path),
) -> Result<(), ConfigError> {
    tls::check_pair(chain, key).map_err(|e| {
        let reason = match e {
            tls::PairError::Mismatch => format!(
                "does not belong to the certificate of {cert_flag} {} (their public keys \
                 differ); give the key that certificate was issued for",
                cert_path.display()
            ),
            tls::PairError::UnsupportedKey(_) => e.to_string(),
        };
        ConfigError::File {
            flag: key_flag,
            path: key_path.to_owned(),
            reason,
            source: Some(Box::new(e)),
        }
    })
}

/// The files the TLS client towards the kubelet is built from.
struct UpstreamTlsFiles {
    /// `--upstream-ca-file`.
    ca: PathBuf,
    /// `--upstream-client-cert-file` and `--upstream-client-key-file`.
    client_identity: Option<(PathBuf, PathBuf)>,
    /// See [`UpstreamTls::or_name`].
    or_name: Option<ServerName<'static>>,
}

impl UpstreamTlsFiles {
    /// The files, in the order they are read.
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.ca.clone()];
        if let Some((cert, key)) = &self.client_identity {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    /// The flag that names `path`.
    fn flag_of(&self, path: &Path) -> &'static str {
        match &self.client_identity {
            Some((cert, _)) if cert == path => "--upstream-client-cert-file",
            Some((_, key)) if key == path => "--upstream-client-key-file",
            _ => "--upstream-ca-file",
        }
    }

    /// The TLS client configuration from the files as they are now; errors name the flag and
    /// the file at fault.
    fn build(&self) -> Result<rustls::ClientConfig, ConfigError> {
        let client_identity = match &self.client_identity {
            Some((cert, key)) => {
                let cert_flag = ("--upstream-client-cert-file", cert.as_path());
                let key_flag = ("--upstream-client-key-file", key.as_path());
                let chain = tls::read_certs(cert).map_err(|e| file_cause(cert_flag.0, cert, e))?;
                let private = tls::read_key(key).map_err(|e| file_cause(key_flag.0, key, e))?;
                check_pair(&chain, &private, cert_flag, key_flag)?;
                Some((chain, private))
            }
            None => None,
        };
        let roots =
            tls::read_certs(&self.ca).map_err(|e| file_cause("--upstream-ca-file", &self.ca, e))?;
        tls::upstream_client_config(UpstreamTls {
            roots,
            client_identity,
            or_name: self.or_name.clone(),
        })
        .map_err(|e| flag_error("--upstream-client-cert-file", e))
    }
}

/// The TLS client towards the kubelet, registered for reloading: a rotated client certificate
/// or kubelet CA applies to the next connection to the kubelet; pooled connections keep theirs.
fn upstream_tls(
    files: UpstreamTlsFiles,
    reloads: &mut ReloadRegistry,
) -> Result<Arc<Reloadable<rustls::ClientConfig>>, ConfigError> {
    let paths = files.paths();
    let flag_of = |path: &Path| files.flag_of(path);
    let named: Vec<(PathBuf, &'static str)> =
        paths.iter().map(|p| (p.clone(), flag_of(p))).collect();
    reloads
        .load("upstream_tls", paths, move |_| files.build())
        .map_err(|e| match e {
            ReloadError::Build(cause) => match cause.downcast::<ConfigError>() {
                Ok(e) => *e,
                Err(cause) => flag_error("--upstream-ca-file", cause.to_string()),
            },
            ReloadError::Read { ref path, .. } | ReloadError::Empty { ref path } => {
                let flag = named
                    .iter()
                    .find(|(p, _)| p == path)
                    .map_or("--upstream-ca-file", |(_, flag)| *flag);
                reload_cause(flag, &path.clone(), e)
            }
            e => flag_error("--upstream-ca-file", e.to_string()),
        })
}

/// The kubelet from `--upstream` and its TLS flags, resolved, with the bounds on requests to it.
fn upstream(
    flags: &ProxyFlags,
    node_name: Option<&str>,
    reloads: &mut ReloadRegistry,
) -> Result<UpstreamSettings, ConfigError> {
    if flags.upstream_max_requests_inflight_per_user > flags.upstream_max_requests_inflight {
        return Err(flag_error(
            "--upstream-max-requests-inflight-per-user",
            format!(
                "{} is more than --upstream-max-requests-inflight={}; a user's share must fit in the total",
                flags.upstream_max_requests_inflight_per_user, flags.upstream_max_requests_inflight
            ),
        ));
    }
    let url = flags
        .upstream
        .as_deref()
        .ok_or_else(|| flag_error("--upstream", "required (e.g. https://127.0.0.1:10250)"))?;
    let target = upstream_target(url).map_err(|e| flag_error("--upstream", e))?;
    if flags.forward_identity_headers && !identity_headers_stay_local(&target) {
        return Err(flag_error(
            "--forward-identity-headers",
            format!(
                "would send X-Remote-* identity headers in clear text over the network to {url}; \
                 use an https:// upstream, a unix:// socket, or a loopback http:// address"
            ),
        ));
    }
    let client_identity = match (
        &flags.upstream_client_cert_file,
        &flags.upstream_client_key_file,
    ) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        (Some(_), None) => {
            return Err(flag_error(
                "--upstream-client-key-file",
                "required with --upstream-client-cert-file",
            ));
        }
        (None, Some(_)) => {
            return Err(flag_error(
                "--upstream-client-cert-file",
                "required with --upstream-client-key-file",
            ));
        }
    };
    let tls = match &target {
        UpstreamTarget::Https { .. } => {
            let ca = flags.upstream_ca_file.clone().ok_or_else(|| {
                flag_error("--upstream-ca-file", "required for an https --upstream")
            })?;
            let files = UpstreamTlsFiles {
                ca,
                client_identity,
                or_name: node_name.and_then(|n| node_name_fallback(flags, &target, n)),
            };
            Some(upstream_tls(files, reloads)?)
        }
        _ => {
            if client_identity.is_some() || flags.upstream_ca_file.is_some() {
                return Err(flag_error(
                    "--upstream",
                    "TLS files for the upstream are given but --upstream is not https://",
                ));
            }
            None
        }
    };
    let server_name = match &flags.upstream_server_name {
        Some(name) => Some(
            ServerName::try_from(name.clone())
                .map_err(|e| flag_cause("--upstream-server-name", e))?,
        ),
        None => None,
    };
    Ok(UpstreamSettings {
        endpoint: UpstreamEndpoint::resolve(
            target,
            tls.map(UpstreamTlsConfig::Reloaded),
            server_name,
        )
        .map_err(|e| flag_cause("--upstream", e))?,
        forward_identity_headers: flags.forward_identity_headers,
        connect_timeout: flags.upstream_connect_timeout,
        streaming_idle_timeout: flags.streaming_connection_idle_timeout,
        max_requests_inflight: flags.upstream_max_requests_inflight as usize,
        max_requests_inflight_per_user: flags.upstream_max_requests_inflight_per_user as usize,
    })
}

/// Without `--upstream-server-name`, a loopback upstream's certificate may also be valid for the
/// node's name (see `tls::upstream_name`).
fn node_name_fallback(
    flags: &ProxyFlags,
    target: &UpstreamTarget,
    node_name: &str,
) -> Option<ServerName<'static>> {
    let UpstreamTarget::Https { authority } = target else {
        return None;
    };
    if flags.upstream_server_name.is_some() || !is_loopback(authority) {
        return None;
    }
    ServerName::try_from(node_name.to_owned()).ok()
}

/// Whether identity headers sent to `target` stay off the network or are encrypted: https, a unix
/// socket, or plain http to a loopback address (`localhost` or an IP literal in 127.0.0.0/8 or
/// `::1`). A name other than `localhost` could resolve anywhere, so it does not count.
fn identity_headers_stay_local(target: &UpstreamTarget) -> bool {
    match target {
        UpstreamTarget::Https { .. } | UpstreamTarget::Unix { .. } => true,
        UpstreamTarget::Http { authority } => is_loopback(authority),
    }
}

/// Whether `authority` names this host's loopback: `localhost`, or an IP literal in 127.0.0.0/8
/// or `::1`. A name other than `localhost` could resolve anywhere, so it does not count.
fn is_loopback(authority: &Authority) -> bool {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_headers_travel_only_encrypted_or_on_loopback() {
        for (url, local) in [
            ("https://10.0.0.1:10250", true),
            ("unix:///run/kubelet.sock", true),
            ("http://127.0.0.1:10255", true),
            ("http://127.9.9.9:10255", true),
            ("http://localhost:10255", true),
            ("http://[::1]:10255", true),
            ("http://10.0.0.1:10255", false),
            ("http://node-1.example:10255", false),
            ("http://[2001:db8::1]:10255", false),
        ] {
            let target = upstream_target(url).unwrap();
            assert_eq!(identity_headers_stay_local(&target), local, "{url}");
        }
    }

    #[test]
    fn upstream_forms() {
        assert!(matches!(
            upstream_target("https://127.0.0.1:10250"),
            Ok(UpstreamTarget::Https { .. })
        ));
        assert!(matches!(
            upstream_target("http://localhost:10255/"),
            Ok(UpstreamTarget::Http { .. })
        ));
        assert!(matches!(
            upstream_target("unix:///run/kubelet.sock"),
            Ok(UpstreamTarget::Unix { .. })
        ));
        for bad in [
            "unix://relative.sock",
            "https://h:1/prefix",
            "https://h:1/?q=1",
            "ftp://h",
            "/just/a/path",
            "https://",
        ] {
            assert!(upstream_target(bad).is_err(), "{bad} should be refused");
        }
    }
}
