//! The authorizer chain, from `--authorization-mode` and its flags or from
//! `--authorization-config`, with the policy files read, the attribute table and the Node name.

use std::sync::Arc;

use super::ConfigError;
use super::authorization::{self, AuthorizerSpec, FailurePolicy, WebhookSpec};
use super::error::{flag_cause, flag_error, kubeconfig_error};
use super::flags::{AuthorizationMode, ProxyFlags};
use crate::apiserver::ApiServerSettings;
use crate::authz::attributes::AttributeMapping;
use crate::authz::live_rbac::{RbacSettings, Scope};
use crate::authz::match_conditions::MatchConditions;
use crate::authz::policy::PolicyAuthorizer;
use crate::base::reload::{ReloadRegistry, Reloadable};

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
    /// The cluster's RBAC objects, watched (started when the decider is built).
    Rbac(RbacSettings),
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
            AuthorizerSettings::Rbac(_) => "RBAC",
            AuthorizerSettings::Webhook { .. } => "Webhook",
        }
    }
}

impl AuthorizationSettings {
    /// Only what authorization depends on: `--authorization-mode` or `--authorization-config`,
    /// the policy files, the attribute table flags and the Node name, and the kubeconfig only
    /// when a Webhook is in the chain. `explain` runs on this alone.
    pub async fn load(flags: &ProxyFlags) -> Result<AuthorizationSettings, ConfigError> {
        AuthorizationSettings::read(flags, &mut ReloadRegistry::default()).await
    }

    pub(super) async fn read(
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
                AuthorizerSpec::Rbac => {
                    let apiserver = ApiServerSettings::read_for_watches(
                        flags.kubeconfig.as_deref(),
                        flags.apiserver_request_timeout,
                    )
                    .map_err(|e| kubeconfig_error(flags, e))?;
                    AuthorizerSettings::Rbac(RbacSettings {
                        apiserver,
                        scope: Scope {
                            pods: flags.pod_scoped_authz,
                        },
                        max_staleness: flags.rbac_max_staleness,
                        start_jitter: flags.rbac_start_jitter,
                    })
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
            AuthorizationMode::Rbac => AuthorizerSpec::Rbac,
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
