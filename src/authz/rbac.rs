//! RBAC matching as pure functions over data: does a `PolicyRule` allow a request, does a binding
//! `Subject` apply to a user. Semantics are exactly Kubernetes' `RuleAllows` and `appliesToUser`
//! (kubernetes v1.33 `plugin/pkg/auth/authorizer/rbac/rbac.go`,
//! `pkg/apis/rbac/v1/evaluation_helpers.go`, `pkg/registry/rbac/validation/rule.go`); the `Policy`
//! authorizer in `policy.rs` builds on them.

use serde::Deserialize;

/// Subject kind of a single user name.
pub const USER_KIND: &str = "User";
/// Subject kind of a group name.
pub const GROUP_KIND: &str = "Group";
/// Subject kind of a service account, matched through its user name.
pub const SERVICE_ACCOUNT_KIND: &str = "ServiceAccount";

/// What every service account user name starts with: `system:serviceaccount:<namespace>:<name>`.
const SERVICE_ACCOUNT_USERNAME_PREFIX: &str = "system:serviceaccount:";
/// The wildcard accepted in verbs, apiGroups, resources and nonResourceURLs.
const ALL: &str = "*";

/// One rule of a ClusterRole, field for field as in `rbac.authorization.k8s.io/v1`.
///
/// Unknown fields are rejected so that an operator's typo (`verb:` for `verbs:`) is a load error
/// rather than a rule that silently grants nothing, or more than intended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    /// Verbs allowed (`get`, `create`, …, or `*`). Case-sensitive.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// API groups the rule covers; `""` is the core group, `*` any. Empty matches nothing.
    #[serde(default)]
    pub api_groups: Vec<String>,
    /// `resource`, `resource/subresource`, `*/subresource` or `*`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Object names the rule is limited to; empty means any name.
    #[serde(default)]
    pub resource_names: Vec<String>,
    /// Non-resource paths (`/healthz`, `/logs/*`, `*`); never match resource requests.
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

/// A subject of a (Cluster)RoleBinding, field for field as in `rbac.authorization.k8s.io/v1`.
///
/// `kind` is kept as a string because an unknown kind is representable (it never matches); the
/// `Policy` loader rejects it before it gets here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: String,
    /// Not consulted when matching, as in Kubernetes; validated by the loader.
    #[serde(default)]
    pub api_group: String,
    /// User, group or service-account name; compared exactly.
    pub name: String,
    /// Service-account namespace; empty means the binding's namespace (none for cluster bindings).
    #[serde(default)]
    pub namespace: String,
}

/// The request attributes a rule is matched against, borrowed from the request.
///
/// Kubelet requests are always resource requests on group `""`, resource `nodes`; the other shapes
/// exist so the matching stays the general Kubernetes algorithm and can be tested as such.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleRequest<'a> {
    /// Request verb; empty for methods that map to no verb.
    pub verb: &'a str,
    /// API group; `""` is the core group.
    pub api_group: &'a str,
    /// Resource, e.g. `nodes`.
    pub resource: &'a str,
    /// Subresource, e.g. `proxy`; empty when there is none.
    pub subresource: &'a str,
    /// Object name, e.g. the node name.
    pub name: &'a str,
    /// `true` for resource requests (matched by resource rules), `false` for non-resource ones.
    pub resource_request: bool,
    /// Request path; only non-resource requests are matched on it.
    pub path: &'a str,
}

/// Whether `rule` allows `req`, as Kubernetes' `RuleAllows`.
///
/// Resource requests need the verb, API group, resource (with subresource) and name to match;
/// non-resource requests need the verb and a `nonResourceURLs` entry. Everything is
/// case-sensitive, and a rule of one kind never matches a request of the other.
pub fn rule_allows(rule: &PolicyRule, req: &RuleRequest<'_>) -> bool {
    if !verb_matches(rule, req.verb) {
        return false;
    }
    if req.resource_request {
        api_group_matches(rule, req.api_group)
            && resource_matches(rule, req.resource, req.subresource)
            && resource_name_matches(rule, req.name)
    } else {
        non_resource_url_matches(rule, req.path)
    }
}

/// Some rule verb is `*` or equal to `verb`. An empty request verb therefore only matches `*`
/// (or a literal empty entry).
fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == ALL || v == verb)
}

/// Some rule group is `*` or equal to `group`; an empty list matches nothing.
fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups.iter().any(|g| g == ALL || g == group)
}

/// Some rule resource is `*`, equals `resource[/subresource]`, or — only when there is a
/// subresource — is exactly `*/<subresource>`. `nodes/*` and `*/*` are not wildcards.
fn resource_matches(rule: &PolicyRule, resource: &str, subresource: &str) -> bool {
    rule.resources.iter().any(|r| {
        r == ALL
            || equals_combined(r, resource, subresource)
            || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource))
    })
}

/// `rule_resource == resource` without a subresource, else `rule_resource == resource/subresource`,
/// compared piecewise so the request path does not allocate the combined string.
fn equals_combined(rule_resource: &str, resource: &str, subresource: &str) -> bool {
    if subresource.is_empty() {
        return rule_resource == resource;
    }
    rule_resource
        .strip_prefix(resource)
        .and_then(|rest| rest.strip_prefix('/'))
        == Some(subresource)
}

/// An empty `resourceNames` allows any name; otherwise `name` must be listed exactly.
fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    rule.resource_names.is_empty() || rule.resource_names.iter().any(|n| n == name)
}

/// Some entry is `*`, equals `path`, or ends in `*` and `path` starts with the entry stripped of
/// all its trailing `*`.
fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls.iter().any(|u| {
        u == ALL || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// Whether a binding `subject` applies to the user `user` with `groups`, as Kubernetes'
/// `appliesToUser`.
///
/// `binding_namespace` is the namespace of a RoleBinding and `""` for a ClusterRoleBinding: a
/// ServiceAccount subject without its own namespace takes the binding's, and with neither it never
/// matches. Unknown kinds never match; `apiGroup` is not consulted.
pub fn subject_applies(
    subject: &Subject,
    user: &str,
    groups: &[String],
    binding_namespace: &str,
) -> bool {
    match subject.kind.as_str() {
        USER_KIND => user == subject.name,
        GROUP_KIND => groups.contains(&subject.name),
        SERVICE_ACCOUNT_KIND => {
            let namespace = if subject.namespace.is_empty() {
                binding_namespace
            } else {
                &subject.namespace
            };
            !namespace.is_empty() && is_service_account(user, namespace, &subject.name)
        }
        _ => false,
    }
}

/// `user == system:serviceaccount:<namespace>:<name>`, without building the string.
fn is_service_account(user: &str, namespace: &str, name: &str) -> bool {
    user.strip_prefix(SERVICE_ACCOUNT_USERNAME_PREFIX)
        .and_then(|rest| rest.strip_prefix(namespace))
        .and_then(|rest| rest.strip_prefix(':'))
        == Some(name)
}

/// The user name a service account authenticates as: `system:serviceaccount:<namespace>:<name>`.
/// The `Policy` authorizer indexes ServiceAccount subjects under it.
pub(crate) fn service_account_username(namespace: &str, name: &str) -> String {
    format!("{SERVICE_ACCOUNT_USERNAME_PREFIX}{namespace}:{name}")
}

#[cfg(test)]
mod tests;
