//! What the watch keeps of each object: only what a decision can use. A role keeps the rules that
//! can grant an attribute set the proxy asks about (`nodes/<subresource>`, and `pods/<subresource>`
//! with `--pod-scoped-authz`) and, for aggregation, its labels and selectors; a role left with
//! nothing is not kept at all, and a binding naming it then grants nothing, exactly as before.
//! Everything else (annotations, managed fields, rules about other resources) is dropped as the
//! object arrives.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1 as rbac;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;

use crate::authz::policy::{LabelSelector, RoleKind, WatchedBinding, WatchedRole};
use crate::authz::rbac::{PolicyRule, Subject};
use crate::authz::{POD_RESOURCE, RESOURCE};

/// The wildcard of verbs, API groups and resources.
const ALL: &str = "*";

/// Which resources the proxy asks about, so which rules are worth keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// `--pod-scoped-authz`: `pods/<subresource>` too.
    pub pods: bool,
}

impl Scope {
    /// Whether `rule` can allow some attribute set the proxy asks about: a resource rule with a
    /// verb, the core group and a resource naming `nodes/…` (or `pods/…`), `*/…` or `*`. The
    /// kubelet's sets always name a subresource, so `nodes` alone never matches one.
    pub fn can_grant(self, rule: &PolicyRule) -> bool {
        !rule.verbs.is_empty()
            && rule.api_groups.iter().any(|g| g.is_empty() || g == ALL)
            && rule.resources.iter().any(|r| {
                r == ALL
                    || r.starts_with("*/")
                    || subresource_of(r, RESOURCE)
                    || (self.pods && subresource_of(r, POD_RESOURCE))
            })
    }

    /// What the watch keeps of a ClusterRole, `None` when nothing.
    pub fn cluster_role(self, role: rbac::ClusterRole) -> Option<WatchedRole> {
        let written = role.rules.as_ref().is_some_and(|rules| !rules.is_empty());
        let rules = self.rules(role.rules);
        let aggregation = role
            .aggregation_rule
            .and_then(|a| a.cluster_role_selectors)
            .map(|selectors| selectors.into_iter().map(selector).collect::<Vec<_>>());
        // An aggregated role written without rules is filled in from the roles it selects; one
        // that carries rules (the controller wrote them) is used as it is, as RBAC reads it.
        let aggregated = aggregation.is_some() && !written;
        if rules.is_empty() && !aggregated {
            return None;
        }
        Some(WatchedRole {
            labels: role.metadata.labels.unwrap_or_default(),
            rules,
            aggregation: aggregation.filter(|_| aggregated),
        })
    }

    /// What the watch keeps of a Role, `None` when nothing. Aggregation never selects Roles, so
    /// their labels are not kept.
    pub fn role(self, role: rbac::Role) -> Option<WatchedRole> {
        let rules = self.rules(role.rules);
        (!rules.is_empty()).then(|| WatchedRole {
            labels: BTreeMap::new(),
            rules,
            aggregation: None,
        })
    }

    /// The rules that can grant, converted.
    fn rules(self, rules: Option<Vec<rbac::PolicyRule>>) -> Vec<PolicyRule> {
        rules
            .unwrap_or_default()
            .into_iter()
            .map(|rule| PolicyRule {
                verbs: rule.verbs,
                api_groups: rule.api_groups.unwrap_or_default(),
                resources: rule.resources.unwrap_or_default(),
                resource_names: rule.resource_names.unwrap_or_default(),
                non_resource_urls: Vec::new(),
            })
            .filter(|rule| self.can_grant(rule))
            .collect()
    }
}

/// `resource/<something>`.
fn subresource_of(rule_resource: &str, resource: &str) -> bool {
    rule_resource
        .strip_prefix(resource)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// What the watch keeps of a ClusterRoleBinding or RoleBinding: its roleRef and subjects. A
/// roleRef of another kind or group (the API server refuses those) grants nothing: `None`.
pub fn binding(
    role_ref: rbac::RoleRef,
    subjects: Option<Vec<rbac::Subject>>,
) -> Option<WatchedBinding> {
    let role_kind = match (role_ref.api_group.as_deref(), role_ref.kind.as_str()) {
        (Some("rbac.authorization.k8s.io"), "ClusterRole") => RoleKind::ClusterRole,
        (Some("rbac.authorization.k8s.io"), "Role") => RoleKind::Role,
        _ => return None,
    };
    Some(WatchedBinding {
        role_kind,
        role_name: role_ref.name,
        subjects: subjects
            .unwrap_or_default()
            .into_iter()
            .map(|s| Subject {
                kind: s.kind,
                api_group: s.api_group.unwrap_or_default(),
                name: s.name,
                namespace: s.namespace.unwrap_or_default(),
            })
            .collect(),
    })
}

/// A `metav1.LabelSelector` as aggregation matches it.
fn selector(selector: ApiLabelSelector) -> LabelSelector {
    LabelSelector::new(
        selector.match_labels.unwrap_or_default(),
        selector
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.key, r.operator, r.values.unwrap_or_default())),
    )
}

#[cfg(test)]
mod tests;
