//! Lint for local policies: rule entries no kubelet request can ever match under the attribute
//! table in force, named with file, line, role and rule index. Shown by `explain`, and warned
//! about at start-up and by `check-config`.

use std::fmt;

use serde::Serialize;

use super::{PolicyAuthorizer, PolicyRole};
use crate::authz::attributes::{AttributeMapping, kubelet_verbs};
use crate::authz::rbac::PolicyRule;

/// The RBAC wildcard.
const ALL: &str = "*";

/// A policy rule part that no kubelet request can match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyWarning {
    /// The policy file.
    pub file: String,
    /// The line where the ClusterRole starts.
    pub line: u64,
    /// The ClusterRole's name.
    pub role: String,
    /// The rule's index in `rules`.
    pub rule: usize,
    /// The rule field at fault: `verbs`, `apiGroups`, `resources`, `resourceNames` or
    /// `nonResourceURLs`.
    pub field: &'static str,
    /// What can never match, and why.
    pub message: String,
    /// Whether the whole rule can never match (otherwise only this entry is dead).
    pub rule_never_matches: bool,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: ClusterRole {:?} rules[{}]: {}{}",
            self.file,
            self.line,
            self.role,
            self.rule,
            self.message,
            if self.rule_never_matches {
                "; this rule can never match a kubelet request"
            } else {
                ""
            }
        )
    }
}

/// Warnings for every rule of every local policy in `policies` that can never match a kubelet
/// request on `node_name` under `mapping`. `explain`, `check-config` and the server's start-up
/// all report them.
pub fn policy_warnings<'a>(
    policies: impl IntoIterator<Item = &'a PolicyAuthorizer>,
    mapping: &AttributeMapping,
    node_name: &str,
) -> Vec<PolicyWarning> {
    let mut warnings = Vec::new();
    for policy in policies {
        for role in policy.roles() {
            warnings.extend(role_warnings(&role, mapping, node_name));
        }
    }
    warnings
}

/// What the kubelet ever asks about, from the attribute table in force.
struct Asked {
    verbs: [&'static str; 5],
    subresources: Vec<&'static str>,
}

/// Warnings for the rules of one ClusterRole: entries of a rule that no kubelet request can
/// match under `mapping`, each marked with whether the rule as a whole is dead.
pub fn role_warnings(
    role: &PolicyRole<'_>,
    mapping: &AttributeMapping,
    node_name: &str,
) -> Vec<PolicyWarning> {
    let asked = Asked {
        verbs: kubelet_verbs(),
        subresources: mapping.subresources(),
    };
    let mut warnings = Vec::new();
    for (index, rule) in role.rules.iter().enumerate() {
        let (found, dead) = rule_warnings(rule, &asked, node_name);
        warnings.extend(found.into_iter().map(|(field, message)| PolicyWarning {
            file: role.source_name.to_owned(),
            line: role.line,
            role: role.name.to_owned(),
            rule: index,
            field,
            message,
            rule_never_matches: dead,
        }));
    }
    warnings
}

/// The dead entries of one rule as `(field, message)`, and whether the whole rule is dead.
fn rule_warnings(
    rule: &PolicyRule,
    asked: &Asked,
    node_name: &str,
) -> (Vec<(&'static str, String)>, bool) {
    if !rule.non_resource_urls.is_empty() {
        let message = format!(
            "nonResourceURLs {:?} never match: the kubelet only makes resource requests \
             (nodes/<subresource>)",
            rule.non_resource_urls
        );
        return (vec![("nonResourceURLs", message)], true);
    }
    let mut found = Vec::new();
    let mut dead = false;

    let verb_live = |v: &String| v == ALL || v.is_empty() || asked.verbs.contains(&v.as_str());
    for verb in rule.verbs.iter().filter(|v| !verb_live(v)) {
        found.push((
            "verbs",
            format!(
                "verb {verb:?} is never asked: the kubelet asks only {} (and \"\" for other \
                 methods)",
                asked.verbs.join(", ")
            ),
        ));
    }
    dead |= !rule.verbs.iter().any(verb_live);

    let group_live = |g: &String| g.is_empty() || g == ALL;
    for group in rule.api_groups.iter().filter(|g| !group_live(g)) {
        found.push((
            "apiGroups",
            format!(
                "apiGroup {group:?} never matches: kubelet requests are in the core group \"\""
            ),
        ));
    }
    dead |= !rule.api_groups.iter().any(group_live);

    let mut any_resource_live = false;
    for resource in &rule.resources {
        match resource_problem(resource, &asked.subresources) {
            Some(message) => found.push(("resources", message)),
            None => any_resource_live = true,
        }
    }
    dead |= !any_resource_live;

    if !rule.resource_names.is_empty() && !rule.resource_names.iter().any(|n| n == node_name) {
        found.push((
            "resourceNames",
            format!(
                "resourceNames {:?} do not include this node's name {node_name:?}",
                rule.resource_names
            ),
        ));
        dead = true;
    }
    (found, dead)
}

/// Why a `resources` entry never matches a kubelet request, or `None` when it can.
fn resource_problem(resource: &str, subresources: &[&str]) -> Option<String> {
    if resource == ALL {
        return None;
    }
    let subresource = match resource.split_once('/') {
        Some(("nodes" | ALL, sub)) => sub,
        _ if resource == "nodes" => {
            return Some(
                "resource \"nodes\" matches only requests without a subresource, and every \
                 kubelet request has one: name it, e.g. \"nodes/proxy\""
                    .to_owned(),
            );
        }
        _ => {
            return Some(format!(
                "resource {resource:?} never matches: the kubelet asks only about \
                 nodes/<subresource>"
            ));
        }
    };
    if subresources.contains(&subresource) {
        return None;
    }
    if subresource == ALL {
        return Some(format!(
            "{resource:?} is not a wildcard in RBAC (only \"*\" and \"*/<subresource>\" are)"
        ));
    }
    Some(format!(
        "subresource {subresource:?} is never asked: the kubelet asks only about {}",
        subresources.join(", ")
    ))
}
