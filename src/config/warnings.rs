//! Configurations that load but cannot work as meant, or expose more than an operator would
//! choose: each is a [`Warning`] naming the flag it comes from. The server logs them at start;
//! `check-config` prints them, and with `--strict` refuses the configuration.

use std::fmt;

use http::Method;

use super::{AuthorizationSettings, AuthorizerSettings};
use crate::authn::{ANONYMOUS_USER, UNAUTHENTICATED_GROUP, User};
use crate::authz::Decision;
use crate::authz::attributes::kubelet_attributes;
use crate::authz::pod_attributes::pod_attributes;
use crate::authz::policy::lint::lint_policies;

/// One thing about a configuration that an operator should know before serving with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The flag the setting comes from.
    pub flag: &'static str,
    /// What is wrong, and what to do.
    pub message: String,
}

impl Warning {
    /// A warning about `flag`.
    pub fn new(flag: &'static str, message: impl Into<String>) -> Warning {
        Warning {
            flag,
            message: message.into(),
        }
    }
}

impl fmt::Display for Warning {
    /// `flag: message`, or the message alone when it already starts with the flag.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.starts_with(self.flag) {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.flag, self.message)
        }
    }
}

/// Requests that run commands in a container: what anonymous callers must never be allowed.
const COMMAND_REQUESTS: [&str; 2] = ["/exec/default/pod/container", "/run/default/pod/container"];

/// What the authorizer chain lets through that an operator would rarely want, and what can never
/// match: rules no kubelet request can match, a chain that can never allow, `AlwaysAllow`, and
/// local rules that let anonymous callers run commands. `policy_flag` is the flag the policies
/// come from. The count of rules that concern other resources goes to `notes`.
pub fn authorization_warnings(
    authorization: &AuthorizationSettings,
    anonymous: bool,
    policy_flag: &'static str,
    notes: &mut Vec<Warning>,
) -> Vec<Warning> {
    const MODE: &str = "--authorization-mode";
    let mut warnings = Vec::new();
    let policies: Vec<_> = authorization
        .authorizers
        .iter()
        .filter_map(|a| match a {
            AuthorizerSettings::Policy(policy) => Some(policy.current_arc()),
            _ => None,
        })
        .collect();
    let lint = lint_policies(
        policies.iter().map(|p| &**p),
        &authorization.mapping,
        &authorization.node_name,
    );
    for warning in lint.warnings {
        warnings.push(Warning::new(policy_flag, warning.to_string()));
    }
    if lint.unlisted.rules > 0 {
        notes.push(Warning::new(policy_flag, lint.unlisted.to_string()));
    }
    let can_allow = authorization.authorizers.iter().any(|a| match a {
        AuthorizerSettings::AlwaysAllow
        | AuthorizerSettings::Webhook { .. }
        | AuthorizerSettings::Rbac(_) => true,
        AuthorizerSettings::Policy(policy) => {
            let stats = policy.current().stats();
            stats.cluster_role_bindings > 0
                || (authorization.mapping.pod_scoped && stats.role_bindings > 0)
        }
        AuthorizerSettings::Node | AuthorizerSettings::AlwaysDeny => false,
    });
    if !can_allow {
        warnings.push(Warning::new(
            MODE,
            format!(
                "the chain {} can never allow a request (Node and AlwaysDeny only refuse, and no \
                 local policy binds anyone): every request will get 403; add Policy with \
                 bindings, or Webhook",
                authorization.names()
            ),
        ));
    }
    warnings.extend(rbac_warnings(authorization, notes));
    if authorization
        .authorizers
        .iter()
        .any(|a| matches!(a, AuthorizerSettings::AlwaysAllow))
    {
        let who = if anonymous {
            "every caller, anonymous ones included (--anonymous-auth),"
        } else {
            "every authenticated caller"
        };
        warnings.push(Warning::new(
            MODE,
            format!(
                "AlwaysAllow lets {who} read every pod's logs and run commands in every \
                 container on this node (exec, run); use Node,Policy or Webhook"
            ),
        ));
    }
    if !authorization.mapping.pod_scoped {
        let role_bindings: usize = policies.iter().map(|p| p.stats().role_bindings).sum();
        if role_bindings > 0 {
            warnings.push(Warning::new(
                policy_flag,
                format!(
                    "{role_bindings} RoleBinding(s) never apply: kubelet requests have no \
                     namespace, and only --pod-scoped-authz asks about pods in theirs; turn it \
                     on, or bind with ClusterRoleBindings"
                ),
            ));
        }
    }
    if anonymous {
        warnings.extend(anonymous_commands(authorization, &policies));
    }
    warnings
}

/// Where `RBAC` sits in the chain: after a `Webhook` it saves no review, and with a zero
/// staleness bound it stops deciding at the first watch failure. Without a `Webhook` after it,
/// what it would allow is refused while it has no opinion (a note: strict setups want that).
fn rbac_warnings(authorization: &AuthorizationSettings, notes: &mut Vec<Warning>) -> Vec<Warning> {
    const MODE: &str = "--authorization-mode";
    let mut warnings = Vec::new();
    let authorizers = &authorization.authorizers;
    let Some(rbac) = authorizers
        .iter()
        .position(|a| matches!(a, AuthorizerSettings::Rbac(_)))
    else {
        return warnings;
    };
    let is_webhook = |a: &AuthorizerSettings| matches!(a, AuthorizerSettings::Webhook { .. });
    if authorizers[..rbac].iter().any(is_webhook) {
        warnings.push(Warning::new(
            MODE,
            format!(
                "RBAC comes after a Webhook in {}: every request still costs a                  SubjectAccessReview before RBAC is asked; put RBAC first (Node,RBAC,Webhook)",
                authorization.names()
            ),
        ));
    }
    if let AuthorizerSettings::Rbac(settings) = &authorizers[rbac]
        && settings.max_staleness.is_zero()
    {
        warnings.push(Warning::new(
            "--rbac-max-staleness",
            "0: RBAC stops deciding at the first failed list or watch, so a restarting API                  server refuses (or sends to the Webhook) what RBAC allows; the default is 10m",
        ));
    }
    if !authorizers[rbac..].iter().any(is_webhook) {
        notes.push(Warning::new(
            MODE,
            format!(
                "{}: no Webhook after RBAC, so what RBAC would allow is refused (403) until its                  first list completes and after its watches have been broken for                  --rbac-max-staleness; add Webhook after it to ask the API server then",
                authorization.names()
            ),
        ));
    }
    warnings
}

/// Local rules that let `system:anonymous` run commands in containers.
fn anonymous_commands(
    authorization: &AuthorizationSettings,
    policies: &[std::sync::Arc<crate::authz::policy::PolicyAuthorizer>],
) -> Option<Warning> {
    let anonymous = User {
        name: ANONYMOUS_USER.to_owned(),
        groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
        ..User::default()
    };
    // With --pod-scoped-authz, the same commands in every namespace a RoleBinding is in.
    let namespaced: Vec<String> = if authorization.mapping.pod_scoped {
        policies
            .iter()
            .flat_map(|p| p.binding_namespaces())
            .map(|namespace| format!("/exec/{namespace}/pod/container"))
            .collect()
    } else {
        Vec::new()
    };
    let paths = COMMAND_REQUESTS
        .iter()
        .copied()
        .chain(namespaced.iter().map(String::as_str));
    for path in paths {
        let request = kubelet_attributes(&authorization.mapping, &Method::POST, path);
        let pod = authorization
            .mapping
            .pod_scoped
            .then(|| pod_attributes(&Method::POST, path))
            .flatten()
            .map(|pod| pod.attributes(&anonymous, path));
        let node_sets = request.attributes(&anonymous, &authorization.node_name, path);
        for attrs in node_sets.chain(pod) {
            for policy in policies {
                if let Decision::Allow(reason) = policy.authorize(&attrs) {
                    return Some(Warning::new(
                        "--anonymous-auth",
                        format!(
                            "anonymous callers may run commands in containers (POST {path} is \
                             allowed: {reason}); bind only authenticated subjects to nodes/proxy"
                        ),
                    ));
                }
            }
        }
    }
    None
}
