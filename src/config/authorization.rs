//! `--authorization-config`: an `AuthorizationConfiguration` (`apiserver.config.k8s.io/v1`, as
//! kube-apiserver reads it) describing the authorizer chain, validated as kube-apiserver validates
//! it; anything the proxy cannot honour (`ABAC`, `v1beta1` reviews) is an error saying so.
//!
//! The chain holds `Webhook` authorizers (each with its own connection, timeout, TTLs and failure
//! policy, its CEL `matchConditions` compiled: [`crate::authz::match_conditions`]), `Node`,
//! `AlwaysAllow`, `AlwaysDeny`, `RBAC` (the cluster's roles and bindings, watched:
//! [`crate::authz::live_rbac`]) and this proxy's local `Policy`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration::parse_go_duration;
use crate::authz::match_conditions::MatchConditions;
pub use crate::authz::webhook::{FailurePolicy, WebhookSpec};

const FLAG: &str = "--authorization-config";
/// kube-apiserver's upper bound on a webhook's timeout.
const MAX_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// One authorizer of the chain, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorizerSpec {
    /// Allow everything.
    AlwaysAllow,
    /// No opinion on anything.
    AlwaysDeny,
    /// Node identities only on their own node.
    Node,
    /// Local RBAC rules from these files.
    Policy(Vec<PathBuf>),
    /// The cluster's RBAC objects, watched through `--kubeconfig` (or in-cluster).
    Rbac,
    /// SubjectAccessReview.
    Webhook(WebhookSpec),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuthorizationConfiguration {
    api_version: String,
    kind: String,
    authorizers: Vec<AuthorizerConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorizerConfig {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    webhook: Option<WebhookConfig>,
    policy: Option<PolicyConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WebhookConfig {
    timeout: Option<String>,
    #[serde(rename = "authorizedTTL")]
    authorized_ttl: Option<String>,
    #[serde(rename = "unauthorizedTTL")]
    unauthorized_ttl: Option<String>,
    cache_authorized_requests: Option<bool>,
    cache_unauthorized_requests: Option<bool>,
    subject_access_review_version: Option<String>,
    match_condition_subject_access_review_version: Option<String>,
    failure_policy: Option<String>,
    connection_info: Option<ConnectionInfo>,
    #[serde(default)]
    match_conditions: Vec<MatchCondition>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConnectionInfo {
    #[serde(rename = "type")]
    kind: String,
    kube_config_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchCondition {
    expression: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyConfig {
    files: Vec<String>,
}

/// Reads and validates the file into the authorizer chain it describes.
pub fn load(path: &Path) -> Result<Vec<AuthorizerSpec>, ConfigError> {
    let error = |reason: String| super::file_error(FLAG, path, reason);
    let text = super::file::read_text(FLAG, path)?;
    let config: AuthorizationConfiguration =
        serde_saphyr::from_str_with_options(&text, serde_saphyr::options! { with_snippet: false })
            .map_err(|e| super::file_cause(FLAG, path, e))?;
    if !matches!(
        config.api_version.as_str(),
        "apiserver.config.k8s.io/v1"
            | "apiserver.config.k8s.io/v1beta1"
            | "apiserver.config.k8s.io/v1alpha1"
    ) {
        return Err(error(format!(
            "apiVersion {:?} is not supported (expected apiserver.config.k8s.io/v1)",
            config.api_version
        )));
    }
    if config.kind != "AuthorizationConfiguration" {
        return Err(error(format!(
            "kind {:?} is not AuthorizationConfiguration",
            config.kind
        )));
    }
    if config.authorizers.is_empty() {
        return Err(error(
            "authorizers: at least one authorizer is required".into(),
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let mut names = HashSet::new();
    let mut seen_types = HashSet::new();
    let mut specs = Vec::with_capacity(config.authorizers.len());
    for (i, authorizer) in config.authorizers.into_iter().enumerate() {
        let at = |reason: String| {
            error(format!(
                "authorizers[{i}] ({:?}): {reason}",
                authorizer.name
            ))
        };
        if !crate::base::names::is_dns1123_subdomain(&authorizer.name) {
            return Err(at(
                "name is required and must be a DNS-1123 subdomain".into()
            ));
        }
        if !names.insert(authorizer.name.clone()) {
            return Err(at("name is used by another authorizer".into()));
        }
        if authorizer.kind != "Webhook" && !seen_types.insert(authorizer.kind.clone()) {
            return Err(at(format!(
                "type {} may appear only once (only Webhook may repeat)",
                authorizer.kind
            )));
        }
        if authorizer.kind != "Webhook" && authorizer.webhook.is_some() {
            return Err(at("webhook is only allowed with type Webhook".into()));
        }
        if authorizer.kind != "Policy" && authorizer.policy.is_some() {
            return Err(at("policy is only allowed with type Policy".into()));
        }
        specs.push(match authorizer.kind.as_str() {
            "AlwaysAllow" => AuthorizerSpec::AlwaysAllow,
            "AlwaysDeny" => AuthorizerSpec::AlwaysDeny,
            "Node" => AuthorizerSpec::Node,
            "Policy" => {
                let policy = authorizer
                    .policy
                    .as_ref()
                    .ok_or_else(|| at("policy.files is required with type Policy".into()))?;
                if policy.files.is_empty() {
                    return Err(at("policy.files must name at least one file".into()));
                }
                AuthorizerSpec::Policy(policy.files.iter().map(|f| base.join(f)).collect())
            }
            "Webhook" => {
                let webhook = authorizer
                    .webhook
                    .as_ref()
                    .ok_or_else(|| at("webhook is required with type Webhook".into()))?;
                let expressions = webhook
                    .match_conditions
                    .iter()
                    .map(|c| c.expression.as_str());
                let match_conditions =
                    MatchConditions::compile(expressions).map_err(|e| ConfigError::File {
                        flag: FLAG,
                        path: path.to_owned(),
                        reason: format!("authorizers[{i}] ({:?}): {e}", authorizer.name),
                        source: Some(Box::new(e)),
                    })?;
                AuthorizerSpec::Webhook(
                    webhook_spec(&authorizer.name, webhook, match_conditions).map_err(at)?,
                )
            }
            "RBAC" => AuthorizerSpec::Rbac,
            "ABAC" => return Err(at("type ABAC is not supported".into())),
            other => {
                return Err(at(format!(
                    "unknown type {other:?} (Webhook, Node, AlwaysAllow, AlwaysDeny, Policy, RBAC)"
                )));
            }
        });
    }
    Ok(specs)
}

fn webhook_spec(
    name: &str,
    webhook: &WebhookConfig,
    match_conditions: MatchConditions,
) -> Result<WebhookSpec, String> {
    let duration = |field: &str, value: &Option<String>, default: Option<Duration>| match value {
        Some(text) => parse_go_duration(text).map_err(|e| format!("webhook.{field}: {e}")),
        None => default.ok_or_else(|| format!("webhook.{field} is required")),
    };
    let timeout = duration("timeout", &webhook.timeout, None)?;
    if timeout.is_zero() || timeout > MAX_WEBHOOK_TIMEOUT {
        return Err("webhook.timeout must be greater than 0s and at most 30s".into());
    }
    let authorized_ttl = match webhook.cache_authorized_requests {
        Some(false) => Duration::ZERO,
        _ => duration(
            "authorizedTTL",
            &webhook.authorized_ttl,
            Some(Duration::from_secs(300)),
        )?,
    };
    let unauthorized_ttl = match webhook.cache_unauthorized_requests {
        Some(false) => Duration::ZERO,
        _ => duration(
            "unauthorizedTTL",
            &webhook.unauthorized_ttl,
            Some(Duration::from_secs(30)),
        )?,
    };
    match webhook.subject_access_review_version.as_deref() {
        Some("v1") => {}
        Some("v1beta1") => {
            return Err(
                "webhook.subjectAccessReviewVersion v1beta1 is not supported; use v1".into(),
            );
        }
        Some(other) => {
            return Err(format!(
                "webhook.subjectAccessReviewVersion {other:?} is not v1"
            ));
        }
        None => return Err("webhook.subjectAccessReviewVersion is required (v1)".into()),
    }
    match webhook
        .match_condition_subject_access_review_version
        .as_deref()
    {
        None | Some("") if !match_conditions.is_empty() => {
            return Err(
                "webhook.matchConditionSubjectAccessReviewVersion is required with matchConditions (v1)"
                    .into(),
            );
        }
        None | Some("" | "v1") => {}
        Some(other) => {
            return Err(format!(
                "webhook.matchConditionSubjectAccessReviewVersion {other:?} is not v1"
            ));
        }
    }
    let failure_policy = match webhook.failure_policy.as_deref() {
        Some("NoOpinion") => FailurePolicy::NoOpinion,
        Some("Deny") => FailurePolicy::Deny,
        Some(other) => {
            return Err(format!(
                "webhook.failurePolicy {other:?} is not NoOpinion or Deny"
            ));
        }
        None => return Err("webhook.failurePolicy is required (NoOpinion or Deny)".into()),
    };
    let connection = webhook
        .connection_info
        .as_ref()
        .ok_or("webhook.connectionInfo is required")?;
    let kubeconfig = match (
        connection.kind.as_str(),
        connection.kube_config_file.as_deref(),
    ) {
        ("KubeConfigFile", Some(file)) if Path::new(file).is_absolute() => {
            if !Path::new(file).is_file() {
                return Err(format!(
                    "webhook.connectionInfo.kubeConfigFile {file:?} is not a regular file"
                ));
            }
            Some(PathBuf::from(file))
        }
        ("KubeConfigFile", Some(_)) => {
            return Err("webhook.connectionInfo.kubeConfigFile must be an absolute path".into());
        }
        ("KubeConfigFile", None) => {
            return Err(
                "webhook.connectionInfo.kubeConfigFile is required with type KubeConfigFile".into(),
            );
        }
        ("InClusterConfig", None) => None,
        ("InClusterConfig", Some(_)) => {
            return Err(
                "webhook.connectionInfo.kubeConfigFile is only allowed with type KubeConfigFile"
                    .into(),
            );
        }
        (other, _) => {
            return Err(format!(
                "webhook.connectionInfo.type {other:?} is not KubeConfigFile or InClusterConfig"
            ));
        }
    };
    Ok(WebhookSpec {
        name: name.to_owned(),
        kubeconfig,
        timeout,
        authorized_ttl,
        unauthorized_ttl,
        failure_policy,
        match_conditions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(name: &str, text: &str) -> Result<Vec<AuthorizerSpec>, String> {
        let dir = std::env::temp_dir().join(format!("kap-authz-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("webhook.kubeconfig");
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
        let path = dir.join("authz.yaml");
        std::fs::write(
            &path,
            text.replace("KUBECONFIG", kubeconfig.to_str().unwrap()),
        )
        .unwrap();
        let result = load(&path).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    const HEAD: &str = "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n";
    const WEBHOOK: &str = "  - type: Webhook\n    name: webhook\n    webhook:\n      timeout: 3s\n      \
         subjectAccessReviewVersion: v1\n      failurePolicy: Deny\n      \
         connectionInfo: {type: KubeConfigFile, kubeConfigFile: KUBECONFIG}\n";

    /// A configuration of [`WEBHOOK`] alone, `from` replaced by `to`.
    fn webhook(from: &str, to: &str) -> String {
        format!("{HEAD}authorizers:\n{}", WEBHOOK.replace(from, to))
    }

    /// A configuration of [`WEBHOOK`] alone, with `fields` added to its `webhook:` mapping.
    fn webhook_with(fields: &[&str]) -> String {
        let added: String = fields.iter().map(|f| format!("      {f}\n")).collect();
        webhook(
            "failurePolicy: Deny\n",
            &format!("failurePolicy: Deny\n{added}"),
        )
    }

    #[test]
    fn a_file_over_one_mebibyte_is_refused_unread() {
        let padding = format!("# {}\n", "x".repeat(1 << 20));
        let err = load_text(
            "huge",
            &format!("{HEAD}{padding}authorizers:\n  - type: Node\n"),
        )
        .unwrap_err();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
    }

    #[test]
    fn a_full_chain_loads() {
        let text = format!(
            "{HEAD}authorizers:\n  - {{type: Node, name: node}}\n  - type: Policy\n    name: local\n    \
             policy: {{files: [policy.yaml]}}\n{WEBHOOK}  - {{type: AlwaysDeny, name: deny}}\n"
        );
        let specs = load_text("full", &text).unwrap();
        assert_eq!(specs.len(), 4);
        assert_eq!(specs[0], AuthorizerSpec::Node);
        assert!(
            matches!(&specs[1], AuthorizerSpec::Policy(files) if files[0].ends_with("policy.yaml"))
        );
        match &specs[2] {
            AuthorizerSpec::Webhook(w) => {
                assert_eq!(w.timeout, Duration::from_secs(3));
                assert_eq!(w.authorized_ttl, Duration::from_secs(300), "default 5m");
                assert_eq!(w.unauthorized_ttl, Duration::from_secs(30), "default 30s");
                assert_eq!(w.failure_policy, FailurePolicy::Deny);
                assert!(w.kubeconfig.is_some());
            }
            other => panic!("{other:?}"),
        }
        let no_cache = text.replace(
            "      timeout: 3s\n",
            "      timeout: 3s\n      cacheAuthorizedRequests: false\n      unauthorizedTTL: 1m\n",
        );
        match &load_text("nocache", &no_cache).unwrap()[2] {
            AuthorizerSpec::Webhook(w) => {
                assert_eq!(w.authorized_ttl, Duration::ZERO);
                assert_eq!(w.unauthorized_ttl, Duration::from_secs(60));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn match_conditions_are_compiled_at_load() {
        let text = webhook_with(&[
            "matchConditionSubjectAccessReviewVersion: v1",
            "matchConditions:\n        - expression: \"!('system:nodes' in request.groups)\"\n        \
             - expression: has(request.resourceAttributes)",
        ]);
        match &load_text("conditions", &text).unwrap()[0] {
            AuthorizerSpec::Webhook(w) => assert_eq!(
                w.match_conditions.expressions().collect::<Vec<_>>(),
                [
                    "!('system:nodes' in request.groups)",
                    "has(request.resourceAttributes)"
                ]
            ),
            other => panic!("{other:?}"),
        }
        // The version alone, without conditions, is accepted as kube-apiserver accepts it.
        let text = webhook_with(&["matchConditionSubjectAccessReviewVersion: v1"]);
        match &load_text("version-only", &text).unwrap()[0] {
            AuthorizerSpec::Webhook(w) => assert!(w.match_conditions.is_empty()),
            other => panic!("{other:?}"),
        }
        // 65 conditions are too many.
        let many: String = (0..65)
            .map(|i| format!("\n        - expression: \"{i} > 0\""))
            .collect();
        let text = webhook_with(&[
            "matchConditionSubjectAccessReviewVersion: v1",
            &format!("matchConditions:{many}"),
        ]);
        let err = load_text("many", &text).unwrap_err();
        assert!(
            err.contains("authz.yaml: authorizers[0] (\"webhook\"): webhook.matchConditions: must have at most 64 items, has 65"),
            "{err}"
        );
    }

    #[test]
    fn invalid_configurations_name_the_problem() {
        let cases = [
            (
                format!("{HEAD}authorizers: []\n"),
                "at least one authorizer",
            ),
            (webhook("timeout: 3s", "timeout: 31s"), "at most 30s"),
            (
                webhook("      timeout: 3s\n", ""),
                "webhook.timeout is required",
            ),
            (
                webhook("failurePolicy: Deny", "failurePolicy: Allow"),
                "failurePolicy \"Allow\"",
            ),
            (
                webhook(
                    "subjectAccessReviewVersion: v1",
                    "subjectAccessReviewVersion: v1beta1",
                ),
                "v1beta1 is not supported",
            ),
            (
                webhook_with(&[
                    "matchConditions: [{expression: \"has(request.resourceAttributes)\"}]",
                ]),
                "webhook.matchConditionSubjectAccessReviewVersion is required with matchConditions (v1)",
            ),
            (
                webhook_with(&["matchConditionSubjectAccessReviewVersion: v1beta1"]),
                "webhook.matchConditionSubjectAccessReviewVersion \"v1beta1\" is not v1",
            ),
            (
                webhook_with(&[
                    "matchConditionSubjectAccessReviewVersion: v1",
                    "matchConditions: [{expression: \"request.userInfo.username == 'x'\"}]",
                ]),
                "authorizers[0] (\"webhook\"): webhook.matchConditions[0].expression \"request.userInfo.username == 'x'\": compilation failed: undefined field 'userInfo'",
            ),
            (
                webhook_with(&[
                    "matchConditionSubjectAccessReviewVersion: v1",
                    "matchConditions: [{expression: \"true\"}, {expression: \"\"}]",
                ]),
                "webhook.matchConditions[1].expression is required",
            ),
            (
                webhook_with(&[
                    "matchConditionSubjectAccessReviewVersion: v1",
                    "matchConditions: [{expression: \"true\", name: x}]",
                ]),
                "unknown field `name`",
            ),
            (
                webhook(
                    "kubeConfigFile: KUBECONFIG",
                    "kubeConfigFile: relative.yaml",
                ),
                "must be an absolute path",
            ),
            (
                webhook(
                    "type: KubeConfigFile, kubeConfigFile: KUBECONFIG",
                    "type: InClusterConfig",
                ),
                "",
            ),
            (
                webhook("timeout: 3s", "timeot: 3s"),
                "unknown field `timeot`",
            ),
            (webhook("name: webhook", "name: Web_hook"), "DNS-1123"),
            (
                format!(
                    "{HEAD}authorizers:\n  - {{type: RBAC, name: a}}\n  - {{type: RBAC, name: b}}\n"
                ),
                "may appear only once",
            ),
            (
                format!(
                    "{HEAD}authorizers:\n  - {{type: Node, name: a}}\n  - {{type: Node, name: b}}\n"
                ),
                "may appear only once",
            ),
            (
                format!(
                    "{HEAD}authorizers:\n  - {{type: Node, name: a}}\n  - {{type: AlwaysAllow, name: a}}\n"
                ),
                "name is used",
            ),
            (
                format!("{HEAD}authorizers:\n  - {{type: Policy, name: p}}\n"),
                "policy.files is required",
            ),
            (
                "apiVersion: v1\nkind: AuthorizationConfiguration\nauthorizers: []\n".to_owned(),
                "apiVersion \"v1\"",
            ),
        ];
        for (i, (text, expected)) in cases.iter().enumerate() {
            let result = load_text(&format!("case{i}"), text);
            if expected.is_empty() {
                assert!(result.is_ok(), "case {i}: {result:?}");
                continue;
            }
            let err = result.expect_err(&format!("case {i} should fail"));
            assert!(err.contains("--authorization-config"), "{err}");
            assert!(
                err.contains(expected),
                "case {i}: {err:?} lacks {expected:?}"
            );
        }
    }
}
