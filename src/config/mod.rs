//! Configuration: flags parsed by clap ([`flags`]), then validated and loaded (certificates, keys,
//! policies) into one typed [`Config`]. Every problem is a [`ConfigError`] that names the flag and,
//! for files, the path, so `main` can print one clear line and exit with status 2.

pub mod authorization;
pub mod duration;
pub mod file;
pub mod flags;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Uri};
use rustls::pki_types::ServerName;

use crate::apiserver::ApiServerClient;
use crate::audit::{self, AuditLog, AuditOptions, AuditTarget, Rotation};
use crate::authn::Authenticator;
use crate::authn::token::TokenReviewAuthenticator;
use crate::authn::x509::{ClientCa, X509Authenticator};
use crate::authz::attributes::AttributeMapping;
use crate::authz::node::NodeAuthorizer;
use crate::authz::policy::PolicyAuthorizer;
use crate::authz::webhook::SubjectAccessReviewAuthorizer;
use crate::authz::{Authorizer, AuthorizerChain};
use crate::descriptors;
use crate::metrics::Metrics;
use crate::proxy::{ForwardOptions, Forwarder, UpstreamTarget};
use crate::reload::{ReloadTarget, Reloadable};
use crate::tls::{self, ServerTls, UpstreamTls, ciphers};
use authorization::{AuthorizerSpec, FailurePolicy, WebhookSpec};
use flags::{AuthorizationMode, ProxyFlags};

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
    },
}

fn flag_error(flag: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        reason: reason.into(),
    }
}

fn file_error(flag: &'static str, path: &Path, reason: impl Into<String>) -> ConfigError {
    ConfigError::File {
        flag,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Everything the server needs, validated and loaded.
pub struct Config {
    /// Where the kubelet API is served.
    pub listen_address: SocketAddr,
    /// Where /healthz, /readyz and /metrics are served.
    pub admin_listen_address: SocketAddr,
    /// Serving TLS, client certificates requested when x509 authentication is on; rebuilt when
    /// the certificate, key or client CA files change.
    pub server_tls: Arc<Reloadable<rustls::ServerConfig>>,
    /// Who is calling.
    pub authenticator: Authenticator,
    /// May they do it.
    pub authorizers: AuthorizerChain,
    /// How requests map to attributes.
    pub mapping: AttributeMapping,
    /// The Node name of every attribute.
    pub node_name: String,
    /// The pooled client to the kubelet.
    pub forwarder: Forwarder,
    /// Handshake and request-header deadline.
    pub header_read_timeout: Duration,
    /// Time a connection may stay open with nothing in flight.
    pub idle_connection_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: u32,
    /// Time given to in-flight requests at shutdown.
    pub shutdown_grace_period: Duration,
    /// The metrics every part records into.
    pub metrics: Arc<Metrics>,
    /// What to rebuild when files change, in dependency order.
    pub reload_targets: Vec<Arc<dyn ReloadTarget>>,
    /// Where audit events go, if anywhere.
    pub audit: Option<AuditLog>,
    /// Refuse exec, attach and portForward while their audit event cannot be written.
    pub audit_require_for_streams: bool,
}

/// What a configuration is loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Serving: the audit log is opened (created if missing, old backups pruned) and its writer
    /// started.
    Serve,
    /// Checking (`check-config`, `explain`): everything is read and validated, nothing on disk is
    /// created, written or removed; the audit log's place is checked but not opened.
    Check,
}

impl Config {
    /// Validates `flags` and loads every file they name, to serve. Builds the API server client
    /// only when TokenReview or the Webhook mode needs it (it connects lazily, on the first
    /// review).
    pub async fn load(flags: &ProxyFlags) -> Result<Config, ConfigError> {
        Config::load_for(flags, Purpose::Serve).await
    }

    /// [`Config::load`] without side effects on disk, for commands that only read or validate.
    pub async fn check(flags: &ProxyFlags) -> Result<Config, ConfigError> {
        Config::load_for(flags, Purpose::Check).await
    }

    async fn load_for(flags: &ProxyFlags, purpose: Purpose) -> Result<Config, ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let specs = authorizer_specs(flags)?;
        let mut clients = ApiServerClients::new(
            Arc::clone(&metrics),
            flags.apiserver_max_reviews_inflight as usize,
        );
        let token_client = if flags.authentication_token_webhook {
            Some(
                clients
                    .get(flags.kubeconfig.as_deref(), flags.apiserver_request_timeout)
                    .await
                    .map_err(|e| kubeconfig_error(flags, e))?,
            )
        } else {
            None
        };
        if !flags.authentication_token_audiences.is_empty() && !flags.authentication_token_webhook {
            return Err(flag_error(
                "--authentication-token-audiences",
                "given, but --authentication-token-webhook is off",
            ));
        }
        let cert_path = flags
            .tls_cert_file
            .as_deref()
            .ok_or_else(|| flag_error("--tls-cert-file", "required"))?;
        let key_path = flags
            .tls_private_key_file
            .as_deref()
            .ok_or_else(|| flag_error("--tls-private-key-file", "required"))?;
        // Read once here for precise errors; the reloadable rebuilds from the same files.
        tls::read_certs(cert_path).map_err(|e| file_error("--tls-cert-file", cert_path, e))?;
        tls::read_key(key_path).map_err(|e| file_error("--tls-private-key-file", key_path, e))?;
        let min_version = ciphers::parse_min_version(&flags.tls_min_version)
            .map_err(|e| flag_error("--tls-min-version", e))?;
        let cipher_suites = ciphers::select_suites(&flags.tls_cipher_suites)
            .map_err(|e| flag_error("--tls-cipher-suites", e))?;
        if min_version == ciphers::MinVersion::Tls13 && !flags.tls_cipher_suites.is_empty() {
            tracing::warn!("--tls-cipher-suites has no effect with --tls-min-version=VersionTLS13");
        }

        let mut reload_targets: Vec<Arc<dyn ReloadTarget>> = Vec::new();
        let client_ca = match &flags.client_ca_file {
            Some(path) => {
                let ca = Reloadable::load("client_ca", vec![path.clone()], |paths| {
                    ClientCa::from_pem_file(&paths[0]).map_err(|e| e.to_string())
                })
                .map_err(|e| file_error("--client-ca-file", path, e))?;
                let ca = Arc::new(ca);
                reload_targets.push(ca.clone());
                Some(ca)
            }
            None => None,
        };
        let server_tls = Arc::new(
            serving_tls(
                cert_path,
                key_path,
                min_version,
                cipher_suites,
                client_ca.clone(),
            )
            .map_err(|e| file_error("--tls-cert-file", cert_path, e))?,
        );
        reload_targets.push(server_tls.clone());
        let tokens = match token_client {
            Some(client) => Some(Arc::new(
                TokenReviewAuthenticator::new(
                    client,
                    flags.authentication_token_audiences.clone(),
                    flags.authentication_token_webhook_cache_ttl,
                    Arc::clone(&metrics),
                )
                .map_err(|e| flag_error("--authentication-token-webhook", e.to_string()))?,
            )),
            None => None,
        };
        let authenticator = Authenticator::new(
            client_ca.map(X509Authenticator::new),
            tokens,
            flags.anonymous_auth,
        )
        .map_err(|e| flag_error("--client-ca-file", e.to_string()))?;

        let node_name = match &flags.node_name {
            Some(name) if !name.trim().is_empty() => name.trim().to_owned(),
            Some(_) => return Err(flag_error("--node-name", "must not be empty")),
            None => default_node_name().map_err(|e| flag_error("--node-name", e))?,
        };

        let authorizers =
            build_authorizers(flags, specs, &mut clients, &metrics, &mut reload_targets).await?;
        let max_connections = descriptor_plan(flags, clients.built.len())?;

        Ok(Config {
            listen_address: flags.listen_address,
            admin_listen_address: flags.admin_listen_address,
            server_tls,
            authenticator,
            authorizers,
            mapping: AttributeMapping {
                fine_grained: flags.fine_grained_authz,
                exec_requires_create: flags.exec_requires_create,
                standalone_statusz_flagz: flags.standalone_statusz_flagz,
            },
            node_name,
            forwarder: forwarder(flags, &metrics)?,
            header_read_timeout: flags.header_read_timeout,
            idle_connection_timeout: flags.idle_connection_timeout,
            max_connections,
            shutdown_grace_period: flags.shutdown_grace_period,
            audit: audit_log(flags, &metrics, purpose)?,
            audit_require_for_streams: flags.audit_log_require_for_streams,
            metrics,
            reload_targets,
        })
    }
}

/// Opens `--audit-log-path` (creating the file), so that a bad path stops the start-up.
fn audit_log(
    flags: &ProxyFlags,
    metrics: &Metrics,
    purpose: Purpose,
) -> Result<Option<AuditLog>, ConfigError> {
    let Some(path) = &flags.audit_log_path else {
        return Ok(None);
    };
    let target = AuditTarget::from_flag(path.clone());
    if matches!(target, AuditTarget::File(_)) {
        if flags.audit_log_maxsize == 0 {
            tracing::warn!(
                "--audit-log-maxsize=0: the audit log is never rotated and can fill its disk"
            );
        } else if flags.audit_log_maxbackup == 0 {
            tracing::warn!(
                "--audit-log-maxbackup=0: every rotated audit log is kept; together they can fill their disk"
            );
        }
    }
    if purpose == Purpose::Check {
        return match &target {
            AuditTarget::Stdout => Ok(None),
            AuditTarget::File(file) => audit::check_file_target(file)
                .map(|()| None)
                .map_err(|e| file_error("--audit-log-path", path, e.to_string())),
        };
    }
    AuditLog::open(
        target,
        AuditOptions {
            rotation: Rotation {
                max_size_mb: flags.audit_log_maxsize,
                max_backups: flags.audit_log_maxbackup,
            },
            max_event_size: flags
                .audit_log_truncate_enabled
                .then_some(flags.audit_log_truncate_max_event_size as usize),
        },
        metrics.audit_dropped(),
    )
    .map(Some)
    .map_err(|e| file_error("--audit-log-path", path, format!("cannot open: {e}")))
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
fn descriptor_plan(flags: &ProxyFlags, apiserver_clients: usize) -> Result<u32, ConfigError> {
    let limit = descriptors::hard_limit();
    // Two review kinds per API server client.
    let apiserver = 2 * u64::from(flags.apiserver_max_reviews_inflight) * apiserver_clients as u64;
    let plan = descriptors::plan(
        limit,
        descriptors::Demand {
            max_connections: flags.max_connections,
            upstream: u64::from(flags.upstream_max_requests_inflight),
            apiserver,
        },
    )
    .map_err(|e| flag_error("--max-connections", e.to_string()))?;
    if let Some(warning) = &plan.warning {
        tracing::warn!("{warning}");
    }
    Ok(plan.max_connections)
}

/// API server clients by kubeconfig and timeout, so that TokenReview and the webhooks that share
/// a connection share one client (and its connection pool).
struct ApiServerClients {
    metrics: Arc<Metrics>,
    /// `--apiserver-max-reviews-inflight`, for every client.
    max_inflight: usize,
    built: Vec<((Option<PathBuf>, Duration), ApiServerClient)>,
}

impl ApiServerClients {
    fn new(metrics: Arc<Metrics>, max_inflight: usize) -> Self {
        ApiServerClients {
            metrics,
            max_inflight,
            built: Vec::new(),
        }
    }

    async fn get(
        &mut self,
        kubeconfig: Option<&Path>,
        timeout: Duration,
    ) -> Result<ApiServerClient, crate::apiserver::ApiClientError> {
        let key = (kubeconfig.map(Path::to_owned), timeout);
        if let Some((_, client)) = self.built.iter().find(|(k, _)| *k == key) {
            return Ok(client.clone());
        }
        let client = ApiServerClient::new(
            kubeconfig,
            timeout,
            self.max_inflight,
            Arc::clone(&self.metrics),
        )
        .await?;
        self.built.push((key, client.clone()));
        Ok(client)
    }
}

/// A client error attributed to `--kubeconfig` (its file, or its absence).
fn kubeconfig_error(flags: &ProxyFlags, e: crate::apiserver::ApiClientError) -> ConfigError {
    match &flags.kubeconfig {
        Some(path) => file_error("--kubeconfig", path, e.to_string()),
        None => flag_error(
            "--kubeconfig",
            format!(
                "{e}; the API server is needed by --authentication-token-webhook and --authorization-mode=Webhook"
            ),
        ),
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
    cert_path: &Path,
    key_path: &Path,
    min_version: ciphers::MinVersion,
    cipher_suites: Vec<rustls::SupportedCipherSuite>,
    client_ca: Option<Arc<Reloadable<ClientCa>>>,
) -> Result<Reloadable<rustls::ServerConfig>, String> {
    let mut paths = vec![cert_path.to_owned(), key_path.to_owned()];
    if let Some(ca) = &client_ca {
        paths.extend(ca.paths().iter().cloned());
    }
    Reloadable::load("serving_certificate", paths, move |paths| {
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

async fn build_authorizers(
    flags: &ProxyFlags,
    specs: Vec<AuthorizerSpec>,
    clients: &mut ApiServerClients,
    metrics: &Arc<Metrics>,
    reload_targets: &mut Vec<Arc<dyn ReloadTarget>>,
) -> Result<AuthorizerChain, ConfigError> {
    let mut chain = Vec::with_capacity(specs.len());
    for spec in specs {
        chain.push(match spec {
            AuthorizerSpec::AlwaysAllow => Authorizer::AlwaysAllow,
            AuthorizerSpec::AlwaysDeny => Authorizer::AlwaysDeny,
            AuthorizerSpec::Node => Authorizer::Node(NodeAuthorizer),
            AuthorizerSpec::Policy(files) => {
                let flag = if flags.authorization_config.is_some() {
                    "--authorization-config"
                } else {
                    "--authorization-policy-file"
                };
                let policy = Reloadable::load("policy", files, |paths| {
                    PolicyAuthorizer::load(paths).map_err(|e| e.to_string())
                })
                .map_err(|e| flag_error(flag, e))?;
                let stats = policy.current().stats();
                tracing::info!(
                    cluster_roles = stats.cluster_roles,
                    cluster_role_bindings = stats.cluster_role_bindings,
                    rules = stats.rules,
                    "loaded local policy"
                );
                let policy = Arc::new(policy);
                reload_targets.push(policy.clone());
                Authorizer::Policy(policy)
            }
            AuthorizerSpec::Webhook(webhook) => {
                let client = clients
                    .get(webhook.kubeconfig.as_deref(), webhook.timeout)
                    .await
                    .map_err(|e| match &flags.authorization_config {
                        Some(path) => file_error(
                            "--authorization-config",
                            path,
                            format!("authorizer {:?}: {e}", webhook.name),
                        ),
                        None => kubeconfig_error(flags, e),
                    })?;
                Authorizer::Webhook(Arc::new(SubjectAccessReviewAuthorizer::new(
                    client,
                    webhook.authorized_ttl,
                    webhook.unauthorized_ttl,
                    webhook.failure_policy,
                    Arc::clone(metrics),
                )))
            }
        });
    }
    Ok(AuthorizerChain::new(chain))
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

fn forwarder(flags: &ProxyFlags, metrics: &Metrics) -> Result<Forwarder, ConfigError> {
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
        (Some(cert), Some(key)) => Some((
            tls::read_certs(cert)
                .map_err(|e| file_error("--upstream-client-cert-file", cert, e))?,
            tls::read_key(key).map_err(|e| file_error("--upstream-client-key-file", key, e))?,
        )),
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
            let ca = flags.upstream_ca_file.as_deref().ok_or_else(|| {
                flag_error("--upstream-ca-file", "required for an https --upstream")
            })?;
            let roots = tls::read_certs(ca).map_err(|e| file_error("--upstream-ca-file", ca, e))?;
            Some(
                tls::upstream_client_config(UpstreamTls {
                    roots,
                    client_identity,
                })
                .map_err(|e| flag_error("--upstream-client-cert-file", e))?,
            )
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
                .map_err(|e| flag_error("--upstream-server-name", e.to_string()))?,
        ),
        None => None,
    };
    Forwarder::new(
        target,
        tls,
        server_name,
        ForwardOptions {
            forward_identity_headers: flags.forward_identity_headers,
            connect_timeout: flags.upstream_connect_timeout,
            streaming_idle_timeout: flags.streaming_connection_idle_timeout,
            max_requests_inflight: flags.upstream_max_requests_inflight as usize,
            max_requests_inflight_per_user: flags.upstream_max_requests_inflight_per_user as usize,
            requests_in_flight: metrics.upstream_requests_in_flight(),
        },
    )
    .map_err(|e| flag_error("--upstream", e.to_string()))
}

/// Whether identity headers sent to `target` stay off the network or are encrypted: https, a unix
/// socket, or plain http to a loopback address (`localhost` or an IP literal in 127.0.0.0/8 or
/// `::1`). A name other than `localhost` could resolve anywhere, so it does not count.
fn identity_headers_stay_local(target: &UpstreamTarget) -> bool {
    match target {
        UpstreamTarget::Https { .. } | UpstreamTarget::Unix { .. } => true,
        UpstreamTarget::Http { authority } => {
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
    }
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
